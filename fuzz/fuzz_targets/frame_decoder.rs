//! libFuzzer entry point for `targets/frame_decoder.rs` (see `docs/fuzzing.md`).
#![no_main]

#[path = "../targets/frame_decoder.rs"]
mod frame_decoder;

libfuzzer_sys::fuzz_target!(|data: &[u8]| frame_decoder::run(data));
