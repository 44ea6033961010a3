//! Request decoding and validation; the body is `anarchon::fuzzing::requests`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| anarchon::fuzzing::requests(data));
