//! The `ingot plan` and `ingot dsa` commands, run as a user would.

#[path = "support/cli.rs"]
mod cli;
use cli::{exit_stderr, run as ingot};
use ingot_testkit::text::assert_mentions;

#[test]
fn plan_json_is_a_versioned_document_with_the_totals() {
    let (code, out, err) = ingot(&["plan", "--model", "mlp", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("plan --json prints JSON");
    assert_eq!(doc["version"], 2);
    // Buffers are named by provenance, kinds spelled as everywhere else.
    let peak = &doc["peak_buffers"][0];
    let prov = peak["provenance"].as_str().unwrap();
    assert!(
        prov.starts_with("fc") && prov.ends_with(" (backward)"),
        "{peak}"
    );
    assert_eq!(peak["kind"], "gradient");
    assert_eq!(doc["peak_provenance"], prov);
    let total = doc["total_bytes"].as_u64().unwrap();
    let resident = doc["resident_bytes"].as_u64().unwrap();
    let slab = doc["slab_bytes"].as_u64().unwrap();
    let lower = doc["lower_bound_bytes"].as_u64().unwrap();
    assert!(resident > 0 && slab >= lower && lower > 0);
    assert_eq!(total, resident.div_ceil(256) * 256 + slab);
}

#[test]
fn a_budget_the_plan_exceeds_exits_3_and_lists_what_holds_the_peak() {
    // Over the resident state (7.88 MiB), under anything fitting reaches.
    let err = exit_stderr(ingot(&["plan", "--model", "mlp", "--budget", "8MiB"]), 3);
    assert_mentions(
        &err,
        &[
            "over the budget",
            "At the peak",
            " (backward) (%",
            " matmul) f32[1024,",
        ],
    );
    exit_stderr(ingot(&["plan", "--model", "mlp", "--budget", "1GiB"]), 0);
}

#[test]
fn a_malformed_budget_or_model_is_a_clear_error() {
    let err = exit_stderr(
        ingot(&["plan", "--model", "mlp", "--budget", "12 parsecs"]),
        2,
    );
    assert!(err.contains("unknown unit"), "{err}");
    let err = exit_stderr(ingot(&["plan", "--model", "resnet"]), 1);
    assert_mentions(&err, &["resnet", "mlp"]);
}

#[test]
fn dsa_writes_offsets_and_fails_on_a_capacity_it_cannot_meet() {
    let dir = cli::scratch("cli-plan-tests", "dsa");
    let input = dir.join("p.csv");
    let output = dir.join("s.csv");
    // Three buffers: two overlap in time, the third reuses the first's space.
    std::fs::write(
        &input,
        "id,lower,upper,size\n0,0,2,100\n1,1,3,50\n2,2,4,100\n",
    )
    .unwrap();
    let dsa = [
        "dsa",
        "--input",
        cli::s(&input),
        "--output",
        cli::s(&output),
    ];
    exit_stderr(ingot(&dsa), 0);
    let text = std::fs::read_to_string(&output).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), "id,lower,upper,size,offset");
    let rows: Vec<Vec<u64>> = lines
        .map(|l| l.split(',').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 3);
    let peak = rows.iter().map(|r| r[4] + r[3]).max().unwrap();
    assert_eq!(peak, 150, "LOAD is 150 and reachable");
    let over = ["--capacity", "120", "--time-limit", "0.5"];
    exit_stderr(ingot(&[&dsa[..], &over].concat()), 3);
    std::fs::write(&input, "id,lower,upper,size\n0,5,2,100\n").unwrap();
    let err = exit_stderr(ingot(&dsa), 1);
    assert!(err.contains("line 2"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_writes_the_html_page_and_the_svg() {
    let dir = cli::scratch("cli-plan-tests", "picture");
    let html = dir.join("plan.html");
    let svg = dir.join("plan.svg");
    let (code, out, err) = ingot(&[
        "plan",
        "--model",
        "mlp",
        "--html",
        html.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("memory plan for mlp"), "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<canvas id=\"curve\""));
    assert!(page.contains("id=\"plan-data\"") && !page.contains("src="));
    assert!(page.contains("memory plan for mlp") && !page.contains("https://"));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("<svg xmlns=") && picture.contains("<rect class=\"buf "));
    assert!(picture.trim_end().ends_with("</svg>"));
    let err = exit_stderr(
        ingot(&[
            "plan",
            "--model",
            "mlp",
            "--svg",
            dir.join("no/such/dir/p.svg").to_str().unwrap(),
        ]),
        1,
    );
    assert!(err.contains("cannot write"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_diff_exits_0_for_equal_plans_1_for_different_ones_and_2_for_a_bad_file() {
    let dir = cli::scratch("cli-plan-tests", "diff");
    let write = |name: &str, model: &str| {
        let (code, out, err) = ingot(&["plan", "--model", model, "--json"]);
        assert_eq!(code, 0, "{err}");
        let path = dir.join(name);
        std::fs::write(&path, out).unwrap();
        path.to_str().unwrap().to_string()
    };
    let small = write(
        "small.json",
        "gpt:vocab=64,d_model=32,layers=1,heads=4,d_ff=64,seq=8,batch=2",
    );
    let big = write(
        "big.json",
        "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2",
    );
    let (code, out, err) = ingot(&["plan", "--diff", &small, &small]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no differences"), "{out}");
    let (code, out, err) = ingot(&["plan", "--diff", &small, &big]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the plans differ"), "{err}");
    assert!(
        out.contains("buffers that appeared") && out.contains("blocks.1.qkv.weight"),
        "keyed by provenance: {out}"
    );
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"version\": 1}").unwrap();
    let err = exit_stderr(ingot(&["plan", "--diff", bad.to_str().unwrap(), &big]), 2);
    assert!(err.contains("version 1"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A small GPT whose batch `--max-batch` varies.
fn small_gpt(batch: usize) -> String {
    format!("gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=64,batch={batch}")
}

#[test]
fn the_largest_batch_found_fits_the_budget_and_the_next_one_does_not() {
    let (code, out, err) = ingot(&[
        "plan",
        "--model",
        &small_gpt(8),
        "--budget",
        "64MiB",
        "--max-batch",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let rows = doc["max_batch"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        3,
        "with budget recomputation, cheap recomputation, none"
    );
    for row in rows {
        let n = row["max_batch"].as_u64().unwrap() as usize;
        assert_eq!(row["next_batch"].as_u64().unwrap() as usize, n + 1);
        if row["recompute"] == "cheap" {
            // The plan at that batch, made the ordinary way, fits; one more sample does not.
            // (`--accumulate 1`: the budget only checks, it does not fit by accumulating.)
            let gate = |b: usize| {
                ingot(&[
                    "plan",
                    "--model",
                    &small_gpt(b),
                    "--budget",
                    "64MiB",
                    "--accumulate",
                    "1",
                ])
            };
            let (fits, _, e) = gate(n);
            assert_eq!(fits, 0, "batch {n}: {e}");
            let (over, _, e) = gate(n + 1);
            assert_eq!(over, 3, "batch {}: {e}", n + 1);
        }
    }
    // Recomputing more for the backward pass never fits a smaller batch.
    assert!(
        rows[0]["max_batch"].as_u64() >= rows[1]["max_batch"].as_u64()
            && rows[1]["max_batch"].as_u64() >= rows[2]["max_batch"].as_u64(),
        "{doc}"
    );
}

#[test]
fn max_batch_needs_a_budget_a_named_model_and_a_budget_batch_1_fits() {
    let err = exit_stderr(ingot(&["plan", "--model", "mlp", "--max-batch"]), 2);
    assert!(err.contains("--budget"), "{err}");
    let err = exit_stderr(
        ingot(&[
            "plan",
            "--model-file",
            "../docs/examples/tiny-mlp.ir",
            "--budget",
            "1GiB",
            "--max-batch",
        ]),
        2,
    );
    assert!(err.contains("--model NAME"), "{err}");
    let err = exit_stderr(
        ingot(&["plan", "--model", "mlp", "--budget", "1KiB", "--max-batch"]),
        3,
    );
    assert_mentions(&err, &["batch 1 alone needs", "resident"]);
}

/// The plan's total of `args` (`ingot plan ... --json`).
fn planned_total(args: &[&str]) -> (i32, serde_json::Value) {
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, out, err) = ingot(&all);
    if code != 0 {
        return (code, serde_json::Value::String(err));
    }
    (code, serde_json::from_str(out.trim()).unwrap())
}

#[test]
fn a_budget_under_what_recomputation_reaches_is_met_by_accumulating_the_fewest_micro_batches_that_fit(
) {
    let spec = small_gpt(16);
    let (_, whole) = planned_total(&["--model", &spec]);
    let whole = whole["total_bytes"].as_u64().unwrap();
    // Two micro-batches' plan: under what recomputation alone reaches for this model.
    let (_, two) = planned_total(&["--model", &spec, "--accumulate", "2"]);
    let budget = two["total_bytes"].as_u64().unwrap().to_string();
    let (code, doc) = planned_total(&["--model", &spec, "--budget", &budget]);
    assert_eq!(code, 0, "{doc}");
    let k = doc["fitted"]["accumulate"].as_u64().unwrap();
    let total = doc["total_bytes"].as_u64().unwrap();
    // Recomputation within a third more FLOPs is taken before more micro-batches.
    assert!(
        (k >= 2 && 16 % k == 0) || doc["fitted"].get("recompute").is_some(),
        "{doc}"
    );
    assert_eq!(doc["fitted"]["micro_batch"].as_u64().unwrap() * k, 16);
    assert_eq!(doc["fitted"]["unfitted_bytes"].as_u64().unwrap(), whole);
    assert!(total < whole, "{total} over the budget");
    // The fewest: every smaller number of micro-batches is over the budget.
    for fewer in (2..k).filter(|f| 16 % f == 0) {
        let (code, _) = planned_total(&[
            "--model",
            &spec,
            "--budget",
            &budget,
            "--accumulate",
            &fewer.to_string(),
        ]);
        assert_eq!(code, 3, "{fewer} micro-batches fit too");
    }
    // The same budget with the accumulation fixed is a gate again.
    let (code, err) = planned_total(&["--model", &spec, "--budget", &budget, "--accumulate", "1"]);
    assert_eq!(code, 3, "{err}");
}

#[test]
fn a_budget_under_the_resident_state_is_refused_naming_it() {
    let (code, err) = planned_total(&["--model", &small_gpt(4), "--budget", "1KiB"]);
    assert_eq!(code, 3);
    let err = err.as_str().unwrap_or_default().to_string();
    assert_mentions(
        &err,
        &["resident state", "(parameters, optimizer state, inputs)"],
    );
    assert!(err.contains("resident state"), "{err}");
    // A model file is refused the same way.
    let (code, err) = planned_total(&[
        "--model-file",
        "../docs/examples/tiny-mlp.ir",
        "--budget",
        "1KiB",
    ]);
    assert_eq!(code, 3);
    assert!(
        err.as_str().unwrap_or_default().contains("resident state"),
        "{err}"
    );
}

#[test]
fn train_under_a_budget_runs_the_fitted_step_and_says_so() {
    let spec = small_gpt(8);
    let (_, whole) = planned_total(&["--model", &spec]);
    let budget = (whole["total_bytes"].as_u64().unwrap() - 1).to_string();
    let (code, out, err) = ingot(&[
        "train", "--model", &spec, "--budget", &budget, "--steps", "3", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let fitted = lines
        .iter()
        .find_map(|l| l.get("fitted"))
        .expect("a fitted line");
    assert!(
        fitted["accumulate"].as_u64().unwrap() >= 2 || fitted.get("recompute").is_some(),
        "{fitted}"
    );
    let losses: Vec<f64> = lines.iter().filter_map(|l| l["loss"].as_f64()).collect();
    assert_eq!(losses.len(), 3);
    // The same steps accumulated explicitly (the same compiled step): the same losses.
    let k = fitted["accumulate"].as_u64().unwrap().to_string();
    let (code, out2, err) = ingot(&[
        "train",
        "--model",
        &spec,
        "--accumulate",
        &k,
        "--steps",
        "3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let again: Vec<f64> = out2
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| l["loss"].as_f64())
        .collect();
    assert_eq!(losses, again);
}

#[test]
fn chunk_loss_head_plans_gpt2_in_less_memory_and_a_small_model_as_before() {
    let total = |args: &[&str]| -> u64 {
        let (code, out, err) = ingot(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let doc: serde_json::Value = serde_json::from_str(&out).expect("plan --json prints JSON");
        doc["total_bytes"].as_u64().unwrap()
    };
    let gpt2 = [
        "plan",
        "--model",
        "gpt2",
        "--device",
        "cuda",
        "--precision",
        "bf16",
        "--json",
    ];
    let whole = total(&gpt2);
    let chunked = total(&[&gpt2[..], &["--chunk-loss-head"]].concat());
    // Eight blocks of bf16[1024, 50304] logits instead of one of [8192, 50304] (786 MiB).
    assert!(
        chunked + (400 << 20) < whole,
        "gpt2 bf16: {chunked} bytes in chunks, {whole} whole"
    );
    // mlp's head is far under the chunk size: nothing changes.
    let mlp = ["plan", "--model", "mlp", "--json"];
    assert_eq!(
        total(&mlp),
        total(&[&mlp[..], &["--chunk-loss-head"]].concat())
    );
}

/// A ResNet small enough to plan in a test, at CIFAR-10's side: its `layer4` is 1×1, so its
/// batch norms need a batch of at least 2 (as `resnet18`'s do).
const SMALL_RESNET: &str = "resnet:depth=18,side=32,width=8,classes=10";

/// The largest batch of the default plan (`--max-batch`'s "cheap" row) within `budget`.
fn cheap_max_batch(model: &str, budget: &str) -> u64 {
    let (code, out, err) = ingot(&[
        "plan",
        "--model",
        model,
        "--budget",
        budget,
        "--max-batch",
        "--json",
    ]);
    assert_eq!(code, 0, "{model}: {err}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let rows = doc["max_batch"].as_array().unwrap();
    let cheap = rows.iter().find(|r| r["recompute"] == "cheap").unwrap();
    cheap["max_batch"].as_u64().unwrap()
}

/// `--max-batch` on a ResNet starts at its smallest batch, 2 (it used to plan batch 1 and fail
/// with "batch must be at least 2"); on `cnn` it reports a batch that `--batch` (or
/// `cnn:batch=N`) then builds: that batch's plan fits the budget and the next one's does not
/// (it used to report a batch nothing could build, `cnn` taking no batch).
#[test]
fn max_batch_reports_a_batch_the_model_then_takes_from_the_models_smallest_batch_up() {
    for (model, spec_of) in [
        (SMALL_RESNET, None),
        ("cnn", Some(|b: u64| format!("cnn:batch={b}"))),
    ] {
        // The budget: what batch 6 needs, so the largest batch is at least 6.
        let (code, doc) = planned_total(&["--model", model, "--batch", "6"]);
        assert_eq!(code, 0, "{doc}");
        let budget = doc["total_bytes"].as_u64().unwrap().to_string();
        let n = cheap_max_batch(model, &budget);
        assert!(n >= 6, "{model}: {n}");
        let gate = |b: u64| {
            let b = b.to_string();
            ingot(&[
                "plan",
                "--model",
                model,
                "--batch",
                &b,
                "--budget",
                &budget,
                "--accumulate",
                "1",
            ])
        };
        let (fits, _, e) = gate(n);
        assert_eq!(fits, 0, "{model} at batch {n}: {e}");
        let (over, _, e) = gate(n + 1);
        assert_eq!(over, 3, "{model} at batch {}: {e}", n + 1);
        if let Some(spec) = spec_of {
            let (code, doc) = planned_total(&["--model", &spec(n)]);
            assert_eq!(code, 0, "{doc}");
            assert!(doc["total_bytes"].as_u64().unwrap() <= budget.parse().unwrap());
        }
    }
    // Under batch 2's plan nothing fits, and the error names batch 2.
    let err = exit_stderr(
        ingot(&[
            "plan",
            "--model",
            SMALL_RESNET,
            "--budget",
            "1KiB",
            "--max-batch",
        ]),
        3,
    );
    assert!(err.contains("batch 2 alone needs"), "{err}");
}

/// A budget over a ResNet's resident state but under anything accumulation can reach exits 3
/// naming the smallest plan (it used to exit 1, building a micro-batch of one image that the
/// batch norms refuse, after planning every number of micro-batches).
#[test]
fn a_budget_no_micro_batch_of_a_resnet_meets_exits_3() {
    let (code, doc) = planned_total(&["--model", SMALL_RESNET]);
    assert_eq!(code, 0, "{doc}");
    let resident = doc["resident_bytes"].as_u64().unwrap();
    let budget = (resident + 4096).to_string();
    let err = exit_stderr(
        ingot(&["plan", "--model", SMALL_RESNET, "--budget", &budget]),
        3,
    );
    assert_mentions(&err, &["it does not fit", "micro-batches"]);
}

/// `--batch` builds any named model at that batch; beside a spec that writes another batch it
/// is refused naming both, and beside a model file it is refused.
#[test]
fn batch_builds_any_named_model_and_a_contradicting_spec_batch_is_refused() {
    for model in ["mlp", "gpt-mini", "cnn"] {
        let (code, small) = planned_total(&["--model", model, "--batch", "2"]);
        assert_eq!(code, 0, "{model}: {small}");
        let (code, own) = planned_total(&["--model", model]);
        assert_eq!(code, 0, "{model}: {own}");
        let total = |d: &serde_json::Value| d["total_bytes"].as_u64().unwrap();
        assert!(total(&small) < total(&own), "{model} at batch 2: {small}");
    }
    let (code, a) = planned_total(&["--model", "cnn", "--batch", "4"]);
    let (code2, b) = planned_total(&["--model", "cnn:batch=4"]);
    assert_eq!((code, code2), (0, 0));
    assert_eq!(
        a["total_bytes"], b["total_bytes"],
        "one model by two spellings"
    );
    let err = exit_stderr(
        ingot(&["plan", "--model", "cnn:batch=64", "--batch", "32"]),
        2,
    );
    assert_mentions(&err, &["--batch 32", "batch=64"]);
    let err = exit_stderr(
        ingot(&[
            "plan",
            "--model-file",
            "../docs/examples/tiny-mlp.ir",
            "--batch",
            "2",
        ]),
        2,
    );
    assert_mentions(&err, &["--batch", "model file"]);
}

/// `plan` of `model` at a budget one byte under its resident bytes, which only offload meets:
/// the budget, and the plan's report, which says what is offloaded.
fn offloaded_one_byte_under_resident(model: &[&str]) -> (String, String) {
    let (code, whole) = planned_total(model);
    assert_eq!(code, 0, "{whole}");
    let budget = (whole["resident_bytes"].as_u64().unwrap() - 1).to_string();
    let mut args = vec!["plan"];
    args.extend(model);
    args.extend(["--budget", budget.as_str()]);
    let (code, out, err) = ingot(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("offloaded:"), "{out}");
    (budget, out)
}

#[test]
fn a_cuda_budget_only_offload_meets_is_planned_and_compiled_to_a_program_that_copies_the_moments() {
    // Under the resident bytes only offload fits (recomputation and micro-batches do not lower
    // them); the CUDA executor runs offload's copies, so `compile` for CUDA meets the budget
    // by offload, as `plan` reports, and the program it writes copies each offloaded moment in
    // and out between the plan's host region and the allocation.
    // A GPT whose AdamW moments (233 MB) outweigh what the CUDA slab keeps at least (cuBLAS's
    // 32 MiB workspace, a few activations, the largest moments' staging).
    let spec = "gpt:vocab=16384,d_model=512,layers=4,heads=8,d_ff=1024,seq=64,batch=4";
    let mlp = ["--model", spec, "--optimizer", "adamw", "--device", "cuda"];
    let (budget, out) = offloaded_one_byte_under_resident(&mlp);
    assert!(!out.contains("note:"), "{out}");
    let exe = std::env::temp_dir().join(format!("ingot-offload-{}.ingot", std::process::id()));
    let mut args = vec!["compile"];
    args.extend(mlp);
    args.extend(["--budget", budget.as_str(), "-o", exe.to_str().unwrap()]);
    let (code, out, err) = ingot(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("offloaded:"), "{out}");
    let read = ingot_compiler::exe::Executable::read(&exe).unwrap();
    let (code, shown, err) = ingot(&["inspect", exe.to_str().unwrap()]);
    let _ = std::fs::remove_file(&exe);
    assert_eq!(code, 0, "{err}");
    let copies = format!("{} offload copies", 2 * read.plan().offload.len());
    assert!(shown.contains(&copies), "{shown}");
    let plan = read.plan();
    assert!(plan.total_bytes <= budget.parse().unwrap());
    assert!(!plan.offload.is_empty() && plan.host_bytes > 0);
    let p = ingot_testkit::programs::cuda_program(&read);
    assert_eq!(p.host_bytes, plan.host_bytes);
    assert_eq!(p.counts().offload_copies, 2 * plan.offload.len());
}

#[test]
fn a_cuda_budget_only_offload_meets_is_refused_for_several_ranks_by_exit_3_and_plan_says_why() {
    // Offload on CUDA runs on one GPU: for a step of two ranks `compile` leaves it out and
    // refuses the budget like any other it cannot meet; `plan` reports the fit with a note.
    let spec = "gpt:vocab=16384,d_model=512,layers=4,heads=8,d_ff=1024,seq=64,batch=4";
    let gpt = [
        "--model",
        spec,
        "--optimizer",
        "adamw",
        "--device",
        "cuda",
        "--ranks",
        "2",
    ];
    let (budget, out) = offloaded_one_byte_under_resident(&gpt);
    assert!(
        out.contains("note: a step of 2 GPU ranks does not run offload's copies"),
        "{out}"
    );
    let exe = std::env::temp_dir().join(format!("ingot-offload-2-{}.ingot", std::process::id()));
    let mut args = vec!["compile"];
    args.extend(gpt);
    args.extend(["--budget", budget.as_str(), "-o", exe.to_str().unwrap()]);
    exit_stderr(ingot(&args), 3);
    assert!(!exe.exists(), "nothing written for a budget refused");
}
