//! The step-executable format (compiler::exe): a compiled step round-trips through its bytes
//! unchanged, the same step always gives the same bytes, and no damage to a file, random or
//! targeted, makes the reader panic or accept a plan the validator rejects.

use ingot_compiler::exe::{self, Executable, Problem, Target, HEADER_BYTES, VERSION};
use ingot_compiler::ir::text;
use ingot_compiler::pipeline::Compiled;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::session::Device;
use proptest::prelude::*;
use std::sync::OnceLock;

const TINY_GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";
/// Small enough that the fuzzer reads it hundreds of times in well under a second.
const FUZZ_GPT: &str = "gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2";

fn compiled(model: &str) -> Compiled {
    ingot_models::compile_model(model, &Device::Cpu.options()).unwrap()
}

/// The file of the small GPT's CPU step, made once.
fn fuzz_file() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        compiled(FUZZ_GPT)
            .executable(Target::Cpu)
            .unwrap()
            .to_bytes()
            .unwrap()
    })
}

use ingot_ir_tests::exe_file::sealed;

/// The payload as JSON, edited by `edit`, sealed again.
fn edited(file: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&file[HEADER_BYTES..]).unwrap();
    edit(&mut v);
    sealed(&serde_json::to_vec(&v).unwrap())
}

#[test]
fn a_compiled_step_round_trips_through_its_bytes() {
    for model in ["mlp", TINY_GPT] {
        let c = compiled(model);
        let e = c.executable(Target::Cpu).unwrap();
        assert_eq!(
            e.layouts().len(),
            c.graph
                .ids()
                .filter(|&id| c.graph.node(id).op.is_leaf())
                .count()
        );
        let bytes = e.to_bytes().unwrap();
        assert_eq!(&bytes[..8], b"INGOTEXE");
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            VERSION
        );
        let back = Executable::from_bytes(&bytes, "x.ingot").unwrap();
        assert!(back == e, "{model}: the executable read back differs");
        assert!(
            back.graph() == &c.graph && back.plan() == &c.plan,
            "{model}"
        );
        assert!(
            back.to_bytes().unwrap() == bytes,
            "{model}: writing again differs"
        );
    }
}

#[test]
fn a_fused_step_graph_round_trips_through_text_with_its_constants_bit_exact() {
    // A fused kernel keeps -f32::MAX as an f64 constant; JSON numbers must come back bit for
    // bit (serde_json's float_roundtrip), or the graph read back is another graph.
    let g = compiled("gpt-mini").graph;
    let back = text::parse(&text::print(&g)).unwrap();
    assert!(
        back == g,
        "parse(print(g)) differs from the fused gpt-mini step"
    );
}

#[test]
fn the_same_step_gives_the_same_bytes() {
    let a = compiled(TINY_GPT)
        .executable(Target::Cpu)
        .unwrap()
        .to_bytes()
        .unwrap();
    let b = compiled(TINY_GPT)
        .executable(Target::Cpu)
        .unwrap()
        .to_bytes()
        .unwrap();
    assert!(a == b);
}

#[test]
fn each_damage_to_the_envelope_is_named() {
    let good = fuzz_file();
    let problem = |bytes: &[u8]| Executable::from_bytes(bytes, "step.ingot").unwrap_err();
    let e = problem(&good[..good.len() - 1]);
    assert!(matches!(e.problem, Problem::Truncated(_)), "{e}");
    assert!(e.to_string().starts_with("step.ingot: truncated"), "{e}");
    let mut v = good.to_vec();
    // Version 2 (kernel sources only, which the runtime lowered the step again to match) is
    // another format.
    v[8..12].copy_from_slice(&2u32.to_le_bytes());
    let e = problem(&v);
    assert_eq!(
        e.to_string(),
        "step.ingot: it is a step executable of format version 2, but this ingot reads version 4; recompile it with this ingot (`ingot compile --model NAME -o FILE`)"
    );
    let mut v = good.to_vec();
    *v.last_mut().unwrap() ^= 1;
    let e = problem(&v);
    assert!(matches!(e.problem, Problem::Checksum { .. }), "{e}");
    let e = problem(b"{\"model\": \"mlp\"}");
    assert!(matches!(e.problem, Problem::Magic { .. }), "{e}");
    assert!(e.to_string().contains("\"{\\\"model\\\""), "{e}");
}

