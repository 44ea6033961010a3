//! Sync frames through the liveness table; the body is
//! `anarchon::fuzzing::sync_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| anarchon::fuzzing::sync_frames(data));
