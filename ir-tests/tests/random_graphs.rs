//! Random training steps, compiled (rewritten, fused, planned) and run on the CPU, agree with the
//! unfused reference interpreter ([`ingot_testkit::random_step`]); and the graphs of issue 14
//! that once failed their first step (a GPT with a size-1 dimension, a concat of 2 or many
//! parts, a slice on an inner axis of a reshaped matmul output) now train.

use ingot_compiler::model::Model;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::random_step::{
    as_accurate_as, check_cpu, check_described, check_model, check_model_altered,
    check_model_compiled_with, rounding_noise, scale_kernel_output, within_noise, Description,
    OpKind, Outcome, Precision, ATOL, NOISE_SIGMAS, RTOL,
};
use ingot_trainer::session::Session;
use proptest::prelude::*;

#[test]
fn five_hundred_fixed_random_steps_match_the_unfused_reference() {
    let mut failures = Vec::new();
    for seed in 0..500 {
        if let Err(e) = check_cpu(seed) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 500 failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

proptest! {
    // The same 150 seeds every run (a fixed generator seed): the generator's bf16 steps leave a
    // few seeds in 20,000 outside the tolerance (see issue 53's note), and a test that drew new
    // seeds each run would fail now and then for them. `examples/random_steps` sweeps ranges.
    #![proptest_config(ProptestConfig {
        cases: 150,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x1d07_2026_1128),
        ..ProptestConfig::default()
    })]
    #[test]
    fn any_random_step_matches_the_unfused_reference(seed in any::<u64>()) {
        check_cpu(seed).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    // The twin of the fuzz target `fused_step`: steps described op by op (as the fuzzer's input
    // is read), in f32, from a fixed generator seed as above.
    #![proptest_config(ProptestConfig {
        cases: 40,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x1d07_2026_1129),
        ..ProptestConfig::default()
    })]
    #[test]
    fn any_described_random_step_matches_the_unfused_reference(
        seed in any::<u64>(),
        ops in proptest::collection::vec(0..OpKind::ALL.len(), 1..16),
        adamw in any::<bool>(),
        micro_batches in 1usize..=3,
    ) {
        let d = Description {
            seed,
            ops: ops.iter().map(|&i| OpKind::ALL[i]).collect(),
            adamw,
            precision: Precision::F32,
            micro_batches,
        };
        check_described(&d).map_err(TestCaseError::fail)?;
    }
}

