//! What memory a model takes and what an engine may give it: a model's footprint as its
//! node derived it ([`Footprint`]), a managed adapter's budget ([`Budget`]), and the byte
//! arithmetic of a load — the room an engine has, and the fewest idle models whose
//! unloading makes enough of it ([`fewest_evictions`]).
//!
//! Pure and below the plans (`plan.rs` builds on it, never the other way round): it knows
//! targets, bytes and when each candidate was last used, not engines or policies.

use std::fmt;
use std::time::Instant;

use crate::domain::Target;
use crate::domain::inventory::Bytes;

/// The code a request (or a queued run) for a model that fits on no node is refused with.
pub const MODEL_TOO_LARGE: &str = "model_too_large";

/// Where a footprint came from: how the node derived it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FootprintSource {
    /// The GGUF file's header: its tensors' sizes, and the KV cache its layer and head counts
    /// take at the context the engine gives it, plus the engine's overhead.
    Gguf,
    /// Ollama's `/api/tags` `size`: the model's file (its weights), before it was loaded.
    OllamaFile,
    /// Ollama's `/api/ps` `size`: what it allocated once loaded.
    OllamaLoaded,
    /// A vLLM server's `gpu_memory_utilization` share of its devices.
    VllmShare,
    /// The adapter's `footprint.<target>` setting.
    Setting,
}

impl FootprintSource {
    /// Its name in the management API and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gguf => "gguf",
            Self::OllamaFile => "ollama_file",
            Self::OllamaLoaded => "ollama_loaded",
            Self::VllmShare => "vllm_share",
            Self::Setting => "setting",
        }
    }

    /// The source named `name` ([`Self::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Gguf,
            Self::OllamaFile,
            Self::OllamaLoaded,
            Self::VllmShare,
            Self::Setting,
        ]
        .into_iter()
        .find(|source| source.as_str() == name)
    }
}

/// The memory a model takes once loaded, as its node derived it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// All of it, in bytes: what placement counts.
    pub bytes: u64,
    /// Of which its weights, when the node knows the split (0 otherwise).
    pub weights: u64,
    /// Of which its KV cache at `context` (0 when not known apart).
    pub kv_cache: u64,
    /// Of which the engine's own overhead (0 when not known apart).
    pub overhead: u64,
    /// The context, in tokens, the KV cache was sized for (0: not known).
    pub context: u32,
    /// How it was derived.
    pub source: FootprintSource,
}

impl Footprint {
    /// A footprint of `bytes` from `source`, without a split.
    pub fn whole(bytes: u64, source: FootprintSource) -> Self {
        Self {
            bytes,
            weights: 0,
            kv_cache: 0,
            overhead: 0,
            context: 0,
            source,
        }
    }
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", Bytes(self.bytes), self.source.as_str())
    }
}

/// What a managed adapter may use for models: its node's `memory` setting (or its devices'
/// memory less the margin), on the devices its `devices` setting names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budget {
    /// The budget, in bytes.
    pub bytes: u64,
    /// The node's devices it uses, by index.
    pub devices: Vec<u32>,
}

/// What a load found on one engine: the footprint it needs, the budget, and the room left
/// before it (budget less the footprints the edge knows are held there). Said with every
/// decision, in the log, the feed and the management API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitNote {
    /// The model's footprint there, in bytes.
    pub footprint: u64,
    /// The engine's budget, in bytes.
    pub budget: u64,
    /// The room before the load and its evictions, in bytes.
    pub room: u64,
}

impl fmt::Display for FitNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "footprint {}, room {} of {}",
            Bytes(self.footprint),
            Bytes(self.room),
            Bytes(self.budget)
        )
    }
}

/// A model that fits on no node: its footprint is above every budget of the engines that
/// list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "its footprint ({}) is larger than the largest budget of the nodes that can load it ({})",
    Bytes(*.footprint),
    Bytes(*.largest_budget)
)]
pub struct TooLarge {
    /// The model's smallest footprint among those nodes, in bytes.
    pub footprint: u64,
    /// The largest of their budgets, in bytes.
    pub largest_budget: u64,
}

