//! The fuzz targets' bounded twins: each fuzz target's body (`ingot_testkit::fuzz`,
//! `ingot_testkit::fuzz`) fed a few hundred random inputs and mutations of valid ones, so that
//! CI runs the same properties the fuzzers search (fuzz/README.md): no panic on any input, and
//! what is accepted round-trips or validates.

use indexmap::IndexMap;
use ingot_compiler::autodiff::training_step;
use ingot_compiler::exe::{Executable, Target, HEADER_BYTES};
use ingot_compiler::ir::text;
use ingot_runtime::{io, Tensor};
use ingot_testkit::fuzz;
use ingot_trainer::session::Device;
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// Issue 14's classifier (a slice of a reshaped matmul output) as IR text: small, and it reaches
/// much of the parser. The same file is a reproducer in random_graphs.rs.
const SMALL_IR: &str = include_str!("models/slice-of-reshaped-matmul.ir");

/// Valid IR texts: the small one, and the training steps of the mlp and a tiny GPT (every op
/// the models use, autodiff's and the optimizer's included).
fn ir_texts() -> &'static [String] {
    static T: OnceLock<Vec<String>> = OnceLock::new();
    T.get_or_init(|| {
        let mut out = vec![SMALL_IR.to_string()];
        for spec in [
            "mlp",
            "gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2",
        ] {
            let m = ingot_models::by_name(spec).unwrap();
            let step = training_step(&m.graph, &m.optimizer).unwrap();
            out.push(text::print(&step.graph));
        }
        out
    })
}

/// A small GPT's CPU executable.
fn exe_file() -> &'static [u8] {
    static F: OnceLock<Vec<u8>> = OnceLock::new();
    F.get_or_init(|| {
        let spec = "gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2";
        let c = ingot_models::compile_model(spec, &Device::Cpu.options()).unwrap();
        c.executable(Target::Cpu).unwrap().to_bytes().unwrap()
    })
}

/// A safetensors file with a tensor of each dtype Ingot reads, a scalar and an empty one.
fn safetensors_file() -> &'static [u8] {
    static F: OnceLock<Vec<u8>> = OnceLock::new();
    F.get_or_init(|| {
        let mut t = IndexMap::new();
        t.insert(
            "w".into(),
            Tensor::from_f32([2, 3], vec![1.0, -2.0, 0.5, 3.0, 0.0, 1e-3]),
        );
        t.insert("d".into(), Tensor::from_f64([2], vec![1.5, f64::NAN]));
        t.insert("i".into(), Tensor::from_i32([3], vec![1, -7, 9]));
        t.insert("l".into(), Tensor::from_i64([], vec![42]));
        t.insert(
            "b".into(),
            Tensor::from_bool([2, 2], vec![true, false, false, true]),
        );
        t.insert("e".into(), Tensor::from_f32([0, 4], vec![]));
        io::to_bytes(&t, Path::new("twin.safetensors")).unwrap()
    })
}

/// One edit of a byte string.
#[derive(Clone, Debug)]
enum Edit {
    Set(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    /// A digit replaced by another (numbers stay numbers: sizes, offsets, node ids).
    Digit(usize, u8),
    /// A line removed, or repeated.
    DropLine(usize),
    RepeatLine(usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), 0u8..10).prop_map(|(i, d)| Edit::Digit(i, d)),
        any::<usize>().prop_map(Edit::DropLine),
        any::<usize>().prop_map(Edit::RepeatLine),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for e in edits {
        let n = b.len();
        if n == 0 {
            break;
        }
        let lines = || -> Vec<(usize, usize)> {
            let mut out = Vec::new();
            let mut s = 0;
            for (i, &c) in b.iter().enumerate() {
                if c == b'\n' {
                    out.push((s, i + 1));
                    s = i + 1;
                }
            }
            if s < b.len() {
                out.push((s, b.len()));
            }
            out
        };
        match *e {
            Edit::Set(i, x) => b[i % n] = x,
            Edit::Insert(i, x) => b.insert(i % (n + 1), x),
            Edit::Delete(i) => {
                b.remove(i % n);
            }
            Edit::Digit(i, d) => {
                let digits: Vec<usize> = (0..n).filter(|&j| b[j].is_ascii_digit()).collect();
                if !digits.is_empty() {
                    b[digits[i % digits.len()]] = b'0' + d;
                }
            }
            Edit::DropLine(i) => {
                let l = lines();
                let (s, t) = l[i % l.len()];
                b.drain(s..t);
            }
            Edit::RepeatLine(i) => {
                let l = lines();
                let (s, t) = l[i % l.len()];
                let line = b[s..t].to_vec();
                b.splice(t..t, line);
            }
            Edit::Truncate(i) => b.truncate(i % n),
        }
    }
    b
}

