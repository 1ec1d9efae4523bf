//! libFuzzer entry point for `targets/register_handshake.rs` (see `docs/fuzzing.md`).
#![no_main]

#[path = "../targets/recording.rs"]
mod recording;
#[path = "../targets/register_handshake.rs"]
mod register_handshake;

libfuzzer_sys::fuzz_target!(|data: &[u8]| register_handshake::run(data));
