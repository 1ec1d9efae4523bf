//! libFuzzer entry point for `targets/config_loader.rs` (see `docs/fuzzing.md`).
#![no_main]

#[path = "../targets/config_loader.rs"]
mod config_loader;

libfuzzer_sys::fuzz_target!(|data: &[u8]| config_loader::run(data));