/// An idle model that may be unloaded to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its target.
    pub target: Target,
    /// Since when nothing of it ran.
    pub idle_since: Instant,
    /// What unloading it frees, in bytes (0 when its footprint is not known).
    pub bytes: u64,
}

/// The fewest `candidates` whose unloading frees `bytes` more bytes and `places` more
/// places, least recently used first among the sets of that size; `None` when all of them
/// would not do. Nothing needed: an empty set.
pub fn fewest_evictions(
    bytes: u64,
    places: usize,
    candidates: &[Candidate],
) -> Option<Vec<Target>> {
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by(|a, b| {
        a.idle_since
            .cmp(&b.idle_since)
            .then_with(|| a.target.cmp(&b.target))
    });
    let mut largest: Vec<u64> = order.iter().map(|c| c.bytes).collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    let size = (places..=order.len()).find(|&k| largest[..k].iter().sum::<u64>() >= bytes)?;
    // Least recently used first: take each candidate when a set of `size` that holds it
    // can still free enough with what comes after it.
    let mut chosen = Vec::with_capacity(size);
    let mut freed = 0u64;
    for (at, candidate) in order.iter().enumerate() {
        let still = size - chosen.len();
        if still == 0 {
            break;
        }
        let mut rest: Vec<u64> = order[at + 1..].iter().map(|c| c.bytes).collect();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        let best_after: u64 = rest.iter().take(still - 1).sum();
        if freed + candidate.bytes + best_after >= bytes && order.len() - at >= still {
            freed += candidate.bytes;
            chosen.push(candidate.target.clone());
        }
    }
    Some(chosen)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn candidates(sizes: &[(u64, u64)]) -> Vec<Candidate> {
        let base = Instant::now();
        sizes
            .iter()
            .enumerate()
            .map(|(i, &(bytes, age))| Candidate {
                target: Target::parse(&format!("t{i}")).unwrap(),
                idle_since: base + Duration::from_secs(age),
                bytes,
            })
            .collect()
    }

    fn names(targets: &[Target]) -> Vec<&str> {
        targets.iter().map(Target::as_str).collect()
    }

    #[test]
    fn the_fewest_that_free_enough_least_recently_used_first() {
        // t0 oldest and small, t1 large, t2 large and newest.
        let pool = candidates(&[(10, 0), (100, 1), (100, 2)]);
        assert_eq!(fewest_evictions(0, 0, &pool), Some(vec![]));
        assert_eq!(names(&fewest_evictions(5, 0, &pool).unwrap()), ["t0"]);
        // One large one frees enough: the older of the two, not the oldest small one.
        assert_eq!(names(&fewest_evictions(50, 0, &pool).unwrap()), ["t1"]);
        assert_eq!(
            names(&fewest_evictions(110, 0, &pool).unwrap()),
            ["t0", "t1"]
        );
        assert_eq!(
            names(&fewest_evictions(150, 0, &pool).unwrap()),
            ["t1", "t2"]
        );
        assert_eq!(fewest_evictions(250, 0, &pool), None);
        // A place needed, no bytes: the least recently used.
        assert_eq!(names(&fewest_evictions(0, 1, &pool).unwrap()), ["t0"]);
        assert_eq!(fewest_evictions(0, 4, &pool), None);
    }

    proptest! {
        #[test]
        fn no_smaller_set_frees_enough_and_the_set_chosen_does(
            sizes in prop::collection::vec((0u64..50, 0u64..5), 0..7),
            bytes in 0u64..200,
            places in 0usize..3,
        ) {
            let pool = candidates(&sizes);
            let best = (0u32..1 << pool.len())
                .filter(|set| {
                    let freed: u64 = (0..pool.len()).filter(|i| set & (1 << i) != 0).map(|i| pool[i].bytes).sum();
                    freed >= bytes && set.count_ones() as usize >= places
                })
                .map(u32::count_ones)
                .min();
            let chosen = fewest_evictions(bytes, places, &pool);
            prop_assert_eq!(chosen.as_ref().map(|c| c.len() as u32), best);
            if let Some(chosen) = chosen {
                let freed: u64 = pool.iter().filter(|c| chosen.contains(&c.target)).map(|c| c.bytes).sum();
                prop_assert!(freed >= bytes && chosen.len() >= places);
            }
        }
    }
}