use ingot_ir_tests::exe_file::sealed;

#[test]
fn the_valid_seeds_pass_every_body_and_are_accepted() {
    for t in ir_texts() {
        assert!(text::parse(t).is_ok());
        fuzz::ir_text(t.as_bytes());
        fuzz::plan_then_validate(t.as_bytes());
    }
    assert!(Executable::from_bytes(exe_file(), "x").is_ok());
    fuzz::executable(exe_file());
    assert_eq!(
        io::from_bytes(safetensors_file(), Path::new("x"))
            .unwrap()
            .len(),
        6
    );
    ingot_testkit::fuzz::safetensors(safetensors_file());
}

/// Found by the `safetensors` fuzzer (issue 53's hour of each target): a file whose tensors lie
/// in another order than the writer's (`fc!.weight` after `fc1.bias`; the writer sorts by
/// name). The reader returns the file's order and the writer its own, so the body compares
/// names as a set and each tensor's bits.
#[test]
fn a_file_whose_tensors_lie_out_of_the_writers_order_round_trips() {
    let bytes = include_bytes!("fuzz_finds/safetensors-data-order.safetensors");
    let read = io::from_bytes(bytes, Path::new("x")).unwrap();
    let written = io::to_bytes(&read, Path::new("x")).unwrap();
    let again = io::from_bytes(&written, Path::new("x")).unwrap();
    let order = |t: &IndexMap<String, Tensor>| t.keys().cloned().collect::<Vec<_>>();
    assert_ne!(
        order(&read),
        order(&again),
        "the file's order is the writer's"
    );
    ingot_testkit::fuzz::safetensors(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_ir_parser_survives_random_and_mutated_text(
        seed in 0usize..3,
        edits in prop::collection::vec(edit(), 1..5),
        junk in prop::collection::vec(any::<u8>(), 0..120),
        random in any::<bool>(),
    ) {
        let bytes = if random {
            let mut b = b"ingot-ir 1\n".to_vec();
            b.extend(junk);
            b
        } else {
            apply(ir_texts()[seed].as_bytes(), &edits)
        };
        fuzz::ir_text(&bytes);
    }

    #[test]
    fn planning_a_mutated_graph_gives_a_valid_plan_or_an_error(
        seed in 0usize..2,
        edits in prop::collection::vec(edit(), 0..4),
    ) {
        // The small graph and the mlp's step (the GPT's takes too long to plan 300 times);
        // few mutations still parse, so the valid graphs below carry most of the planning.
        let bytes = apply(ir_texts()[seed].as_bytes(), &edits);
        fuzz::plan_then_validate(&bytes);
    }
    #[test]
    fn the_executable_reader_survives_random_and_mutated_files(
        edits in prop::collection::vec(edit(), 1..4),
        junk in prop::collection::vec(any::<u8>(), 0..200),
        how in 0u8..3,
    ) {
        let bytes = match how {
            0 => junk,
            // Damage the checksum sees.
            1 => apply(exe_file(), &edits),
            // Damage it does not: the payload edited and sealed again.
            _ => sealed(&apply(&exe_file()[HEADER_BYTES..], &edits)),
        };
        fuzz::executable(&bytes);
    }

    #[test]
    fn the_safetensors_reader_survives_random_and_mutated_files(
        edits in prop::collection::vec(edit(), 1..4),
        junk in prop::collection::vec(any::<u8>(), 0..200),
        random in any::<bool>(),
    ) {
        let bytes = if random {
            // A plausible header length in front of the junk reaches the JSON parser.
            let mut b = (junk.len() as u64).saturating_sub(8).to_le_bytes().to_vec();
            b.extend(junk);
            b
        } else {
            apply(safetensors_file(), &edits)
        };
        ingot_testkit::fuzz::safetensors(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    /// Valid graphs of every small shape, size-1 axes included (batch 1, seq 1, one head of
    /// width 1): the training step of a random tiny GPT, as text, planned and validated.
    #[test]
    fn planning_the_step_of_a_random_tiny_gpt_gives_a_valid_plan(
        vocab in 1usize..20,
        heads in 1usize..3,
        head_dim in 1usize..4,
        layers in 1usize..3,
        d_ff in 1usize..9,
        seq in 1usize..5,
        batch in 1usize..4,
    ) {
        let spec = format!(
            "gpt:vocab={vocab},d_model={},layers={layers},heads={heads},d_ff={d_ff},seq={seq},batch={batch}",
            heads * head_dim
        );
        let Ok(m) = ingot_models::by_name(&spec) else { return Ok(()) };
        let step = training_step(&m.graph, &m.optimizer).unwrap();
        fuzz::plan_then_validate(text::print(&step.graph).as_bytes());
    }
}
