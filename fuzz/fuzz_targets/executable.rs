//! `Executable::from_bytes`; the body and its property: `ingot_testkit::fuzz::executable`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ingot_testkit::fuzz::executable(data));
