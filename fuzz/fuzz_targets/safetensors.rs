//! The safetensors reader; the body and its property: `ingot_runtime::fuzz::safetensors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ingot_runtime::fuzz::safetensors(data));