#[test]
fn a_constant_state_leaf_travels_in_the_file_and_one_that_fits_no_state_leaf_is_refused() {
    let exe = Executable::from_bytes(fuzz_file(), "step.ingot").unwrap();
    assert!(exe.constants().is_empty());
    let state = |i: usize| {
        exe.layouts()
            .iter()
            .filter(|l| l.kind == "state")
            .nth(i)
            .unwrap()
            .clone()
    };
    let (a, b) = (state(1), state(2));
    let value = |l: &exe::Layout, seed: u8| -> Vec<u8> {
        (0..l.bytes)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    };
    let constants = vec![
        exe::Constant {
            name: b.name.clone(),
            bytes: value(&b, 7),
        },
        exe::Constant {
            name: a.name.clone(),
            bytes: value(&a, 1),
        },
    ];
    let with = exe.clone().with_constants(constants.clone()).unwrap();
    let bytes = with.to_bytes().unwrap();
    let back = Executable::from_bytes(&bytes, "step.ingot").unwrap();
    assert!(back == with, "the constants read back differ");
    assert_eq!(back.constants(), &constants[..], "in the order given");
    assert!(back.to_bytes().unwrap() == bytes);

    // What cannot be a constant is refused naming it, when made and when read.
    let param = exe
        .layouts()
        .iter()
        .find(|l| l.kind == "parameter")
        .unwrap();
    let cases = [
        (
            param.name.clone(),
            value(param, 0),
            "names a parameter leaf",
        ),
        ("no.such.leaf".to_string(), vec![0; 4], "names no leaf"),
        (a.name.clone(), value(&a, 0)[1..].to_vec(), "holds"),
    ];
    for (name, bytes, says) in cases {
        let c = exe::Constant {
            name: name.clone(),
            bytes,
        };
        let e = exe.clone().with_constants(vec![c.clone()]).unwrap_err();
        assert!(e.contains(&name) && e.contains(says), "{e}");
        let file = edited(fuzz_file(), |v| {
            v["constants"] = serde_json::json!([{
                "name": c.name,
                "data": base64_of(&c.bytes),
            }]);
        });
        let e = Executable::from_bytes(&file, "step.ingot")
            .unwrap_err()
            .to_string();
        assert!(e.contains("corrupted") && e.contains(says), "{e}");
    }
    let twice = vec![constants[1].clone(), constants[1].clone()];
    let e = exe.clone().with_constants(twice).unwrap_err();
    assert!(e.contains("given twice"), "{e}");
    let file = edited(fuzz_file(), |v| {
        v["constants"] = serde_json::json!([{"name": a.name, "data": "not base64!"}]);
    });
    let e = Executable::from_bytes(&file, "step.ingot")
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not base64"), "{e}");
}

