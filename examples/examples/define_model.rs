//! Define a model through the Rust API and print its memory plan before anything runs.
//!
//! ```text
//! cargo run -p ingot-examples --example define_model
//! ```
//!
//! A model is a forward graph (inputs `x` and `y`, one scalar output `loss`) plus the optimizer
//! of its training step. Ingot appends the backward pass and the optimizer's update, then
//! rewrites, fuses, schedules and plans the whole step into one allocation whose size is known
//! here, before a single byte is allocated.

use ingot_compiler::autodiff::Optimizer;
use ingot_compiler::ir::{DType, Graph};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_compiler::trace::nn;
use ingot_trainer::session::Device;

/// A two-layer classifier: x [32, 64] -> 128 -> ReLU -> 10 classes, softmax cross-entropy.
///
/// Parameters take PyTorch's names and layouts (`fc1.weight` is `[out, in]`), so safetensors
/// weights move between Ingot and PyTorch unchanged. A shape mismatch is an `Err` naming the op
/// and the shapes, never a panic.
pub fn my_classifier() -> ingot_compiler::Result<Model> {
    let mut g = Graph::new();
    let x = g.input("x", [32, 64], DType::F32)?; // the batch: 32 rows of 64 features
    let y = g.input("y", [32], DType::I64)?; // one class id per row
    let h = nn::linear(&mut g, "fc1", x, 64, 128, true)?; // fc1.weight [128, 64], fc1.bias [128]
    let h = nn::relu(&mut g, h)?;
    let logits = nn::linear(&mut g, "fc2", h, 128, 10, true)?;
    let loss = nn::softmax_cross_entropy(&mut g, logits, y)?;
    g.set_output("loss", loss)?;
    Ok(Model {
        name: "my-classifier".into(),
        graph: g,
        eval_graph: None, // no batch norm or dropout: evaluation runs `graph`
        optimizer: Optimizer::Sgd { lr: 0.1 },
        precision: Precision::F32, // or Bf16: PyTorch's bf16 autocast policy
    })
}

/// Compiles the classifier's training step for the CPU and returns its plan report as text.
pub fn run() -> Result<String, Box<dyn std::error::Error>> {
    let model = my_classifier()?;
    // Plan with the options of the device the step will run on: the CPU's plan includes its
    // matmul workspace, so the total is exactly what the CPU runtime will allocate.
    let compiled = pipeline::compile(&model, &Device::Cpu.options())?;
    // The report: the one allocation's total, its resident part (parameters, optimizer state,
    // inputs), the slab holding everything else, the lower bound, and what is live at the peak.
    Ok(compiled.report.table())
}

fn main() {
    match run() {
        Ok(table) => print!("{table}"),
        Err(e) => {
            eprintln!("define_model: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_trainer::session::Session;

    #[test]
    fn the_printed_plan_is_what_the_cpu_session_allocates() {
        let table = run().unwrap();
        assert!(
            table.starts_with("memory plan for my-classifier"),
            "{table}"
        );
        let compiled =
            pipeline::compile(&my_classifier().unwrap(), &Device::Cpu.options()).unwrap();
        assert!(
            table.contains(&compiled.report.total_bytes.to_string()),
            "the table names the total in bytes: {table}"
        );
        let session = Session::new(&my_classifier().unwrap(), 0).unwrap();
        assert_eq!(session.exe().allocated_bytes(), compiled.report.total_bytes);
    }
}
