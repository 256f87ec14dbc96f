//! A random training step, described op by op by the fuzzer's input (a
//! [`Description`]: the ops in order, the optimizer, the precision, the micro-batches and the
//! seed of the generator's remaining draws), compiled, fused, planned and run on the CPU, must
//! match the unfused reference interpreter (`ingot_testkit::random_step::check_described`; its
//! bounded twin is the property test in ir-tests/tests/random_graphs.rs). Run with
//! `cargo fuzz run fused_step` from this folder.
#![no_main]

use ingot_testkit::random_step::{Description, OpKind, Precision, MAX_OPS};
use libfuzzer_sys::arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// The fuzzer's input read as a [`Description`] (a local type, since neither the trait nor
/// the description is this crate's).
#[derive(Debug)]
struct Step(Description);

impl<'a> Arbitrary<'a> for Step {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let seed = u64::arbitrary(u)?;
        let adamw = bool::arbitrary(u)?;
        let precision = *u.choose(&[Precision::F32, Precision::Tf32, Precision::Bf16])?;
        let micro_batches = u.int_in_range(1..=3)?;
        let mut ops = Vec::new();
        u.arbitrary_loop(Some(1), Some(MAX_OPS as u32), |u| {
            ops.push(*u.choose(&OpKind::ALL)?);
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        Ok(Step(Description {
            seed,
            ops,
            adamw,
            precision,
            micro_batches,
        }))
    }
}

fuzz_target!(|step: Step| {
    if let Err(e) = ingot_testkit::random_step::check_described(&step.0) {
        panic!("{e}");
    }
});
