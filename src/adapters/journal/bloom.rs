//! Which runs a batch row may hold: a Bloom filter over the run ids with anything in it,
//! so a read by run id decodes only the few batches that can hold that run; and one over
//! what its ended runs may be listed by (node, key, outcome, adapter, target), so a
//! filtered listing decodes only the rows that can hold a match.
//!
//! Ten bits and seven probes per id (about 1 % false positives), the probes by double
//! hashing of one FNV-1a hash. The hash is spelled out here, not taken from `std`, because
//! the filter is stored: its bits must mean the same to every later edge.

/// Bits per id.
const BITS_PER_ID: usize = 10;
/// Probes per id.
const PROBES: u64 = 7;

/// A filter being built, or read back from its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct IdFilter {
    bits: Vec<u8>,
}

impl IdFilter {
    /// An empty filter sized for `ids` ids.
    pub(super) fn with_capacity(ids: usize) -> Self {
        Self {
            bits: vec![0; (ids.max(1) * BITS_PER_ID).div_ceil(8)],
        }
    }

    /// The filter stored as `bytes`.
    pub(super) fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bits: bytes }
    }

    /// Its stored form.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bits
    }

    /// Adds `id`.
    pub(super) fn insert(&mut self, id: &str) {
        self.insert_tagged(0, id);
    }

    /// Adds `value` as one of the kind `tag` names (a node, a key, ...).
    pub(super) fn insert_tagged(&mut self, tag: u8, value: &str) {
        for bit in self.probes(tag, value) {
            self.bits[bit / 8] |= 1 << (bit % 8);
        }
    }

    /// Whether `id` may have been added (never `false` for one that was; always `true`
    /// for a filter with no bytes, which cannot say).
    pub(super) fn may_hold(&self, id: &str) -> bool {
        self.may_hold_tagged(0, id)
    }

    /// [`Self::may_hold`] for a value of the kind `tag` names.
    pub(super) fn may_hold_tagged(&self, tag: u8, value: &str) -> bool {
        self.bits.is_empty()
            || self
                .probes(tag, value)
                .all(|bit| self.bits[bit / 8] & (1 << (bit % 8)) != 0)
    }

    fn probes(&self, tag: u8, value: &str) -> impl Iterator<Item = usize> + use<> {
        let hash = fnv1a(tag, value.as_bytes());
        let (first, step) = (hash, hash.rotate_left(32) | 1);
        let len = (self.bits.len() as u64 * 8).clamp(1, u64::from(u32::MAX));
        // Each probe's high 32 bits scaled to the filter's length: a multiply, not a division.
        (0..PROBES).map(move |i| {
            let probe = first.wrapping_add(i.wrapping_mul(step)) >> 32;
            ((probe * len) >> 32) as usize
        })
    }
}

/// FNV-1a of `bytes`, after `tag` unless it is 0 (so a plain id hashes as itself).
fn fnv1a(tag: u8, bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let tag = (tag != 0).then_some(tag);
    for byte in tag.iter().chain(bytes) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_every_id_added_and_few_others() {
        let mut filter = IdFilter::with_capacity(256);
        let ids: Vec<String> = (0..256).map(|n| format!("run-1a2b3c4d-{n:06}")).collect();
        for id in &ids {
            filter.insert(id);
        }
        let read = IdFilter::from_bytes(filter.bytes().to_vec());
        assert!(ids.iter().all(|id| read.may_hold(id)));
        let others = (256..10_256)
            .filter(|n| read.may_hold(&format!("run-1a2b3c4d-{n:06}")))
            .count();
        assert!(others < 300, "{others} of 10,000 other ids looked held");
    }

    #[test]
    fn a_tagged_value_is_apart_from_the_same_text_under_another_tag() {
        let mut filter = IdFilter::with_capacity(4);
        filter.insert_tagged(1, "gpu-a");
        assert!(filter.may_hold_tagged(1, "gpu-a"));
        assert!(!filter.may_hold_tagged(2, "gpu-a"));
        assert!(!filter.may_hold("gpu-a"));
    }

    #[test]
    fn a_filter_without_bytes_may_hold_anything_and_an_empty_one_nothing() {
        assert!(IdFilter::from_bytes(Vec::new()).may_hold("run-1"));
        assert!(!IdFilter::with_capacity(0).may_hold("run-1"));
    }

    #[test]
    fn the_hash_is_the_stored_one() {
        // FNV-1a's published test vector: the filter's bits depend on it.
        assert_eq!(fnv1a(0, b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
