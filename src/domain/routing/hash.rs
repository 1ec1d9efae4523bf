//! Stable hashing for routing: node identities, affinity keys and rendezvous scores.
//!
//! Every value here must come out the same on every build, platform and Rust release, or a
//! restart would move every session's cache. So the algorithms are written out and pinned by
//! test vectors instead of borrowed from `std` (whose `DefaultHasher` may change between
//! releases): FNV-1a 64 over bytes, with MurmurHash3's 64-bit finalizer for avalanche.
//! Nothing here is for security: a client choosing its key picks its node, which it may do.

use std::hash::{BuildHasherDefault, Hasher};

use super::super::names::NodeId;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`, continuing from `state` (start with [`fnv1a`]'s offset basis).
fn fnv1a_from(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV_OFFSET, bytes)
}

/// MurmurHash3's 64-bit finalizer: a bijection that spreads every input bit over the output.
pub fn mix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// A node's routing identity: a stable hash of its id, computed once when the node is
/// listed and reused by every placement (rendezvous scores, breaker look-ups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeHash(u64);

impl NodeHash {
    /// The hash of `id`.
    pub fn of(id: &NodeId) -> Self {
        Self(mix64(fnv1a_from(fnv1a(b"node"), id.as_str().as_bytes())))
    }

    /// The hash as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Where an affinity key came from, for the route reason and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeySource {
    /// The request's `prompt_cache_key`.
    PromptCacheKey,
    /// The request's `user`.
    User,
    /// The `x-session-id` header.
    Session,
    /// A hash of the prompt's stable prefix (system messages and the first user message).
    Prefix,
}

impl KeySource {
    /// Every source.
    pub const ALL: [KeySource; 4] = [
        Self::PromptCacheKey,
        Self::User,
        Self::Session,
        Self::Prefix,
    ];

    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PromptCacheKey => "prompt_cache_key",
            Self::User => "user",
            Self::Session => "session",
            Self::Prefix => "prefix",
        }
    }

    /// The source named `name`, if any (`none` is none).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// What metrics and usage call the affinity of a run keyed from `source`: the source's
    /// name, `none` for a run without an affinity key.
    pub fn label(source: Option<Self>) -> &'static str {
        source.map_or("none", Self::as_str)
    }

    fn tag(self) -> &'static [u8] {
        self.as_str().as_bytes()
    }
}

/// What a run would like to share a node with: runs with equal keys go to the same node
/// while it stays within its load bound. Holds only a hash, so keys are fixed-size and no
/// index of keys is ever kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    hash: u64,
    source: KeySource,
}

impl AffinityKey {
    /// The key for a value the client gave (`prompt_cache_key`, `user`, `x-session-id`);
    /// `None` when it is empty, which asks for no affinity.
    pub fn from_client(source: KeySource, value: &str) -> Option<Self> {
        if value.is_empty() {
            return None;
        }
        let mut state = fnv1a(source.tag());
        state = fnv1a_from(state, &[0]);
        state = fnv1a_from(state, value.as_bytes());
        Some(Self {
            hash: mix64(state),
            source,
        })
    }

    /// The key of a chat prompt's stable prefix: its system messages, in order, and its
    /// first user message. Each part is hashed with its role and length, so moving text
    /// between parts changes the key. `None` when every part is empty.
    pub fn from_prompt_prefix(system: &[&str], first_user: Option<&str>) -> Option<Self> {
        let user = first_user.unwrap_or_default();
        if user.is_empty() && system.iter().all(|s| s.is_empty()) {
            return None;
        }
        let mut state = fnv1a(KeySource::Prefix.tag());
        let parts = system.iter().map(|s| (b's', *s)).chain([(b'u', user)]);
        for (role, text) in parts {
            state = fnv1a_from(state, &[role]);
            state = fnv1a_from(state, &(text.len() as u64).to_le_bytes());
            state = fnv1a_from(state, text.as_bytes());
        }
        Some(Self {
            hash: mix64(state),
            source: KeySource::Prefix,
        })
    }

    /// Where the key came from.
    pub fn source(self) -> KeySource {
        self.source
    }

    /// The key's hash.
    pub fn hash(self) -> u64 {
        self.hash
    }
}

/// The rendezvous score of `node` for `key`: a stable pseudo-random number per pair.
pub fn score(key: AffinityKey, node: NodeHash) -> u64 {
    mix64(key.hash ^ node.0)
}

/// The score weighted by a node's slots (`max_concurrent_runs`), so a node with twice the
/// slots is first in twice the keys' orders (weighted rendezvous: `w / -ln(u)`). Returned as
/// the bits of a positive `f64`, which order like the numbers, so scores stay integers.
pub fn weighted_score(raw: u64, weight: u32) -> u64 {
    // 53 random bits in (0, 1): never 0, so the logarithm is finite and negative.
    let unit = ((raw >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    (f64::from(weight) / -unit.ln()).to_bits()
}

/// A `Hasher` for maps keyed by [`NodeHash`]: the key is already mixed, so it is used as is.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = fnv1a_from(self.0 ^ FNV_OFFSET, bytes);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Builds [`PassThrough`] hashers.
pub type BuildPassThrough = BuildHasherDefault<PassThrough>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned outputs: if one changes, every deployed key would move to another node.
    #[test]
    fn hashes_are_pinned() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let node = NodeHash::of(&NodeId::parse("gpu-1").unwrap());
        let key = AffinityKey::from_client(KeySource::Session, "abc").unwrap();
        let prefix = AffinityKey::from_prompt_prefix(&["be brief"], Some("hi")).unwrap();
        assert_eq!(
            (node.get(), key.hash(), prefix.hash(), score(key, node)),
            PINNED
        );
    }

    /// Computed independently (a Python transcription of the algorithms above).
    const PINNED: (u64, u64, u64, u64) = (
        398_282_003_894_222_336,
        11_325_532_936_482_816_493,
        6_827_896_648_846_118_779,
        2_009_301_971_913_930_624,
    );

    #[test]
    fn prefix_parts_are_delimited() {
        let a = AffinityKey::from_prompt_prefix(&["ab"], Some("c")).unwrap();
        let b = AffinityKey::from_prompt_prefix(&["a"], Some("bc")).unwrap();
        let c = AffinityKey::from_prompt_prefix(&["a", "b"], Some("c")).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a,
            AffinityKey::from_prompt_prefix(&["ab"], Some("c")).unwrap()
        );
        assert_eq!(AffinityKey::from_prompt_prefix(&["", ""], None), None);
        assert!(AffinityKey::from_prompt_prefix(&[], Some("hi")).is_some());
    }

    #[test]
    fn client_keys_are_scoped_by_source() {
        let user = AffinityKey::from_client(KeySource::User, "x").unwrap();
        let session = AffinityKey::from_client(KeySource::Session, "x").unwrap();
        assert_ne!(user.hash(), session.hash());
        assert_eq!(session.source(), KeySource::Session);
        assert_eq!(AffinityKey::from_client(KeySource::User, ""), None);
    }

    #[test]
    fn weighted_scores_order_like_raw_scores_for_equal_weights() {
        let raws = [1u64, 1 << 20, u64::MAX / 3, u64::MAX - 5000, u64::MAX];
        for pair in raws.windows(2) {
            assert!(weighted_score(pair[0], 4) <= weighted_score(pair[1], 4));
        }
        assert!(weighted_score(u64::MAX / 2, 8) > weighted_score(u64::MAX / 2, 4));
    }
}
