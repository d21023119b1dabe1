//! What part of a mirror a read looked at ([`Reach`]), and when each part last changed
//! ([`PartChanges`]): so a reply that read one node's keys can outlive a write to another node's
//! (the reply cache, with the guest's revision slot).
//!
//! Parts are the 256 slots a key's first subject token hashes to (a node clients' bucket is
//! `<node>.>`: one node's keys share a slot), plus "everything else" — a change that is not one
//! key's put or delete (a rebuild, a resync, a refusal) touches every part. Two tokens sharing a
//! slot only cost a reply kept for one a miss after a write to the other. Like subject
//! matching, this is NATS subject syntax (tokens between dots), not a key shape: nothing here
//! knows what a token means.

use std::sync::atomic::{AtomicU64, Ordering};

const SLOTS: usize = 256;

/// The parts of one mirror a call read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reach {
    everything: bool,
    slots: [u64; SLOTS / 64],
}

impl Reach {
    /// Every key and everything about the mirror (a scan of `>` or `*.x`, its writers' counts).
    pub fn everything() -> Reach {
        Reach { everything: true, ..Reach::default() }
    }

    /// No key: only what changes with the mirror as a whole (whether its bucket exists).
    pub fn nothing() -> Reach {
        Reach::default()
    }

    /// What a read of a key, or a scan of a subject filter, looks at: the slot of its first
    /// token, or everything when that token is a wildcard.
    pub fn of(subject: &str) -> Reach {
        let first = first_token(subject);
        if first == "*" || first == ">" {
            return Reach::everything();
        }
        let mut r = Reach::default();
        let slot = slot(first);
        r.slots[slot / 64] |= 1 << (slot % 64);
        r
    }

    /// Both reaches together.
    pub fn with(mut self, other: Reach) -> Reach {
        self.everything |= other.everything;
        for (a, b) in self.slots.iter_mut().zip(other.slots) {
            *a |= b;
        }
        self
    }

    pub fn is_everything(&self) -> bool {
        self.everything
    }

    fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..SLOTS).filter(|s| self.slots[s / 64] & (1 << (s % 64)) != 0)
    }
}

fn first_token(subject: &str) -> &str {
    subject.split('.').next().unwrap_or_default()
}

/// The slot of a first token (FNV-1a: fixed, so a test can name two tokens that collide).
fn slot(token: &str) -> usize {
    let h = token.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    (h as usize) % SLOTS
}

/// The mirror's version at the last change of each part. Written under the mirror's write
/// lock, read under its read lock: consistent with the contents.
#[derive(Debug)]
pub struct PartChanges {
    whole: AtomicU64,
    slots: Box<[AtomicU64]>,
}

impl Default for PartChanges {
    fn default() -> Self {
        PartChanges { whole: AtomicU64::new(0), slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl PartChanges {
    /// `key` was put or deleted at `version`.
    pub fn key(&self, key: &str, version: u64) {
        self.slots[slot(first_token(key))].store(version, Ordering::Relaxed);
    }

    /// Something other than one key changed at `version`.
    pub fn whole(&self, version: u64) {
        self.whole.store(version, Ordering::Relaxed);
    }

    /// Whether anything `reach` covers changed after `version` (everything: any change).
    pub fn since(&self, reach: &Reach, version: u64, now: u64) -> bool {
        if now == version {
            return false;
        }
        reach.is_everything() || self.whole.load(Ordering::Relaxed) > version || reach.slots().any(|s| self.slots[s].load(Ordering::Relaxed) > version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_reaches_the_slot_of_its_first_token_or_everything_past_a_wildcard() {
        assert_eq!(Reach::of("alpha.app.>"), Reach::of("alpha"));
        assert_eq!(Reach::of("alpha.app.config.url"), Reach::of("alpha.web"));
        assert!(Reach::of("*.app.>").is_everything());
        assert!(Reach::of(">").is_everything());
        assert!(!Reach::nothing().with(Reach::of("beta")).is_everything());
        assert!(Reach::of("beta").with(Reach::everything()).is_everything());
    }

    #[test]
    fn a_change_is_seen_by_the_reads_that_reached_it_only() {
        let (alpha, beta) = (Reach::of("alpha.>"), Reach::of("beta.>"));
        assert_ne!(slot("alpha"), slot("beta"), "the test needs two slots");
        let c = PartChanges::default();
        c.key("alpha.app.config.url", 7);
        assert!(c.since(&alpha, 6, 7));
        assert!(!c.since(&beta, 6, 7), "a write to alpha leaves what beta's read found");
        assert!(c.since(&Reach::everything(), 6, 7));
        assert!(!c.since(&alpha, 7, 7));
        assert!(!c.since(&Reach::nothing(), 6, 7));
        c.whole(8);
        assert!(c.since(&beta, 7, 8) && c.since(&Reach::nothing(), 7, 8), "a rebuild reaches every read");
        // Two tokens in one slot: a write to one is seen by a read of the other (a miss, never a
        // stale hit).
        let twin = (0..100_000).map(|i| format!("n{i}")).find(|t| slot(t) == slot("alpha")).expect("a token in alpha's slot");
        c.key(&format!("{twin}.x"), 9);
        assert!(c.since(&alpha, 8, 9));
    }
}
