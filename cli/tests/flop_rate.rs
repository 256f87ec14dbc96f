//! The step's FLOP rate in the log: each `--json` step line's `tflops` is the step's model
//! FLOPs over its `seconds`, the summary's over the median step, a fraction of the peak only
//! where a peak is known (`--peak-tflops` on the CPU), and the run report says the same.

#[path = "support/cli.rs"]
mod cli;
use cli::{ingot, json_lines, ok, run, s};

/// A GPT small enough to train in a moment.
const GPT: &str = "gpt:vocab=32,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2";

/// The GPT's model FLOPs counted by hand, as nanoGPT counts them: 6 per weight and token for
/// the weight matrices (qkv 3·16·16, proj 16·16, fc and fc2 2·16·32, head 32·16), and the
/// causal attention's 2·T·d per token forward (half of q·kᵀ and p·v), 2.5 times that backward.
const GPT_MODEL_FLOPS: f64 = {
    let tokens = 2.0 * 8.0;
    let weights = 3.0 * 256.0 + 256.0 + 2.0 * 16.0 * 32.0 + 32.0 * 16.0;
    let attention = 2.0 * 8.0 * 16.0 * tokens;
    6.0 * weights * tokens + 3.5 * attention
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs()
}

#[test]
fn each_json_step_s_tflops_is_the_model_flops_over_its_seconds_with_no_fraction_on_the_cpu() {
    let dir = cli::scratch("flop-rate-tests", "json");
    let report = dir.join("run.html");
    let out = ok(&ingot(&[
        "train",
        "--model",
        GPT,
        "--steps",
        "3",
        "--json",
        "--report",
        s(&report),
    ]));
    let lines = json_lines(&out);
    let summary = &lines.last().unwrap()["summary"];
    let flops = summary["model_flops"].as_f64().unwrap();
    assert_eq!(flops, GPT_MODEL_FLOPS, "the step's model FLOPs");
    let steps: Vec<_> = lines.iter().filter(|l| l.get("step").is_some()).collect();
    assert_eq!(steps.len(), 3);
    for l in steps {
        let (t, seconds) = (
            l["tflops"].as_f64().unwrap(),
            l["seconds"].as_f64().unwrap(),
        );
        assert!(close(t * 1e12 * seconds, flops), "{l}");
        assert!(l.get("peak_fraction").is_none(), "no peak on the CPU: {l}");
    }
    let median = summary["median_step_seconds"].as_f64().unwrap();
    let t = summary["tflops"].as_f64().unwrap();
    assert!(close(t * 1e12 * median, flops), "{summary}");
    assert!(
        close(summary["gflops"].as_f64().unwrap(), t * 1e3),
        "{summary}"
    );
    assert!(summary.get("peak_tflops").is_none() && summary.get("peak_fraction").is_none());
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(
        page.contains("<td>model FLOPs per step</td><td>2.6010e5</td>")
            && page.contains("GFLOP/s</td>")
            && !page.contains("% of"),
        "{page}"
    );
}

#[test]
fn a_given_peak_gives_each_step_and_the_summary_their_fraction_of_it() {
    let out = ok(&ingot(&[
        "train",
        "--model",
        GPT,
        "--steps",
        "2",
        "--json",
        "--peak-tflops",
        "0.001",
    ]));
    let lines = json_lines(&out);
    for l in lines.iter().filter(|l| l.get("step").is_some()) {
        let t = l["tflops"].as_f64().unwrap();
        assert!(
            close(l["peak_fraction"].as_f64().unwrap(), t / 0.001),
            "{l}"
        );
    }
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["peak_tflops"].as_f64(), Some(0.001));
    let t = summary["tflops"].as_f64().unwrap();
    assert!(close(summary["peak_fraction"].as_f64().unwrap(), t / 0.001));
}

#[test]
fn the_text_step_lines_and_summary_give_the_cpu_s_rate_in_gflops() {
    let out = ok(&ingot(&["train", "--model", GPT, "--steps", "2"]));
    let steps: Vec<&str> = out.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(steps.len(), 2, "{out}");
    for l in &steps {
        assert!(
            l.ends_with(" GFLOP/s") && !l.contains("% of"),
            "the rate, no fraction: {l}"
        );
    }
    assert!(
        out.contains("GFLOP/s (the step's 2.601e5 model FLOPs, forward and backward products, over the median step)"),
        "{out}"
    );
    let out = ok(&ingot(&[
        "train",
        "--model",
        GPT,
        "--steps",
        "1",
        "--peak-tflops",
        "1",
    ]));
    assert!(out.contains("% of 1 peak)"), "{out}");
}

#[test]
fn a_peak_that_is_not_a_positive_number_is_refused_before_the_run() {
    for bad in ["0", "-3", "inf", "x"] {
        let flag = format!("--peak-tflops={bad}");
        let (code, _, err) = run(&["train", "--model", GPT, "--steps", "1", &flag]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("--peak-tflops"), "{bad}: {err}");
    }
}

/// The `model_flops` of the `--json` summary of `args` run for one step.
fn summary_flops(args: &[&str]) -> f64 {
    let mut all = args.to_vec();
    all.extend(["--steps", "1", "--json"]);
    let lines = json_lines(&ok(&ingot(&all)));
    lines.last().unwrap()["summary"]["model_flops"]
        .as_f64()
        .unwrap()
}

#[test]
fn an_accumulated_step_counts_the_products_of_every_micro_batch() {
    // The same batch of 4 sequences as two micro-batches of 2: twice one micro-batch's products,
    // the whole batch's.
    let whole = "gpt:vocab=32,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=4";
    let flops = summary_flops(&["train", "--model", whole]);
    assert_eq!(flops, 2.0 * GPT_MODEL_FLOPS, "the whole batch");
    let accumulated = summary_flops(&["train", "--model", whole, "--accumulate", "2"]);
    assert_eq!(accumulated, flops, "two micro-batches");
}

#[test]
fn a_step_compiled_to_recompute_counts_as_many_model_flops_run_from_its_file_as_trained() {
    // A budget a tenth under the step's plan: the fitter recomputes attention and matmul
    // outputs for the backward pass, products the model FLOPs leave out; the file's graph
    // cannot tell them from their originals, so the count travels in its report.
    let dir = cli::scratch("flop-rate-tests", "recomputed");
    let gpt = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=16,batch=4";
    let plan: serde_json::Value =
        serde_json::from_str(&ok(&ingot(&["plan", "--model", gpt, "--json"]))).unwrap();
    let total = plan["total_bytes"].as_u64().unwrap();
    let budget = (total / 10 * 9).to_string();
    let exe = dir.join("recomputing.ingot");
    let out = ok(&ingot(&[
        "compile",
        "--model",
        gpt,
        "--budget",
        &budget,
        "-o",
        s(&exe),
    ]));
    assert!(out.contains("recomputing"), "{out}");
    let read = ingot_compiler::exe::Executable::read(&exe).unwrap();
    let kept = read.report().model_flops.unwrap();
    assert!(
        ingot_compiler::flops::model(read.graph()) > kept,
        "the file's graph holds recomputed products"
    );
    let trained = summary_flops(&["train", "--model", gpt]);
    assert_eq!(kept as f64, trained);
    assert_eq!(summary_flops(&["run", s(&exe)]), trained);
}
