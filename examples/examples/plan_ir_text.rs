//! Load a model written in Ingot's IR text form, plan it, and hold it to a memory budget.
//!
//! ```text
//! cargo run -p ingot-examples --example plan_ir_text                       # docs/examples/tiny-mlp.ir
//! cargo run -p ingot-examples --example plan_ir_text -- my-model.ir --budget 128KiB
//! ```
//!
//! The file is a forward pass (grammar in `compiler/src/ir/text.rs`) with parameters, inputs
//! `x` and `y`, and a scalar output `loss`; it trains with SGD, lr 0.1. Over the budget the
//! program exits with code 3 and says what is live at the peak, as `ingot plan --budget` does:
//! put it in CI to fail a change that grows the step.

use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::report::parse_size;
use ingot_compiler::snapshot::PlanSnapshot;
use ingot_trainer::session::Device;
use std::path::Path;

/// The example's default model, relative to this crate.
pub const TINY_MLP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/tiny-mlp.ir");

/// Why the example stopped: a bad file or argument (exit code 1) or a plan over budget (3).
#[derive(Debug)]
pub enum Failure {
    Input(String),
    OverBudget(ingot_compiler::snapshot::OverBudget),
}

/// Reads `path`, plans its training step for the CPU, prints the report, and checks the total
/// against `budget` (a size such as `512MiB`, `128KiB` or a byte count) when one is given.
pub fn run(path: &Path, budget: Option<&str>) -> Result<PlanSnapshot, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Input(format!("reading {}: {e}", path.display())))?;
    // The model's name is the file's; a syntax or type error names the line and the token.
    let name = path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy());
    let model = Model::from_ir_text(&name, &text)
        .map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    let compiled = pipeline::compile(&model, &Device::Cpu.options())
        .map_err(|e| Failure::Input(format!("planning {}: {e}", path.display())))?;
    print!("{}", compiled.report.table());

    // The snapshot is the report's deterministic summary; `assert_within` is the budget gate.
    let snapshot = PlanSnapshot::of(&compiled);
    if let Some(budget) = budget {
        let bytes = parse_size(budget).map_err(|e| Failure::Input(format!("--budget: {e}")))?;
        snapshot.assert_within(bytes).map_err(Failure::OverBudget)?;
        println!("fits in the budget of {budget}");
    }
    Ok(snapshot)
}

fn main() {
    // Arguments: an optional path, then an optional `--budget SIZE`.
    let mut path = TINY_MLP.to_string();
    let mut budget = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--budget" => budget = args.next(),
            _ => path = arg,
        }
    }
    match run(Path::new(&path), budget.as_deref()) {
        Ok(_) => {}
        Err(Failure::Input(msg)) => {
            eprintln!("plan_ir_text: {msg}");
            std::process::exit(1);
        }
        Err(Failure::OverBudget(msg)) => {
            eprintln!("plan_ir_text: {msg}");
            std::process::exit(3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_mlp_plans_within_a_generous_budget() {
        let snap = run(Path::new(TINY_MLP), Some("128KiB")).unwrap();
        assert_eq!(snap.model, "tiny-mlp");
        assert!(snap.total_bytes > 0 && snap.total_bytes <= 128 << 10);
    }

    #[test]
    fn a_budget_below_the_total_is_refused_naming_both() {
        let total = run(Path::new(TINY_MLP), None).unwrap().total_bytes;
        match run(Path::new(TINY_MLP), Some(&(total - 1).to_string())) {
            Err(Failure::OverBudget(msg)) => {
                let msg = msg.to_string();
                assert!(msg.contains(&format!("({total} bytes)")), "{msg}");
                assert!(msg.contains(&format!("({} bytes)", total - 1)), "{msg}");
            }
            other => panic!("expected OverBudget, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        match run(Path::new("no/such/model.ir"), None) {
            Err(Failure::Input(msg)) => assert!(msg.contains("no/such/model.ir"), "{msg}"),
            other => panic!("expected Input, got {other:?}"),
        }
    }
}