/// Issue 53: seeds whose bf16 steps once failed. 36447's `reduce_max` gradient counts the
/// elements equal to the max: a fused kernel recomputed `tanh` unrounded and compared it with
/// the max another kernel had stored rounded to bf16, found nothing equal and divided by a count
/// of 0 (NaN parameters where the reference's are finite). A bf16 value that leaves bf16 (a
/// conversion, a compare) is now rounded first, wherever it is computed (`fuse::widen`).
#[test]
fn bf16_steps_that_compare_a_recomputed_value_with_a_stored_one_match_the_reference() {
    // 35140, 35882 and 38844 failed their tolerance through the same kind of unrounded value.
    for seed in [35140, 35882, 36447, 38844] {
        let m = ingot_compiler::random_graph::model(seed).unwrap();
        assert_eq!(m.precision, Precision::Bf16, "seed {seed}");
        check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Issue 53: the eleven bf16 steps of the million random steps (seeds 1,000,000 to 1,999,999)
/// whose fused step was NaN where the op-by-op reference is finite, each `reduce_max`'s
/// gradient dividing by a count of 0 maxima. The gradient tests the values the max was taken
/// over for equality with it, and found none equal where it saw them rounded otherwise than
/// the max did: a copy recomputed for the backward pass (`fuse::remat`) stored and rounded its
/// bf16 arithmetic in other places than the original (ten seeds), or a kernel took the max
/// over a value it also stored, unrounded, where the gradient's kernel read it stored
/// (1074914; `fuse::widen`).
#[test]
fn bf16_steps_whose_max_gradient_found_no_maximum_match_the_reference() {
    let seeds = [
        1074914, 1075796, 1098392, 1261538, 1354322, 1520729, 1526833, 1742846, 1752659, 1773371,
        1842677,
    ];
    for seed in seeds {
        let m = ingot_compiler::random_graph::model(seed).unwrap();
        assert_eq!(m.precision, Precision::Bf16, "seed {seed}");
        check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Issue 53: bf16 steps whose fused result and op-by-op reference, two roundings of one
/// computation, differ by more than the bf16 tolerance (a batch norm over ten values, AdamW's
/// second moment) pass because the fused step is as accurate as the reference against the
/// same step in f32.
#[test]
fn bf16_steps_nearly_as_accurate_as_the_reference_against_f32_pass() {
    // 1040241 of the million random steps, refused in session 35, passes after session 36's
    // two changes for the NaN steps (below). 1498461 and 1686696 passed with those changes
    // too, were refused when fusion stopped storing outputs only their own kernel reads
    // (fuse::unread: fused 6.8e-3 and 0.62 from the f32 step where the reference is 3.3e-3
    // and 0.065: the kernel then read the value unrounded that it had read rounded as
    // stored), and pass again now that a dropped store keeps its rounding.
    for seed in [30242, 33559, 1040241, 1498461, 1686696] {
        check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Issue 53: f32 steps of the million random steps (seeds 1,000,000 to 1,999,999) outside the
/// f32 tolerance. In 1026280 a gradient that is zero in exact arithmetic (through a batch norm
/// over three values of a shifted input) is 4.9e-4 of rounding noise in the reference and
/// exactly 0 once rewritten: against the same step in f64 the fused step is the nearer.
#[test]
fn f32_steps_nearly_as_accurate_as_the_reference_against_f64_pass() {
    for seed in [1026280, 1067995, 1116827, 1692260] {
        check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `seed`'s step checked compiled with the rewrite and fusion each on or off.
fn check_variant(seed: u64, rewrite: bool, fuse: bool) -> Result<Outcome, String> {
    let m = ingot_compiler::random_graph::model(seed).unwrap();
    let mut opts = Session::cpu_options();
    if !rewrite {
        opts.rewrite = None;
    }
    if !fuse {
        opts.fuse = None;
    }
    let step = ingot_compiler::random_graph::step_options(seed);
    check_model_compiled_with(&m, &step, &opts, seed)
}

/// The five seeds once refused (issue 53, sessions 36-40), each moved by one pass: the bf16
/// steps 34635, 2010155, 2029122 and 2064223 by fusion (a kernel rounds to bf16 only what it
/// stores, the reference every op), the f32 step 1465048 by the rewrite (reassociated sums
/// ahead of a batch norm over three values). 2064223 (session 40) was refused because its
/// rounding noise came out NaN: the estimate perturbed a `reduce_max`'s result, which then
/// equalled none of its elements, and the maximum's gradient divided by a count of 0. Without that pass the compiled step is the op-by-op
/// reference to the bit; with it, each differs from the reference by less than its rounding
/// noise allows (`within_noise`): the spread of the same step with every rounding replaced by
/// a random error of its size, computed in f64 beside the reference.
#[test]
fn each_once_open_seed_is_moved_by_one_pass_within_its_rounding_noise() {
    for (seed, rewrite_moves) in [
        (34635, false),
        (2010155, false),
        (2029122, false),
        (1465048, true),
        (2064223, false),
    ] {
        let (on, off) = match rewrite_moves {
            true => ((true, false), (false, true)),
            false => ((false, true), (true, false)),
        };
        let o = check_variant(seed, off.0, off.1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.worst, 0.0, "seed {seed} without the pass that moves it");
        let o = check_variant(seed, on.0, on.1).unwrap_or_else(|e| panic!("{e}"));
        assert!(o.worst > 0.0 && o.worst <= 1.0, "seed {seed}: {o:?}");
        check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The noise standard still refuses a wrong kernel: in 1465048 (f32, its conv1.weight's
/// gradient through a batch norm over three values, where only that standard admits the
/// fused step) an error of 4 to 8 ulps in every element that fused kernel 4 stores moves
/// conv1.weight by 11 of its rounding noise's standard deviations, and the step is refused
/// there; the same kernel re-planned unscaled passes, as compiled.
#[test]
fn a_few_ulps_injected_into_a_fused_kernel_are_refused_beyond_the_rounding_noise() {
    let seed = 1465048;
    let m = ingot_compiler::random_graph::model(seed).unwrap();
    let step = ingot_compiler::random_graph::step_options(seed);
    let opts = Session::cpu_options();
    let check = |ulps: f64| {
        let alter = move |g: &ingot_compiler::ir::Graph| scale_kernel_output(g, 4, ulps);
        check_model_altered(&m, &step, &opts, seed, Some(&alter))
    };
    let plain = check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
    let o = check(0.0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.worst, plain.worst, "the kernel re-planned unscaled");
    let e = check(4.0).unwrap_err();
    assert!(
        e.contains("beyond its rounding noise") && e.contains("conv1.weight"),
        "{e}"
    );
    let e = scale_kernel_output(&ingot_compiler::ir::Graph::new(), 0, 1.0).unwrap_err();
    assert!(e.contains("0 fused kernels"), "{e}");
}

/// Issue 53 (session 38): what 34635 refused is the gradient of a constant added to a
/// convolution's whole input ahead of a batch norm (`tanh(mean(p1))` into p2): the norm takes
/// it out again, so that gradient is 0 in exact arithmetic and rounding noise in bf16. The same
/// step without that one addition passes too.
#[test]
fn bf16_34635_passes_without_its_constant_shift_ahead_of_a_batch_norm() {
    let seed = 34635;
    let mut m = ingot_compiler::random_graph::model(seed).unwrap();
    let text = m.graph.to_string();
    let shift = "%9 = add(%2, %8) : f32[2,2,4,4]";
    assert!(
        text.contains(shift),
        "the generator's step changed:\n{text}"
    );
    let edited = text.replace(shift, "%9 = add(%2, %2) : f32[2,2,4,4]");
    m.graph = ingot_compiler::ir::text::parse(&edited).unwrap();
    let step = ingot_compiler::random_graph::step_options(seed);
    check_model_compiled_with(&m, &step, &Session::cpu_options(), seed)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The rounding noise grows with the magnitudes of the terms summed, not with the result:
/// `sum((a + b) - b)` over 64 elements with `a = 1e-3`, `b = 1e3` is 0.064, but each `a + b`
/// rounds an f32 near 1e3, an error uniform on ±1e3·2^-24 whose standard deviation is
/// 1e3·2^-24/√3; the sum of 64 of them has 8 times that (2.75e-4), the other roundings are
/// 10^6 times smaller.
#[test]
fn the_rounding_noise_of_a_cancelling_sum_is_that_of_its_terms() {
    let text = "ingot-ir 1\n\
                %0 = input \"a\" : f32[64]\n\
                %1 = input \"b\" : f32[64]\n\
                %2 = add(%0, %1) : f32[64]\n\
                %3 = sub(%2, %1) : f32[64]\n\
                %4 = reduce_sum(%3) axes=[0] : f32[1]\n\
                %5 = reshape(%4) : f32[]\n\
                output \"loss\" = %5\n";
    let g = ingot_compiler::ir::text::parse(text).unwrap();
    let mut leaves = indexmap::IndexMap::new();
    leaves.insert("a".to_string(), Tensor::from_f32([64], vec![1e-3; 64]));
    leaves.insert("b".to_string(), Tensor::from_f32([64], vec![1e3; 64]));
    let sd = rounding_noise("t", &g, &leaves, 7).unwrap();
    let want = 8.0 * 1e3 * 2f64.powi(-24) / 3f64.sqrt();
    let got = sd["loss"][0];
    assert!(
        got > 0.5 * want && got < 2.0 * want,
        "{got:e} against {want:e}"
    );
}

/// A maximum (over axes, or a pooling window) is one of its operand's elements, and rounds
/// nothing: its rounding noise is 0. The gradient of a maximum finds the elements equal to it
/// (`(1 / count) · hit`), which a perturbed maximum would equal none of (count 0, the gradient
/// NaN, as seed 2064223's noise was in session 40): its noise is that of the division and the
/// sums, finite and about f32's rounding of 1.
#[test]
fn the_rounding_noise_of_a_maximum_is_zero_and_of_its_gradient_finite() {
    let noise = |body: &str, x: Tensor| {
        let text = format!("ingot-ir 1\n%0 = input \"x\" : f32[1,1,2,2]\n{body}");
        let g = ingot_compiler::ir::text::parse(&text).unwrap();
        let leaves = indexmap::IndexMap::from([("x".to_string(), x)]);
        rounding_noise("t", &g, &leaves, 7).unwrap()["loss"][0]
    };
    let x = Tensor::from_f32([1, 1, 2, 2], vec![0.3, 0.7, 0.1, 0.2]);
    let max = "%1 = reduce_max(%0) axes=[0,1,2,3] : f32[1,1,1,1]\n\
               %2 = reshape(%1) : f32[]\noutput \"loss\" = %2\n";
    assert_eq!(noise(max, x.clone()), 0.0, "reduce_max");
    let pool = "%1 = max_pool2d(%0) kernel=[2,2] stride=[2,2] padding=[0,0] dilation=[1,1] \
                : f32[1,1,1,1]\n%2 = reshape(%1) : f32[]\noutput \"loss\" = %2\n";
    assert_eq!(noise(pool, x.clone()), 0.0, "max_pool2d");
    let grad = "%1 = reduce_max(%0) axes=[0,1,2,3] : f32[1,1,1,1]\n\
                %2 = broadcast(%1) : f32[1,1,2,2]\n%3 = eq(%0, %2) : bool[1,1,2,2]\n\
                %4 = convert(%3) : f32[1,1,2,2]\n%5 = reduce_sum(%4) axes=[0,1,2,3] : f32[1,1,1,1]\n\
                %6 = full value=1.0 : f32[1,1,1,1]\n%7 = div(%6, %5) : f32[1,1,1,1]\n\
                %8 = broadcast(%7) : f32[1,1,2,2]\n%9 = mul(%8, %4) : f32[1,1,2,2]\n\
                %10 = reduce_sum(%9) axes=[0,1,2,3] : f32[1,1,1,1]\n\
                %11 = reshape(%10) : f32[]\noutput \"loss\" = %11\n";
    let sd = noise(grad, x);
    assert!(
        sd.is_finite() && sd > 0.0 && sd < 4.0 * 2f64.powi(-24),
        "{sd:e}"
    );
}

/// The third standard admits a difference up to the first standard's bound plus
/// `NOISE_SIGMAS` standard deviations of each element's own noise, and no more.
#[test]
fn a_difference_beyond_its_elements_rounding_noise_is_refused() {
    let want = Tensor::from_f32([2], vec![0.0, 1.0]);
    let first = ATOL + RTOL * 1.0;
    let sd = [1e-3, 0.0];
    let near = Tensor::from_f32([2], vec![(first + 0.9 * NOISE_SIGMAS * 1e-3) as f32, 1.0]);
    assert!(within_noise("t", &near, &want, &sd, 1.0).is_ok_and(|r| r < 1.0 && r > 0.8));
    let far = Tensor::from_f32([2], vec![(first + 1.1 * NOISE_SIGMAS * 1e-3) as f32, 1.0]);
    let e = within_noise("t", &far, &want, &sd, 1.0).unwrap_err();
    assert!(e.starts_with("t[0]: "), "{e}");
    // An element without noise is held to the first standard alone.
    let off = Tensor::from_f32([2], vec![0.0, (1.0 + 2.0 * first) as f32]);
    assert!(within_noise("t", &off, &want, &sd, 1.0).is_err());
}

#[test]
fn a_result_farther_from_f32_than_twice_the_reference_is_refused() {
    let exact = Tensor::from_f32([2], vec![1.0, 2.0]);
    let want = Tensor::from_f32([2], vec![1.01, 2.0]);
    let close = Tensor::from_f32([2], vec![0.985, 2.0]);
    let far = Tensor::from_f32([2], vec![1.03, 2.0]);
    assert!(as_accurate_as("t", &close, &want, &exact).is_ok_and(|r| r < 1.0));
    let e = as_accurate_as("t", &far, &want, &exact).unwrap_err();
    assert!(e.starts_with("t: "), "{e}");
    let nan = Tensor::from_f32([2], vec![f32::NAN, 2.0]);
    assert!(as_accurate_as("t", &nan, &want, &exact).is_err());
}

/// Issue 53: the generator accumulates gradients over micro-batches (a quarter of the seeds,
/// 2 or 3 of them), so the fixed and random seeds above check accumulated steps too; here a
/// few of each count, checked alone.
#[test]
fn random_steps_that_accumulate_micro_batches_match_the_unfused_reference() {
    use ingot_compiler::random_graph::micro_batches;
    let mut seen = [0usize; 4];
    for seed in 0..200 {
        let k = micro_batches(seed);
        if seen[k] < 6 && k > 1 {
            let o = check_cpu(seed).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(o.micro_batches, k, "seed {seed}: the step accumulates");
        }
        seen[k] += 1;
    }
    assert!(
        seen[2] >= 6 && seen[3] >= 6 && seen[1] > seen[2] + seen[3],
        "micro-batch counts drawn: {seen:?}"
    );
}

fn trains(m: &Model) {
    let o = check_model(m, 7).unwrap_or_else(|e| panic!("{e}"));
    assert!(o.kernels > 0, "{}: nothing was fused", m.name);
}

#[test]
fn gpts_with_a_batch_or_a_sequence_of_one_train_a_step_that_matches_the_reference() {
    for spec in [
        "gpt:vocab=64,d_model=32,layers=1,heads=2,d_ff=64,seq=8,batch=1",
        "gpt:vocab=64,d_model=32,layers=1,heads=2,d_ff=64,seq=1,batch=2",
        "gpt:vocab=64,d_model=32,layers=1,heads=1,d_ff=64,seq=1,batch=1",
    ] {
        trains(&ingot_models::by_name(spec).unwrap());
    }
}

#[test]
fn a_slice_on_an_inner_axis_of_a_reshaped_matmul_output_trains() {
    let text = include_str!("models/slice-of-reshaped-matmul.ir");
    trains(&Model::from_ir_text("slice.ir", text).unwrap());
}

#[test]
fn concats_of_two_to_twenty_parts_on_every_axis_train() {
    for n in 2..=20usize {
        for axis in 0..2 {
            let mut t = String::from("ingot-ir 1\n%0 = input \"x\" : f32[4,3]\n");
            t += "%1 = parameter \"w\" init=normal(0.5) : f32[4,3]\n%2 = mul(%0, %1) : f32[4,3]\n";
            let mut parts = Vec::new();
            for i in 0..n {
                let op = if i % 2 == 0 {
                    "mul(%2, %2)"
                } else {
                    "add(%2, %0)"
                };
                t += &format!("%{} = {op} : f32[4,3]\n", 3 + i);
                parts.push(format!("%{}", 3 + i));
            }
            let c = 3 + n;
            let dims = if axis == 0 {
                format!("{},3", 4 * n)
            } else {
                format!("4,{}", 3 * n)
            };
            t += &format!(
                "%{c} = concat({}) axis={axis} : f32[{dims}]\n",
                parts.join(", ")
            );
            t += &format!("%{} = mul(%{c}, %{c}) : f32[{dims}]\n", c + 1);
            t += &format!(
                "%{} = reduce_sum(%{}) axes=[0,1] : f32[1,1]\n",
                c + 2,
                c + 1
            );
            t += &format!(
                "%{} = reshape(%{}) : f32[]\noutput \"loss\" = %{}\n",
                c + 3,
                c + 2,
                c + 3
            );
            trains(&Model::from_ir_text(&format!("concat{n}"), &t).unwrap());
        }
    }
}

#[test]
fn a_flat_kernel_over_a_size_1_axis_reads_its_slice_whatever_the_scratch_held() {
    // The kernel of the sliced matmul output: [4, 1, 2] of a [4, 3, 2] value at offset 4. Its
    // scratch region is filled with 0xff, as a planned step's slab may leave it.
    use ingot_kernels::fused::{cpu, Access, Input, Inst, Output};
    use ingot_kernels::{DType, FusedKernel};
    let k = FusedKernel {
        domain: vec![4, 1, 2],
        reduce_axes: vec![],
        inputs: vec![Input {
            dtype: DType::F32,
            len: 24,
            access: Access {
                offset: 4,
                strides: vec![6, 2, 1],
            },
        }],
        body: vec![Inst::Load { input: 0 }],
        outputs: vec![Output { value: 0 }],
    };
    let scratch = 256;
    let mut mem = vec![0xffu8; scratch + cpu::scratch_bytes(&k)];
    for i in 0..24 {
        mem[i * 4..i * 4 + 4].copy_from_slice(&(i as f32).to_ne_bytes());
    }
    cpu::run(&k, &mut mem, &[0], &[128], scratch).unwrap();
    let out: Vec<f32> = mem[128..160]
        .chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(out, [4.0, 5.0, 10.0, 11.0, 16.0, 17.0, 22.0, 23.0]);
}
