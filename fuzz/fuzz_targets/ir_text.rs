//! The IR text parser; the body and its property: `ingot_testkit::fuzz::ir_text`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ingot_testkit::fuzz::ir_text(data));
