//! Which buckets exist: one listing of the bus's streams at a time, shared by every read
//! waiting, made stale by the server's stream-created advisories; and the streams that capture
//! the provisioner's own subjects.

use super::*;

impl NatsBackend {
    /// Records the streams last found capturing the provisioner's subjects; whether that
    /// changed.
    pub fn set_captures(&self, found: Vec<(String, String)>) -> bool {
        let mut c = self.captured.locked();
        let changed = *c != found;
        *c = found;
        changed
    }

    /// The streams that capture a subject the provisioner answers or publishes on (its verbs,
    /// its notices and events, the micro-service subjects): a requester's answer would be
    /// the stream's publish acknowledgement, a notice would be stored. Each with the subject it
    /// captures.
    pub async fn captures(&self) -> Result<Vec<(String, String)>> {
        #[derive(serde::Deserialize)]
        struct Names {
            streams: Option<Vec<String>>,
        }
        let mut found = Vec::new();
        for subject in CAPTURED_NEVER {
            let names: jetstream::response::Response<Names> = bounded(|| format!("listing streams that capture {subject}"), async {
                self.js
                    .request("STREAM.NAMES", &serde_json::json!({ "subject": subject }))
                    .await
                    .map_err(|e| Error::new(ErrorKind::Unavailable, format!("listing streams that capture {subject}: {e}")))
            })
            .await?;
            match names {
                jetstream::response::Response::Ok(n) => found.extend(n.streams.unwrap_or_default().into_iter().map(|s| (s, subject.to_string()))),
                jetstream::response::Response::Err { error } => {
                    return Err(Error::new(ErrorKind::Unavailable, format!("listing streams that capture {subject}: {error}")))
                }
            }
        }
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
        Ok(found)
    }

    /// Follows the server's stream-created advisories, so that a listing of the buckets is
    /// known stale the moment a bucket is made.
    pub async fn follow_creations(self: &Arc<Self>) {
        match self.client.subscribe(STREAM_CREATED).await {
            Ok(mut sub) => {
                let created = self.created.clone();
                tokio::spawn(async move {
                    while sub.next().await.is_some() {
                        created.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                });
            }
            Err(e) => tracing::warn!("not following stream creations ({e}): new buckets are seen within {NAMES_FOR:?}"),
        }
    }

    /// The bus's buckets, by a listing of its streams made since the last creation announced
    /// and at most [`NAMES_FOR`] ago (one listing at a time; those waiting share it). Every
    /// question of which buckets exist — a read of one not yet mirrored, the notice and plan
    /// inputs' patterns — is answered from this one listing.
    async fn listing(&self) -> Result<tokio::sync::MutexGuard<'_, Listing>> {
        let mut names = self.names.lock().await;
        // Read after the lock: a creation announced while waiting for it makes a new listing.
        let generation = self.created.load(std::sync::atomic::Ordering::Acquire);
        if matches!(names.0, Some((at, g)) if g == generation && at.elapsed() < NAMES_FOR) {
            return Ok(names);
        }
        let listed_at = Instant::now();
        let listed = bounded(|| "listing the buckets".to_string(), async {
            let mut listed = std::collections::HashSet::new();
            let mut streams = self.js.stream_names();
            while let Some(name) = streams.next().await {
                let name = name.map_err(|e| Error::new(ErrorKind::Unavailable, format!("listing the buckets: {e}")))?;
                if let Some(b) = name.strip_prefix("KV_") {
                    listed.insert(b.to_string());
                }
            }
            Ok(listed)
        })
        .await?;
        *names = (Some((listed_at, generation)), listed);
        Ok(names)
    }

    /// Whether `bucket` is on the bus now (see [`NatsBackend::listing`]), and how long that
    /// answer holds: while the listing it came from is the one in use — until it expires or a
    /// creation is announced.
    pub(super) async fn bucket_exists(&self, bucket: &str) -> Result<(bool, Holds)> {
        let names = self.listing().await?;
        let (at, generation) = names.0.ok_or_else(|| Error::new(ErrorKind::Unavailable, "no listing of the buckets"))?;
        Ok((names.1.contains(bucket), Holds::until(at + NAMES_FOR).while_at(self.created.clone(), generation)))
    }

    /// The buckets on the bus that `patterns` name (a name, or one `*` in a name), at most
    /// [`MAX_MIRRORS`] of them.
    pub async fn buckets_matching(&self, patterns: &[String]) -> Result<Vec<String>> {
        let names = self.listing().await?;
        let mut out: Vec<String> = names.1.iter().filter(|b| patterns.iter().any(|p| crate::nats::changes::bucket_matches(p, b))).cloned().collect();
        out.sort();
        out.truncate(MAX_MIRRORS);
        Ok(out)
    }
}
