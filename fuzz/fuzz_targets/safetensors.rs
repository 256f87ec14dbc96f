//! The safetensors reader; the body and its property: `ingot_testkit::fuzz::safetensors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ingot_testkit::fuzz::safetensors(data));