/// RFC 4648 base64 with padding, written here so the test does not read the file with the
/// code it checks.
fn base64_of(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.len();
        let word = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= n {
                out.push(ABC[(word >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn a_plan_that_does_not_fit_its_graph_is_refused_before_anything_runs() {
    let good = fuzz_file();
    let read = |bytes: Vec<u8>| {
        Executable::from_bytes(&bytes, "step.ingot")
            .unwrap_err()
            .to_string()
    };
    // A slab storage moved off the alignment.
    let e = read(edited(good, |v| {
        let offs = v["plan"]["storage_offset"].as_array_mut().unwrap();
        let last = offs.len() - 1;
        offs[last] = (offs[last].as_u64().unwrap() + 8).into();
    }));
    assert_mentions(&e, &["memory plan does not fit", "multiple of 256"]);
    // Two storages live at the same time put on the same bytes (the totals kept): the
    // validator finds a read of bytes that no longer hold its value.
    let e = read(edited(good, |v| {
        let plan = &mut v["plan"];
        let st = plan["liveness"]["storages"].as_array().unwrap().clone();
        let off: Vec<u64> = plan["storage_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_u64().unwrap())
            .collect();
        let n = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap();
        let slab: Vec<usize> = (0..st.len())
            .filter(|&i| st[i]["region"] == "Slab" && n(&st[i], "bytes") > 0)
            .collect();
        let end = |i: usize| off[i] + n(&st[i], "bytes").div_ceil(256) * 256;
        let top = slab.iter().map(|&i| end(i)).max().unwrap();
        let (x, y) = slab
            .iter()
            .flat_map(|&x| slab.iter().map(move |&y| (x, y)))
            .find(|&(x, y)| {
                let (a, b) = (&st[x], &st[y]);
                off[y] < off[x]
                    && n(a, "bytes") <= n(b, "bytes")
                    && n(a, "start") < n(b, "end")
                    && n(b, "start") < n(a, "end")
                    && slab.iter().any(|&z| z != x && end(z) == top)
            })
            .expect("two slab storages live together");
        plan["storage_offset"][x] = off[y].into();
    }));
    assert!(e.contains("invalid memory plan"), "{e}");
    // A table cut short.
    let e = read(edited(good, |v| {
        v["plan"]["liveness"]["storage_of"]
            .as_array_mut()
            .unwrap()
            .pop();
    }));
    assert!(e.contains("storage table has"), "{e}");
    // A graph that does not verify: an operand used before it is defined.
    let e = read(edited(good, |v| {
        let g = v["graph"].as_str().unwrap().replacen("(%0", "(%9999", 1);
        v["graph"] = g.into();
    }));
    assert!(e.contains("step graph does not parse"), "{e}");
    // Layouts that do not say what the plan says.
    let e = read(edited(good, |v| {
        v["layouts"][0]["offset"] = 4096.into();
    }));
    assert!(e.contains("layouts disagree"), "{e}");
    // An unknown field: another format, whatever the header says.
    let e = read(edited(good, |v| {
        v["extra"] = 1.into();
    }));
    assert!(e.contains("unknown field"), "{e}");
}

/// The CUDA program inside an executable's JSON payload.
fn cuda_program(v: &mut serde_json::Value) -> &mut serde_json::Value {
    &mut v["program"]["cuda"]
}

#[test]
fn a_cuda_program_that_cannot_run_is_refused_naming_what_is_wrong() {
    let c =
        ingot_models::compile_model(FUZZ_GPT, &Device::Cuda(Default::default()).options()).unwrap();
    let e = c.executable(Target::Cuda).unwrap();
    let good = e.to_bytes().unwrap();
    assert_eq!(Executable::from_bytes(&good, "s.ingot").unwrap(), e);
    let read = |bytes: Vec<u8>| {
        Executable::from_bytes(&bytes, "s.ingot")
            .unwrap_err()
            .to_string()
    };
    let err = read(edited(good.as_slice(), |v| {
        let p = cuda_program(v);
        p["kernels"][0]["launch"]["block"] = serde_json::json!([64, 32, 1]);
    }));
    assert_mentions(&err, &["1024", "recompile"]);
    let err = read(edited(&good, |v| {
        let p = cuda_program(v);
        p["kernels"][0]["launch"]["grid"] = serde_json::json!([0, 1, 1]);
    }));
    assert!(err.contains("launch shape"), "{err}");
    // An operation that no longer waits for what it reads.
    let err = read(edited(&good, |v| {
        let p = cuda_program(v);
        let deps = p["deps"].as_array_mut().unwrap();
        let j = deps
            .iter()
            .position(|d| !d.as_array().unwrap().is_empty())
            .unwrap();
        deps[j] = serde_json::json!([]);
    }));
    assert!(err.contains("does not wait"), "{err}");
    // A memset past the end of the allocation.
    let err = read(edited(&good, |v| {
        let p = cuda_program(v);
        let total = p["total_bytes"].as_u64().unwrap();
        let ops = p["ops"].as_array_mut().unwrap();
        ops.push(serde_json::json!({"zero": {"offset": total, "bytes": 256}}));
        p["touches"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"reads": [], "writes": []}));
        p["deps"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!([]));
    }));
    assert!(err.contains("outside"), "{err}");
    // A CPU program in a CUDA executable.
    let err = read(edited(&good, |v| {
        v["program"] = serde_json::json!({"cpu": {"instrs": [], "copies": []}});
    }));
    assert!(
        err.contains("cuda executable holding a cpu program"),
        "{err}"
    );
}

/// Reads `bytes`; whatever it accepts must hold a plan the validator accepts for its graph.
fn read_never_panics(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(e) = Executable::from_bytes(bytes, "fuzz.ingot") {
        prop_assert!(e.plan().validate(e.graph()).is_ok());
        prop_assert!(e.program().check(e.graph(), e.plan()).is_ok());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_bytes_are_refused_without_a_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        magic in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if magic {
            let mut f = exe::MAGIC.to_vec();
            f.extend_from_slice(&bytes);
            bytes = f;
        }
        prop_assert!(Executable::from_bytes(&bytes, "fuzz.ingot").is_err());
    }

    #[test]
    fn a_truncated_file_is_refused_without_a_panic(cut in 0usize..usize::MAX) {
        let good = fuzz_file();
        let cut = cut % good.len();
        let e = Executable::from_bytes(&good[..cut], "fuzz.ingot").unwrap_err();
        prop_assert!(e.to_string().starts_with("fuzz.ingot: "), "{}", e);
    }

    #[test]
    fn flipped_bytes_are_refused_without_a_panic(
        flips in prop::collection::vec((any::<usize>(), 1u8..=255), 1..4),
    ) {
        let mut bytes = fuzz_file().to_vec();
        // Distinct positions, so no flip undoes another.
        let mut at: Vec<usize> = flips.iter().map(|&(i, _)| i % bytes.len()).collect();
        at.sort();
        at.dedup();
        for (&i, &(_, x)) in at.iter().zip(&flips) {
            bytes[i] ^= x;
        }
        prop_assert!(Executable::from_bytes(&bytes, "fuzz.ingot").is_err());
    }

    /// Damage the checksum cannot see: the payload's digits changed and the header made right
    /// for it, so the JSON parser, the graph parser, the plan's table checks and the validator
    /// all meet it.
    #[test]
    fn a_resealed_payload_with_changed_digits_never_panics(
        edits in prop::collection::vec((any::<usize>(), 0u8..10), 1..6),
    ) {
        let payload = &fuzz_file()[HEADER_BYTES..];
        let digits: Vec<usize> = (0..payload.len()).filter(|&i| payload[i].is_ascii_digit()).collect();
        let mut p = payload.to_vec();
        for (i, d) in edits {
            p[digits[i % digits.len()]] = b'0' + d;
        }
        read_never_panics(&sealed(&p))?;
    }

    #[test]
    fn a_resealed_payload_with_changed_bytes_never_panics(
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut p = fuzz_file()[HEADER_BYTES..].to_vec();
        for (i, b) in edits {
            let n = p.len();
            p[i % n] = b;
        }
        read_never_panics(&sealed(&p))?;
    }
}

/// The offload copies' records are one declaration shared by the CPU and CUDA programs
/// (`lower::CopyIn`, `lower::CopyOut`); in a step file each stays the object it always was,
/// named by the instruction, its four fields in order, and an unknown field is refused.
#[test]
fn an_offload_copy_keeps_its_step_file_form_in_both_programs() {
    use ingot_compiler::ir::NodeId;
    use ingot_compiler::lower::cpu::Instr;
    use ingot_compiler::lower::cuda::DeviceOp;
    use ingot_compiler::lower::{CopyIn, CopyOut};
    let copy_in = CopyIn {
        leaf: NodeId(7),
        host: 256,
        to: 4096,
        bytes: 512,
    };
    let copy_out = CopyOut {
        leaf: NodeId(7),
        from: 4096,
        host: 256,
        bytes: 512,
    };
    let want_in = r#"{"copy_in":{"leaf":7,"host":256,"to":4096,"bytes":512}}"#;
    let want_out = r#"{"copy_out":{"leaf":7,"from":4096,"host":256,"bytes":512}}"#;
    let cpu = [Instr::CopyIn(copy_in), Instr::CopyOut(copy_out)];
    let cuda = [DeviceOp::CopyIn(copy_in), DeviceOp::CopyOut(copy_out)];
    for (i, want) in [want_in, want_out].into_iter().enumerate() {
        assert_eq!(serde_json::to_string(&cpu[i]).unwrap(), want);
        assert_eq!(serde_json::to_string(&cuda[i]).unwrap(), want);
    }
    assert_eq!(
        serde_json::from_str::<Instr>(want_in).unwrap(),
        Instr::CopyIn(copy_in)
    );
    assert_eq!(
        serde_json::from_str::<DeviceOp>(want_out).unwrap(),
        DeviceOp::CopyOut(copy_out)
    );
    let extra = r#"{"copy_in":{"leaf":7,"host":256,"to":4096,"bytes":512,"stream":1}}"#;
    let e = serde_json::from_str::<DeviceOp>(extra).unwrap_err();
    assert!(e.to_string().contains("stream"), "{e}");
    assert!(serde_json::from_str::<Instr>(extra).is_err());
}

#[test]
fn a_step_s_model_flops_travel_in_its_report_and_a_count_above_its_products_is_refused() {
    // Every candidate recomputed: the graph runs more products than the model's, and the one
    // read back from the file has no provenance to say which are copies.
    let model = ingot_models::by_name(TINY_GPT).unwrap();
    let opts = Device::Cpu.options();
    let r = ingot_compiler::pipeline::rewritten(&model, &Default::default(), &opts).unwrap();
    let heavy: Vec<_> = ingot_compiler::fit::ordered_candidates(&r)
        .unwrap()
        .iter()
        .map(|c| c.node)
        .collect();
    let want =
        ingot_compiler::flops::model(&ingot_compiler::pipeline::finish(&r, &[]).unwrap().graph);
    let c = ingot_compiler::pipeline::finish(&r, &heavy).unwrap();
    assert_eq!(c.report.model_flops, Some(want));
    let bytes = c.executable(Target::Cpu).unwrap().to_bytes().unwrap();
    let back = Executable::from_bytes(&bytes, "r.ingot").unwrap();
    assert_eq!(back.report().model_flops, Some(want), "read back");
    let counted = ingot_compiler::flops::model(back.graph());
    assert!(counted > want, "the file's graph: {counted} against {want}");
    // A count no larger than the graph's products reads; a larger one is refused.
    let at_most = edited(&bytes, |v| v["report"]["model_flops"] = counted.into());
    assert!(Executable::from_bytes(&at_most, "r.ingot").is_ok());
    let over = edited(&bytes, |v| {
        v["report"]["model_flops"] = (counted + 1).into()
    });
    let err = Executable::from_bytes(&over, "r.ingot").unwrap_err();
    assert_mentions(&err.to_string(), &["model_flops", &counted.to_string()]);
    // A file written before the report kept the count reads without one.
    let before = edited(&bytes, |v| {
        v["report"].as_object_mut().unwrap().remove("model_flops");
    });
    let old = Executable::from_bytes(&before, "r.ingot").unwrap();
    assert_eq!(old.report().model_flops, None);
}
