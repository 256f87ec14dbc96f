//! Plan-then-validate (a graph from bytes, planned, the plan validated); the body and its
//! property: `ingot_testkit::fuzz::plan_then_validate`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ingot_testkit::fuzz::plan_then_validate(data));
