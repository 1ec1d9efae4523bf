//! libFuzzer entry point for `targets/run_state_machine.rs` (see `docs/fuzzing.md`).
#![no_main]

#[path = "../targets/recording.rs"]
mod recording;
#[path = "../targets/run_state_machine.rs"]
mod run_state_machine;

libfuzzer_sys::fuzz_target!(|data: &[u8]| run_state_machine::run(data));
