//! libFuzzer entry point for `targets/resume_claims.rs` (see `docs/fuzzing.md`).
#![no_main]

#[path = "../targets/recording.rs"]
mod recording;
#[path = "../targets/register_handshake.rs"]
#[allow(dead_code)]
mod register_handshake;
#[path = "../targets/resume_claims.rs"]
mod resume_claims;

libfuzzer_sys::fuzz_target!(|data: &[u8]| resume_claims::run(data));
