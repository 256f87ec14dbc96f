//! Validation: the model's forward pass compiled on its own (the loss of a batch, no backward
//! pass, no update), run over the first batches of a validation set.
//!
//! The eval step has its own allocation today: before each evaluation the training session's
//! parameters are copied into it (a host round trip per evaluation, none per training step).
//! Sharing the training step's resident parameters and overlapping the two transient regions
//! in one allocation (issue 18) is not done yet.

use crate::data::{BatchSource, Order};
use crate::session::{Device, Session};
use ingot_compiler::autodiff::{Phases, Step};
use ingot_compiler::ir::NodeId;
use ingot_compiler::models::Model;
use ingot_compiler::pipeline;
use std::path::Path;

/// A forward-only step over a validation set.
pub struct Evaluator {
    session: Session,
    source: Box<dyn BatchSource>,
    slots: [(NodeId, usize); 2],
    x: Vec<u8>,
    y: Vec<u8>,
    batches: u64,
}

/// The forward pass of `model` alone, as a step with no backward pass and no update.
pub fn forward_step(model: &Model) -> Step {
    let (graph, _) = model.graph.without_dead_code();
    let n = graph.len();
    Step {
        graph,
        phases: Phases {
            forward: 0..n,
            backward: n..n,
            optimizer: n..n,
        },
    }
}

impl Evaluator {
    /// Compiles `model`'s forward pass for `device` and opens `val` (a data set of the same
    /// kind as the training one, read in order). Each evaluation runs the first `batches`
    /// batches (fewer if the set holds fewer).
    pub fn new(
        model: &Model,
        device: Device,
        val: &Path,
        batches: u64,
        seed: u64,
    ) -> Result<Evaluator, String> {
        let name = format!("{} (eval)", model.name);
        let c = pipeline::compile_step(&name, forward_step(model), &device.options())
            .map_err(|e| format!("compiling the forward-only step of {}: {e}", model.name))?;
        let exe = c
            .executable(device.target())
            .map_err(|e| format!("lowering the forward-only step of {}: {e}", model.name))?;
        let session = Session::from_executable(exe, seed, device).map_err(|e| e.to_string())?;
        let mut source = super::open_dataset(val, session.graph(), Order::Sequential, seed)
            .map_err(|e| format!("--val: {e}"))?;
        source.check_all().map_err(|e| format!("--val: {e}"))?;
        let slots = session.input_slots().map_err(|e| e.to_string())?;
        let batches = batches.min(source.batches_per_epoch());
        Ok(Evaluator {
            x: vec![0; slots[0].1],
            y: vec![0; slots[1].1],
            session,
            source,
            slots,
            batches,
        })
    }

    /// Batches each evaluation runs.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The eval step's planned bytes (its own allocation).
    pub fn planned_bytes(&self) -> usize {
        self.session.exe().plan().total_bytes
    }

    /// The mean loss of `train`'s current parameters over the validation batches (the same
    /// batches every time, so evaluations compare).
    pub fn evaluate(&mut self, train: &Session) -> Result<f64, String> {
        self.session
            .load_parameters(&train.parameters())
            .map_err(|e| format!("evaluating: {e}"))?;
        let mut sum = 0.0;
        for b in 0..self.batches {
            self.source
                .fill(0, b, &mut self.x, &mut self.y)
                .map_err(|e| format!("--val: {e}"))?;
            sum += self
                .session
                .step_on(&self.slots, &self.x, &self.y)
                .map_err(|e| format!("evaluating: {e}"))?
                .loss;
        }
        Ok(sum / self.batches.max(1) as f64)
    }
}
