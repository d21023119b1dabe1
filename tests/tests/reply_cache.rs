//! The reply cache (issue 14), on the real component over in-memory buckets: a kept reply is
//! served only while every bucket it read is unchanged — never after a put, a delete, a bucket
//! removed, a mirror rebuilt (a silent expiry) or resynced — checked against the guest itself
//! after every step of a seeded random history.

use std::sync::Arc;

use mesh_provisioner::backend::{Backend, MemoryBackend};
use mesh_provisioner::mirror::Mirror;
use mesh_provisioner::runtime::Limits;

const BUCKETS: [&str; 4] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect", "mesh-provisioner_registry"];

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn key(rng: &mut Rng, bucket: &str) -> String {
    let node = ["alpha", "beta"][rng.below(2) as usize];
    let module = ["app", "web"][rng.below(2) as usize];
    match bucket {
        "mesh-provisioner_needs" => format!("{node}.{module}.config.k{}", rng.below(3)),
        "mesh-provisioner_applied" => format!("{node}.{module}"),
        "mesh-provisioner_collect" => format!("{node}.shell:zsh:normal.{module}"),
        _ => ["config", "secret", "dir"][rng.below(3) as usize].to_string(),
    }
}

/// The requests asked: few enough that they repeat (and hit), narrowed and not.
fn request(rng: &mut Rng) -> Vec<u8> {
    let asks = [
        r#"{"what":"needs"}"#,
        r#"{"what":"needs","node":"alpha"}"#,
        r#"{"what":"needs","node":"beta","module":"web"}"#,
        r#"{"what":"needs","module":"app"}"#,
        r#"{"what":"needs","kind":"config","limit":2}"#,
        r#"{"what":"applied"}"#,
        r#"{"what":"collect","node":"alpha"}"#,
        r#"{"what":"registry"}"#,
        r#"{"what":"nonsense"}"#,
    ];
    asks[rng.below(asks.len() as u64) as usize].as_bytes().to_vec()
}

#[tokio::test]
async fn a_kept_reply_is_never_served_after_a_bucket_it_read_changed() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    let backend = b.clone() as Arc<dyn Backend>;
    let mut rng = Rng(1414);
    let mut asked = 0;
    for step in 0..4000 {
        match rng.below(10) {
            0..=2 => {
                let bucket = BUCKETS[rng.below(4) as usize];
                let k = key(&mut rng, bucket);
                b.put(bucket, &k, format!("{{\"step\":{step}}}").as_bytes());
            }
            3 => {
                let bucket = BUCKETS[rng.below(4) as usize];
                let k = key(&mut rng, bucket);
                b.delete(bucket, &k);
            }
            4 => {
                // A rebuild that drops a key without a message (an expiry the audit found):
                // the same revision, one key fewer.
                let bucket = BUCKETS[rng.below(3) as usize];
                let m = b.bucket(bucket);
                let staged = Mirror::new();
                let page = m.scan(">", None, 10_000).expect("scan");
                for e in page.entries.iter().skip(1) {
                    staged.put(&e.key, e.revision, &e.value);
                }
                staged.note_revision(m.revision());
                m.adopt(&staged);
            }
            5 if rng.below(20) == 0 => b.remove_bucket(BUCKETS[rng.below(3) as usize]),
            _ => {
                let body = request(&mut rng);
                let served = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", &body, 1 << 20).await.expect("answers");
                let (fresh, _) = guest.handle_uncached(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", &body, 1 << 20).await.expect("answers");
                assert_eq!(
                    String::from_utf8_lossy(&served.body),
                    String::from_utf8_lossy(&fresh.body),
                    "step {step}: {} served a kept reply that the guest no longer gives",
                    String::from_utf8_lossy(&body)
                );
                assert_eq!(served.code, fresh.code);
                asked += 1;
                // The second ask of the same thing over the same data: served from the cache.
                let again = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", &body, 1 << 20).await.expect("answers");
                assert_eq!(again, served);
            }
        }
    }
    assert!(asked > 1000, "asked {asked}");
}

#[tokio::test]
async fn a_repeated_request_over_unchanged_buckets_does_not_call_the_guest() {
    let guest = tests::guest();
    let b = MemoryBackend::new();
    b.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"a\"");
    let backend = b.clone() as Arc<dyn Backend>;
    let body = br#"{"what":"needs","node":"alpha"}"#;
    let first = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    let needs = b.bucket("mesh-provisioner_needs");
    let visited = needs.visited();
    let second = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(needs.visited(), visited, "the second answer read nothing: the guest was not called");
    // Another budget is another request; a put anywhere in what it read makes it asked again.
    b.put("mesh-provisioner_needs", "alpha.app.config.url", b"\"b\"");
    let third = guest.handle(backend.clone(), Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.unwrap();
    assert_ne!(third, first);
    assert!(String::from_utf8_lossy(&third.body).contains("\"b\""));
}
