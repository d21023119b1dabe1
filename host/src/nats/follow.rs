//! Mirrors fed by watches: a bucket mirrored on first use, replayed into a copy built aside and
//! swapped in when in sync, resynced on reconnect, rebuilt when the audit asks, dropped when its
//! bucket is gone and unread; each change offered to the plans' and states' `Changes` and, live,
//! to the notices' `Events`.

use super::*;

impl NatsBackend {
    pub(super) async fn mirror_of(&self, bucket: &str) -> Result<Arc<Mirror>> {
        let existing = self.mirrors.locked().get(bucket).cloned();
        let mirror = match existing {
            Some(m) => m,
            None => {
                check_bucket(bucket)?;
                // Fails fast when the bus cannot be asked, rather than wait for a sync. A
                // missing bucket's answer holds while the listing it came from is in use: the
                // listing is read once, under its lock (asking for it before and after, as
                // this did, found no listing whenever another read held the lock, and a reply
                // over a missing bucket was then never kept: 32 requesters each called the
                // guest for it — the holders anomaly of the bus bench's 10k phase).
                let (exists, holds) = self.bucket_exists(bucket).await?;
                if !exists {
                    return Ok(Arc::new(Mirror::missing_once(Some(holds))));
                }
                let mut map = self.mirrors.locked();
                match map.get(bucket) {
                    Some(m) => m.clone(),
                    None if map.len() >= MAX_MIRRORS => {
                        return Err(Error::new(ErrorKind::Invalid, format!("{MAX_MIRRORS} buckets are mirrored already; not {bucket}")));
                    }
                    None => {
                        // The node clients' buckets: each node writes `<node>.>`, so a key's
                        // first token is its writer, counted against the quota.
                        let m = Arc::new(if CLIENT_BUCKETS.contains(&bucket) { Mirror::counting_writers() } else { Mirror::new() });
                        map.insert(bucket.to_string(), m.clone());
                        let follower = BucketFollower {
                            budget: self.options.mirror_budget,
                            js: self.js.clone(),
                            bucket: bucket.to_string(),
                            mirror: m.clone(),
                            changes: self.changes.clone(),
                            state_changes: self.state_changes.clone(),
                            events: self.events.clone(),
                            mirrors: self.mirrors.clone(),
                            snapshots: self.snapshots.get().cloned(),
                            resumable: std::sync::atomic::AtomicBool::new(true),
                        };
                        tokio::spawn(follower.run(self.resync.subscribe()));
                        m
                    }
                }
            }
        };
        mirror.touch();
        let start = Instant::now();
        while !mirror.is_ready() {
            if start.elapsed() > SYNC_TIMEOUT {
                return Err(Error::new(ErrorKind::Unavailable, format!("the mirror of {bucket} is not in sync")));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let Some(why) = mirror.refused() {
            return Err(Error::new(ErrorKind::Denied, why));
        }
        Ok(mirror)
    }

    /// Waits (briefly) until the mirror of `bucket` shows `revision`, so a reconcile (or the
    /// next state decision) right after a write reads its own write.
    pub(super) async fn settle(&self, bucket: &str, revision: u64) {
        if let Ok(m) = self.mirror_of(bucket).await {
            super::reach::caught_up(&m, revision, Instant::now() + Duration::from_secs(2), Duration::from_millis(1)).await;
        }
    }
}

/// How one follow of a bucket ended.
enum FollowEnd {
    /// The watch ended or failed: replay from scratch.
    Lost(Result<()>),
    /// The bucket does not exist (any more): the mirror is empty and in sync.
    Missing,
    /// The bucket is not read (see [`Mirror::set_refused`]), for this reason.
    Refused(String),
}

/// A bucket's stream opened for a follow: the copy being built, where the stream is, the
/// snapshot's revision it resumes after (if any), its watch and its state at the opening.
struct Opened {
    staged: Arc<Mirror>,
    stream: crate::store::snapshot::StreamPosition,
    resumed: Option<u64>,
    watch: super::watch::Watch,
    state: async_nats::jetstream::stream::State,
}

/// Keeps one mirror equal to its bucket.
struct BucketFollower {
    /// The bytes all mirrors may hold (0: no budget).
    budget: usize,
    js: jetstream::Context,
    bucket: String,
    mirror: Arc<Mirror>,
    changes: Arc<Changes>,
    state_changes: Arc<Changes>,
    events: Arc<crate::nats::events::Events>,
    /// The mirrors, to drop this one from when its bucket is gone and nobody reads it.
    mirrors: Arc<std::sync::Mutex<HashMap<String, Arc<Mirror>>>>,
    /// Where the mirrors' snapshots are kept, if anywhere.
    snapshots: Option<crate::store::snapshot::Snapshots>,
    /// The next replay may resume from the snapshot: only the first (later ones follow a lost
    /// watch, a rebuild the audit asked for, or a snapshot found wrong: in full).
    resumable: std::sync::atomic::AtomicBool,
}

impl BucketFollower {
    /// Offers a change (`None`: the whole bucket) to the plans and the states that follow it.
    fn record(&self, key: Option<&str>) {
        self.changes.record(&self.bucket, key);
        self.state_changes.record(&self.bucket, key);
    }

    /// Follows the bucket, resyncing from scratch whenever the watch ends, and looking again
    /// every [`MISSING_POLL`] for a bucket that does not exist.
    async fn run(self, mut resync: tokio::sync::watch::Receiver<u64>) {
        let mut backoff = Duration::from_millis(50);
        // Whether the mirror already shows the bucket as missing (empty and in sync).
        let mut was_missing = false;
        loop {
            resync.borrow_and_update();
            let outcome = tokio::select! {
                r = self.once() => r,
                _ = resync.changed() => {
                    tracing::info!(bucket = self.bucket, "resyncing the mirror");
                    self.mirror.set_ready(false);
                    backoff = Duration::from_millis(50);
                    was_missing = false;
                    continue;
                }
                // An audit found the mirror diverged: rebuild it aside, answering from it
                // meanwhile.
                _ = self.mirror.rebuild_requested() => {
                    tracing::info!(bucket = self.bucket, "rebuilding the mirror from the bucket");
                    backoff = Duration::from_millis(50);
                    was_missing = false;
                    continue;
                }
            };
            match outcome {
                FollowEnd::Refused(why) => {
                    if self.mirror.set_refused(Some(why.clone())) {
                        tracing::error!(bucket = self.bucket, "bucket refused: {why}");
                        self.record(None);
                    }
                    self.mirror.set_ready(true);
                    was_missing = false;
                    tokio::select! {
                        _ = tokio::time::sleep(REFUSED_POLL) => {},
                        _ = resync.changed() => {},
                        _ = self.mirror.rebuild_requested() => {},
                    }
                    continue;
                }
                FollowEnd::Missing => {
                    if !was_missing {
                        self.mirror.set_refused(None);
                        self.mirror.clear();
                        self.mirror.set_missing(true);
                        self.mirror.set_ready(true);
                        self.record(None);
                        tracing::debug!(bucket = self.bucket, "bucket does not exist yet: mirrored as empty");
                    }
                    was_missing = true;
                    if self.mirror.unread_for() > MISSING_EVICT {
                        let mut map = self.mirrors.locked();
                        if map.get(&self.bucket).is_some_and(|m| Arc::ptr_eq(m, &self.mirror)) {
                            map.remove(&self.bucket);
                            self.mirror.retire();
                        }
                        tracing::info!(bucket = self.bucket, "the bucket is gone and nobody reads it: mirror dropped");
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(MISSING_POLL) => {},
                        _ = resync.changed() => {},
                        _ = self.mirror.rebuild_requested() => {},
                    }
                    continue;
                }
                FollowEnd::Lost(Ok(())) => tracing::warn!(bucket = self.bucket, "watch ended; resyncing the mirror"),
                FollowEnd::Lost(Err(e)) => tracing::warn!(bucket = self.bucket, "mirror lost: {e}; resyncing"),
            }
            was_missing = false;
            self.mirror.set_ready(false);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Replays the bucket into a copy built aside and, once that copy is in sync, makes it the
    /// mirror in one step (readers see the old contents until then, never a half-built
    /// mirror); then follows the bucket live until the watch ends.
    async fn once(&self) -> FollowEnd {
        let opened = match self.open().await {
            Ok(o) => o,
            Err(end) => return end,
        };
        let Opened { staged, stream, resumed, mut watch, state } = opened;
        let (bucket, mirror) = (self.bucket.as_str(), &self.mirror);
        let mut live = false;
        let started = Instant::now();
        // A full replay is logged as it comes and packed once at its end (see `Log`); one
        // resumed from a snapshot updates the keys loaded, in place.
        let mut log = resumed.is_none().then(crate::store::mirror::Log::default);
        let nothing_to_replay = match resumed {
            Some(after) => state.messages == 0 || state.last_sequence <= after,
            None => state.messages == 0,
        };
        if nothing_to_replay {
            if let Err(e) = self.check_resumed(resumed, &staged).await {
                return FollowEnd::Lost(Err(e));
            }
            mirror.adopt(&staged);
            live = true;
            self.record(None);
        }
        // A replay that stalls (the messages it was to deliver expired meanwhile) is started
        // again rather than waited for: one timer, looked at when it rings (one made for each
        // message read the clock each time, a cost seen in a replay's profile).
        let stall = tokio::time::sleep(REPLAY_STALL);
        tokio::pin!(stall);
        let mut moved = false;
        loop {
            let next = if live {
                watch.next().await
            } else {
                tokio::select! {
                    biased;
                    next = watch.next() => {
                        moved = true;
                        next
                    }
                    _ = &mut stall => {
                        if !std::mem::take(&mut moved) {
                            return FollowEnd::Lost(Err(Error::new(ErrorKind::Timeout, format!("the replay of {bucket} stalled for {REPLAY_STALL:?}"))));
                        }
                        stall.as_mut().reset(tokio::time::Instant::now() + REPLAY_STALL);
                        continue;
                    }
                }
            };
            let Some(entry) = next else { break };
            let entry = match entry {
                Ok(e) => e,
                Err(e) => return FollowEnd::Lost(Err(Error::new(ErrorKind::Unavailable, format!("watching {bucket}: {e}")))),
            };
            if let Some(end) = self.take(&entry, live, &staged, log.as_mut()) {
                return end;
            }
            if !live && entry.delta == 0 {
                // The replay's last message: packed, checked, adopted; from now on, live.
                let replayed = started.elapsed();
                if let Err(e) = self.pack(log.take(), &staged, stream.created_ns).await {
                    return FollowEnd::Lost(Err(e));
                }
                if let Err(e) = self.check_resumed(resumed, &staged).await {
                    return FollowEnd::Lost(Err(e));
                }
                mirror.adopt(&staged);
                live = true;
                self.record(None);
                // How long a start's replay took, and its packing, for the operator to see.
                tracing::info!(bucket, keys = mirror.len(), ?replayed, packed = ?started.elapsed().saturating_sub(replayed), resumed, "mirror in sync");
            }
        }
        FollowEnd::Lost(Ok(()))
    }

    /// The bucket's stream looked at (refused when it is no bucket), a copy to build aside
    /// (resumed from the snapshot when one may be), its watch opened and its state read.
    async fn open(&self) -> Result<Opened, FollowEnd> {
        let (bucket, mirror) = (self.bucket.as_str(), &self.mirror);
        let info = match stream_info(&self.js, bucket).await {
            Ok(Some(info)) => match crate::nats::bucket::shape(bucket, &info.config) {
                Shape::Refused(why) => return Err(FollowEnd::Refused(why)),
                Shape::Bucket { unsafe_settings } => {
                    crate::nats::bucket::note_unsafe(bucket, mirror, unsafe_settings);
                    crate::nats::bucket::note_sources(mirror, &info.config);
                    info
                }
            },
            Ok(None) => return Err(FollowEnd::Missing),
            Err(e) => return Err(FollowEnd::Lost(Err(e))),
        };
        let staged = Arc::new(mirror.like());
        let stream = crate::store::snapshot::StreamPosition { created_ns: info.created.unix_timestamp_nanos(), last_sequence: info.state.last_sequence };
        let resumed = match (&self.snapshots, self.resumable.swap(false, std::sync::atomic::Ordering::AcqRel)) {
            (Some(snapshots), true) => self.resume(snapshots, &staged, stream).await,
            _ => None,
        };
        staged.set_origin(stream.created_ns);
        if resumed.is_some() {
            if let Some(refused) = self.over_budget(&staged, 0) {
                return Err(refused);
            }
        }
        let opened = bounded(|| format!("watching {bucket}"), async {
            let kv = self.js.get_key_value(bucket).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("opening {bucket}: {e}")))?;
            // The watch first, then the state: a bucket emptied between the two reads as
            // empty (ready at once), where the other order would wait for a replay of
            // nothing. The state is read fresh: a store's status is as of its opening.
            // After a snapshot: every message since it, deletes included, in order.
            let watch = super::watch::Watch::open(&self.js, &kv, resumed, info.config.max_messages_per_subject).await?;
            let state = crate::nats::bucket::stream_state(&self.js, bucket)
                .await?
                .ok_or_else(|| Error::new(ErrorKind::Unavailable, format!("bucket {bucket} was deleted while its watch started")))?;
            Ok::<_, Error>((state, watch))
        });
        let (state, watch) = opened.await.map_err(|e| FollowEnd::Lost(Err(e)))?;
        if resumed.is_some() {
            // What the stream no longer holds (expired, purged since the snapshot) is gone. A
            // walk of millions of keys, when it must walk: off the runtime thread.
            let (copy, first) = (staged.clone(), state.first_sequence);
            let forgotten = tokio::task::spawn_blocking(move || copy.forget_below(first))
                .await
                .map_err(|e| FollowEnd::Lost(Err(Error::new(ErrorKind::Unavailable, format!("forgetting what {bucket} no longer holds: {e}")))))?;
            if forgotten > 0 {
                tracing::info!(bucket, forgotten, first = state.first_sequence, "keys of the snapshot the stream no longer holds forgotten");
            }
        }
        // The stream's last revision, even when its newest messages are gone (expired,
        // purged): the mirror is then as far as the stream, not behind it.
        staged.note_revision(state.last_sequence);
        Ok(Opened { staged, stream, resumed, watch, state })
    }

    /// One message of the watch: logged (a full replay), put in the copy (a resumed one) or in
    /// the mirror itself (live: then plans may move and holders are told). An end when the
    /// message cannot be held.
    fn take(&self, entry: &super::watch::Watched, live: bool, staged: &Mirror, log: Option<&mut crate::store::mirror::Log>) -> Option<FollowEnd> {
        let bucket = self.bucket.as_str();
        let target = if live { self.mirror.as_ref() } else { staged };
        target.set_lag(entry.delta);
        let (key, deleted) = (entry.key(), entry.deleted);
        match log.filter(|_| !live) {
            Some(log) => {
                let logged = if deleted { log.delete(key, entry.revision) } else { log.put(key, entry.revision, &entry.value) };
                if !logged {
                    let why = format!("{bucket}: a message of {} bytes at {key:?}, past what a mirror holds", entry.value.len());
                    return Some(FollowEnd::Lost(Err(Error::new(ErrorKind::Invalid, why))));
                }
                if let Some(refused) = self.over_budget(staged, log.bytes()) {
                    return Some(refused);
                }
            }
            None if deleted => target.delete(key, entry.revision),
            None => {
                target.put(key, entry.revision, &entry.value);
                if let Some(refused) = self.over_budget(staged, 0) {
                    return Some(refused);
                }
            }
        }
        if live {
            // Live, not replayed: plans may move, and holders are told.
            self.record(Some(key));
            self.events.record(bucket, key, entry.revision, deleted);
        }
        None
    }

    /// A full replay's log packed into the copy, off the runtime thread (a resumed replay has
    /// none: its copy is already filled).
    async fn pack(&self, log: Option<crate::store::mirror::Log>, staged: &Arc<Mirror>, origin: i128) -> Result<()> {
        let Some(log) = log else { return Ok(()) };
        let into = staged.clone();
        let packed = tokio::task::spawn_blocking(move || {
            let built = log.build();
            let restored = into.restore_counted(built.entries, Some(built.runs), built.markers, built.revision, origin);
            // The log, a copy of every key and value, is freed by now.
            crate::store::mirror::give_back_freed_memory();
            restored
        })
        .await;
        packed.map_err(|e| Error::new(ErrorKind::Unavailable, format!("packing {}'s replay: {e}", self.bucket))).and_then(|r| r)
    }

    /// When the mirrors hold more than their budget: the copy being built is dropped rather
    /// than grown until the process is killed, and the bucket refused (said in /readyz, status
    /// and the metrics) until there is room again.
    fn over_budget(&self, staged: &Mirror, logged: usize) -> Option<FollowEnd> {
        if self.budget == 0 || crate::store::mirror::total_bytes() + logged <= self.budget {
            return None;
        }
        staged.clear();
        Some(FollowEnd::Refused(format!("the mirrors' memory budget of {} bytes is spent: {} is not mirrored until there is room", self.budget, self.bucket)))
    }

    /// Loads the bucket's snapshot into `staged` (off the runtime thread): the revision to
    /// resume after, or `None` to replay in full (no snapshot, or one that does not fit).
    async fn resume(&self, snapshots: &crate::store::snapshot::Snapshots, staged: &Arc<Mirror>, stream: crate::store::snapshot::StreamPosition) -> Option<u64> {
        let (snapshots, bucket, into) = (snapshots.clone(), self.bucket.clone(), staged.clone());
        let started = Instant::now();
        match tokio::task::spawn_blocking(move || snapshots.load(&bucket, stream, &into)).await {
            Ok(Ok(Some(loaded))) => {
                let crate::store::snapshot::Took { read, hashed, parsed, elapsed: file } = loaded.took;
                tracing::info!(bucket = self.bucket, revision = loaded.revision, keys = loaded.entries, elapsed = ?started.elapsed(), ?file, ?read, ?hashed, ?parsed, built = ?loaded.built, "mirror loaded from its snapshot; resuming its watch after it");
                Some(loaded.revision)
            }
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                tracing::warn!(bucket = self.bucket, "{e}; replaying the bucket in full");
                None
            }
            Err(e) => {
                tracing::warn!(bucket = self.bucket, "loading the snapshot failed: {e}; replaying the bucket in full");
                None
            }
        }
    }

    /// Before a copy resumed from a snapshot is answered from: when the stream is still where
    /// the copy is, both hold a message on the same number of subjects. A stream changed in a
    /// way no watch says (a purge of some subjects, a message deleted by sequence) is found
    /// here and the bucket replayed in full; one that moved on meanwhile is left to the audit.
    async fn check_resumed(&self, resumed: Option<u64>, staged: &Mirror) -> Result<()> {
        if resumed.is_none() {
            return Ok(());
        }
        let census = staged.census();
        match crate::nats::bucket::stream_state(&self.js, &self.bucket).await? {
            Some(s) if s.last_sequence == census.revision && s.subjects_count != census.subjects => {
                let why = format!(
                    "the snapshot of {} does not fit its stream: at revision {} the stream holds {} subjects and the resumed copy {}; replaying in full",
                    self.bucket, census.revision, s.subjects_count, census.subjects
                );
                tracing::warn!(bucket = self.bucket, "{why}");
                Err(Error::new(ErrorKind::Corrupt, why))
            }
            _ => Ok(()),
        }
    }
}
