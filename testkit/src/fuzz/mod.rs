//! The bodies of the fuzz targets (`fuzz/fuzz_targets/*.rs`), here so that the fuzzers and their
//! bounded property-test twins (`ir-tests/tests/fuzz_twins.rs`, run by CI) share one body.
//!
//! Each takes arbitrary bytes and returns normally when the code under test handled them as it
//! promises: an error for bad input, and for good input a result with the property named in the
//! function's doc. Anything else panics, which is what the fuzzer reports: a panic inside the
//! code under test, or a property that failed (the panic message says which). The random-step
//! target's body is [`crate::random_step::check_described`].

mod compiler;
mod runtime;

pub use compiler::{executable, fuzz_plan_options, ir_text, plan_graph, plan_then_validate};
pub use runtime::safetensors;
