//! Train a model on the CPU for a few steps, save its weights to safetensors, and load them
//! back into a fresh session.
//!
//! ```text
//! cargo run -p ingot-examples --example train_cpu
//! cargo run -p ingot-examples --example train_cpu -- --save tiny-mlp.safetensors
//! ```
//!
//! The model is docs/examples/tiny-mlp.ir (a two-layer perceptron with a squared-error loss).
//! `Session::new` plans its training step and makes the one allocation of exactly the planned
//! size; each `step()` runs forward, backward and the SGD update in place and allocates nothing.

use ingot_compiler::model::Model;
use ingot_runtime::{io, Tensor};
use ingot_trainer::session::Session;
use std::path::Path;

/// The forward pass, compiled into the program.
const TINY_MLP: &str = include_str!("../../docs/examples/tiny-mlp.ir");

/// What the example reports: the losses of the trained session, and the loss the reloaded
/// session computed for the next step.
pub struct Outcome {
    pub losses: Vec<f64>,
    pub next_loss: f64,
    pub reloaded_loss: f64,
}

/// A batch of 4 rows of 8 features whose targets are two means of the features: something a
/// small MLP learns in a few steps. Your own data goes in the same way (`Session::set_batch`),
/// or from a safetensors file holding `x` and `y` (`io::load` then `Session::set_batch_map`).
fn batch() -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    let y: Vec<f32> = x
        .chunks(8)
        .flat_map(|row| {
            [
                row[..4].iter().sum::<f32>() / 4.0,
                row[4..].iter().sum::<f32>() / 4.0,
            ]
        })
        .collect();
    (Tensor::from_f32([4, 8], x), Tensor::from_f32([4, 2], y))
}

/// Trains `steps` steps, saves the parameters to `weights`, and loads them into a second
/// session started from other random weights.
pub fn run(steps: usize, weights: &Path) -> Result<Outcome, Box<dyn std::error::Error>> {
    let model = Model::from_ir_text("tiny-mlp", TINY_MLP)?;
    let (x, y) = batch();

    // Seed 0 draws the initial parameters (each with the `init=` of its line in the file).
    let mut session = Session::new(&model, 0)?;
    session.set_batch(&x, &y)?;
    let mut losses = Vec::new();
    for step in 1..=steps {
        let r = session.step()?; // the loss before this step's update
        println!(
            "step {step:>3}  loss {:>10.6}  {:.3} ms",
            r.loss,
            r.seconds * 1e3
        );
        losses.push(r.loss);
    }

    // Save: PyTorch's names and layouts (`fc1.weight` [16, 8], ...), so torch's
    // `safetensors.torch.load_file` reads the file as an nn.Module's state_dict.
    io::save(weights, &session.parameters())?;
    println!(
        "saved {} tensors to {}",
        session.parameters().len(),
        weights.display()
    );

    // Load: a new session with other random weights, then the saved ones written over them.
    // Every parameter must be in the file with its exact shape; a missing or mistyped one is
    // an error naming it.
    let mut reloaded = Session::new(&model, 1)?;
    reloaded.load_parameters(&io::load(weights)?)?;
    reloaded.set_batch(&x, &y)?;

    // SGD without momentum has no optimizer state, so the two sessions now step identically.
    let next_loss = session.step()?.loss;
    let reloaded_loss = reloaded.step()?.loss;
    println!("next step: trained session {next_loss:.6}, reloaded session {reloaded_loss:.6}");
    Ok(Outcome {
        losses,
        next_loss,
        reloaded_loss,
    })
}

fn main() {
    // `--save PATH` keeps the weights; by default they go to the system's temporary folder.
    let mut weights = std::env::temp_dir().join("ingot-tiny-mlp.safetensors");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--save", Some(path)) => weights = path.into(),
            _ => {
                eprintln!("usage: train_cpu [--save PATH]");
                std::process::exit(1);
            }
        }
    }
    if let Err(e) = run(20, &weights) {
        eprintln!("train_cpu: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_falls_and_reloaded_weights_give_the_same_next_loss() {
        let path = std::env::temp_dir().join(format!(
            "ingot-train-cpu-{}.safetensors",
            std::process::id()
        ));
        let out = run(20, &path).unwrap();
        let _ = std::fs::remove_file(&path);
        let (first, last) = (out.losses[0], *out.losses.last().unwrap());
        assert!(last < 0.5 * first, "the loss falls: {first} -> {last}");
        assert_eq!(
            out.next_loss.to_bits(),
            out.reloaded_loss.to_bits(),
            "the reloaded weights are the trained ones"
        );
    }
}
