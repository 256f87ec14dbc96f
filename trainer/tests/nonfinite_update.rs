//! The step's count of the non-finite values its update writes
//! (`ingot_compiler::autodiff::StepOptions::count_nonfinite`), on the CPU: fused and unfused
//! it counts exactly the elements the host finds NaN or infinite after the step, and a session
//! names the first parameter holding one.

use indexmap::IndexMap;
use ingot_compiler::autodiff::{StepOptions, NONFINITE};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::session::{Device, Session};

/// `sum(sqrt(w)) + sum(b²)` under SGD (lr 0.1): the gradient of `sqrt` at 0 is infinite, so
/// each zero of `w` becomes `-inf` in the update while the loss stays finite; an infinite `b`
/// gives an infinite loss and a NaN update.
const MODEL: &str = "ingot-ir 1
%0 = parameter \"w\" init=ones : f32[2,3]
%1 = parameter \"b\" init=ones : f32[3]
%2 = sqrt(%0) : f32[2,3]
%3 = reduce_sum(%2) axes=[0,1] : f32[1,1]
%4 = reshape(%3) : f32[]
%5 = mul(%1, %1) : f32[3]
%6 = reduce_sum(%5) axes=[0] : f32[1]
%7 = reshape(%6) : f32[]
%8 = add(%4, %7) : f32[]
output \"loss\" = %8
";

fn session(count: bool, fused: bool) -> Session {
    let model = Model::from_ir_text("sqrt-at-zero", MODEL).unwrap();
    let step = StepOptions {
        count_nonfinite: count,
        ..StepOptions::default()
    };
    let opts = if fused {
        pipeline::Options::for_target(Target::Cpu)
    } else {
        pipeline::Options::unoptimized(Target::Cpu.plan_options())
    };
    let exe = pipeline::compile_observed_with(&model, &step, &opts, &mut |_| {})
        .unwrap()
        .executable(Target::Cpu)
        .unwrap();
    Session::from_executable(exe, 0, Device::Cpu).unwrap()
}

fn load(s: &mut Session, w: [f32; 6], b: [f32; 3]) {
    let mut p = IndexMap::new();
    p.insert("w".to_string(), Tensor::from_f32([2, 3], w.to_vec()));
    p.insert("b".to_string(), Tensor::from_f32([3], b.to_vec()));
    s.load_parameters(&p).unwrap();
}

/// How many parameter elements the host reads back as NaN or infinite.
fn counted_on_the_host(s: &Session) -> f64 {
    s.parameters()
        .values()
        .map(|t| t.non_finite().map_or(0, |n| n.count))
        .sum::<usize>() as f64
}

#[test]
fn the_step_counts_the_non_finite_values_its_update_writes_fused_and_unfused() {
    for fused in [true, false] {
        let mut s = session(true, fused);
        assert!(s.graph().outputs.contains_key(NONFINITE));
        // All finite: the count is 0 and the loss finite.
        load(&mut s, [1.0, 4.0, 9.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0]);
        let r = s.step().unwrap();
        assert!(r.loss.is_finite());
        assert_eq!(
            s.last_nonfinite_count().unwrap(),
            Some(0.0),
            "fused {fused}"
        );
        assert_eq!(s.first_nonfinite_parameter(), None);
        // Three zeros of w: a finite loss, three -inf in the new w.
        load(&mut s, [0.0, 1.0, 4.0, 0.0, 0.0, 9.0], [1.0, 2.0, 3.0]);
        let r = s.step().unwrap();
        assert!(r.loss.is_finite(), "the loss {} is finite", r.loss);
        assert_eq!(
            s.last_nonfinite_count().unwrap(),
            Some(3.0),
            "fused {fused}"
        );
        assert_eq!(counted_on_the_host(&s), 3.0);
        let named = s.first_nonfinite_parameter().unwrap();
        assert_mentions(&named, &["parameter \"w\"", "3 of its 6"]);
        // An infinite element of the one-axis b: NaN after its update.
        load(&mut s, [1.0; 6], [f32::INFINITY, 2.0, 3.0]);
        s.step().unwrap();
        assert_eq!(
            s.last_nonfinite_count().unwrap(),
            Some(1.0),
            "fused {fused}"
        );
        assert_eq!(counted_on_the_host(&s), 1.0);
        assert!(s.first_nonfinite_parameter().unwrap().contains("\"b\""));
    }
}

#[test]
fn a_step_compiled_without_the_count_has_no_count_to_read() {
    let mut s = session(false, true);
    assert!(!s.graph().outputs.contains_key(NONFINITE));
    load(&mut s, [0.0; 6], [1.0, 2.0, 3.0]);
    s.step().unwrap();
    assert_eq!(s.last_nonfinite_count().unwrap(), None);
    // The host still finds the parameter.
    assert!(s.first_nonfinite_parameter().unwrap().contains("\"w\""));
}

#[test]
fn the_count_changes_no_other_value_of_the_step() {
    let (mut with, mut without) = (session(true, true), session(false, true));
    for s in [&mut with, &mut without] {
        load(s, [1.0, 4.0, 9.0, 16.0, 25.0, 36.0], [1.0, 2.0, 3.0]);
    }
    for _ in 0..3 {
        let (a, b) = (with.step().unwrap(), without.step().unwrap());
        assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    }
    assert_eq!(with.parameters(), without.parameters());
}
