//! Replays every saved fuzz input through its target, on stable, as part of `cargo test`.
//!
//! The targets' bodies live in `fuzz/targets/` and are compiled unchanged into this binary
//! (`main.rs` declares them); the
//! libFuzzer binaries in `fuzz/` (a separate cargo workspace, built with `cargo +nightly
//! fuzz`) wrap the same code. Each test replays `fuzz/corpus/<target>/` (the minimized
//! corpus) and `fuzz/regressions/<target>/` (inputs that once found a bug). See
//! `docs/fuzzing.md`.

use std::path::{Path, PathBuf};

use crate::{config_loader, frame_decoder, register_handshake, resume_claims, run_state_machine};

/// Runs `target` on every file saved for it; fails if there is none, so a misplaced corpus
/// cannot pass silently.
fn replay(target: &str, run: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs: Vec<PathBuf> = ["corpus", "regressions"]
        .iter()
        .filter_map(|kind| std::fs::read_dir(fuzz.join(kind).join(target)).ok())
        .flatten()
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    inputs.sort();
    assert!(
        !inputs.is_empty(),
        "no saved inputs for fuzz target {target}"
    );
    for input in inputs {
        let data = std::fs::read(&input).expect("a readable fuzz input");
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "fuzz target {target} failed on {}",
            input.display()
        );
    }
}

#[crate::common::test]
fn frame_decoder_corpus() {
    replay("frame_decoder", frame_decoder::run);
}

#[crate::common::test]
fn register_handshake_corpus() {
    replay("register_handshake", register_handshake::run);
}

#[crate::common::test]
fn resume_claims_corpus() {
    replay("resume_claims", resume_claims::run);
}

#[crate::common::test]
fn run_state_machine_corpus() {
    replay("run_state_machine", run_state_machine::run);
}

#[crate::common::test]
fn config_loader_corpus() {
    replay("config_loader", config_loader::run);
}
