//! Inference: a model's forward pass compiled, planned and loaded on its own, with no backward
//! pass and no update ([`crate::eval::forward_step`]), for `ingot eval`, `ingot predict` and
//! `ingot generate`.
//!
//! Why a step of its own rather than the training step's evaluation partner
//! ([`crate::eval::pair_with_eval`]): a trained model is evaluated or sampled without being
//! trained, so nothing of the training step (its gradients, optimizer state, slab) needs to be
//! compiled or allocated. The step is still the compiler's: planned into one allocation whose
//! size is known before the first batch or token, and running it allocates nothing. What it
//! outputs besides the loss ([`ingot_compiler::trace::accuracy`]'s top-k counts, the logits of
//! [`ingot_compiler::trace::logits`]) is read from its planned slots into buffers allocated
//! once, here.

use crate::data::BatchSource;
use crate::session::{Device, Session};
use indexmap::IndexMap;
use ingot_compiler::ir::{DType, Graph, LeafKind, NodeId};
use ingot_compiler::pipeline;
use ingot_compiler::plan::Location;
use ingot_compiler::precision::Precision;
use ingot_compiler::trace::logits::LOGITS;
use ingot_models::gpt_decode::is_cache;
use ingot_runtime::tensor::Tensor;

/// A forward-only step loaded on a device, with the planned slots of its inputs and outputs.
pub struct Inference {
    session: Session,
    /// The input `x` and its bytes; the labels `y` and theirs, where the step reads them.
    x: (NodeId, usize),
    y: Option<(NodeId, usize)>,
    /// The logits' slot, element type, rows and classes, where the step outputs them.
    logits: Option<(Location, DType, usize, usize)>,
    /// One row of logits as read from the allocation (allocated once).
    row_bytes: Vec<u8>,
}

/// Totals of a pass over a data set ([`Inference::over_dataset`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Batches run and the samples (label rows) they held.
    pub batches: u64,
    pub samples: u64,
    /// The mean of the batches' losses.
    pub loss: f64,
    /// Top-1 and top-5 accuracy (fractions), for a classifier.
    pub top1: Option<f64>,
    pub top5: Option<f64>,
}

impl Inference {
    /// Compiles `graph` (a forward pass: inputs `x` and maybe `y`, any outputs) in `precision`
    /// with `opts` (attention fused as there), and loads it on `device`. The parameters are
    /// seeded until [`Inference::load_weights`] replaces them.
    pub fn new(
        name: &str,
        graph: &Graph,
        precision: Precision,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Inference, String> {
        let fused = if opts.fuse_attention {
            ingot_compiler::recognize::attention_where(graph, opts.attention_supported)
                .map_err(|e| format!("the forward step of {name}: {e}"))?
                .0
        } else {
            graph.clone()
        };
        let forward = precision
            .apply(&fused)
            .map_err(|e| format!("the forward step of {name}: {e}"))?;
        let opts = pipeline::Options {
            precision: Some(precision),
            ..opts.clone()
        };
        let c = pipeline::compile_step(name, crate::eval::forward_step(&forward), &opts)
            .map_err(|e| format!("compiling the forward step of {name}: {e}"))?;
        let exe = c
            .executable(device.target())
            .map_err(|e| format!("lowering the forward step of {name}: {e}"))?;
        let session = Session::from_executable(exe, 0, device).map_err(|e| e.to_string())?;
        let g = session.graph();
        let plan = session.exe().plan();
        let input = |n: &str| {
            g.leaf(n)
                .filter(|id| g.leaves(LeafKind::Input).contains(id))
                .map(|id| (id, plan.location(g, id).bytes))
        };
        let x = input("x").ok_or_else(|| format!("the forward step of {name} has no input x"))?;
        let y = input("y");
        let logits = g.outputs.get(LOGITS).map(|&id| {
            let ty = g.ty(id);
            let dims = ty.shape.dims();
            let classes = dims.last().copied().unwrap_or(1);
            let rows = ty.shape.numel() / classes.max(1);
            (plan.location(g, id), ty.dtype, rows, classes)
        });
        let row_bytes = vec![0; logits.map_or(0, |(_, d, _, c)| c * d.size())];
        Ok(Inference {
            session,
            x,
            y,
            logits,
            row_bytes,
        })
    }

    /// The loaded step (its graph, plan and allocation).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The step's graph (as compiled: rewritten and fused).
    pub fn graph(&self) -> &Graph {
        self.session.graph()
    }

    /// The bytes of one batch of `x`, and of `y` where the step reads labels.
    pub fn input_bytes(&self) -> (usize, Option<usize>) {
        (self.x.1, self.y.map(|y| y.1))
    }

    /// The logits' rows and classes, where the step outputs them.
    pub fn logits_shape(&self) -> Option<(usize, usize)> {
        self.logits.map(|(_, _, r, c)| (r, c))
    }

    /// Replaces the step's parameters and buffers (a batch norm's running statistics) with
    /// `values` by name: every one the step reads must be there with its exact type, and a
    /// parameter name the model does not have is an error listing them (weights of another
    /// model). Names of optimizer state (which a forward step has no use for) are ignored, as
    /// are PyTorch's `num_batches_tracked` counters.
    pub fn load_weights(
        &mut self,
        parameters: &IndexMap<String, Tensor>,
        state: &IndexMap<String, Tensor>,
    ) -> Result<(), String> {
        let g = self.session.graph();
        let state_leaves: Vec<String> = g
            .leaves(LeafKind::State)
            .into_iter()
            .filter_map(|id| g.leaf_name(id).map(str::to_string))
            .collect();
        let is_state = |n: &str| state_leaves.iter().any(|s| s == n);
        // A decode step's KV cache is state of the step, not of the model: it starts at zeros
        // (whatever was saved) and the step fills it.
        let cache: IndexMap<String, Tensor> = g
            .leaves(LeafKind::State)
            .into_iter()
            .filter_map(|id| {
                let name = g.leaf_name(id)?;
                is_cache(name).then(|| (name.to_string(), Tensor::zeros(g.ty(id).clone())))
            })
            .collect();
        let params: IndexMap<String, Tensor> = parameters
            .iter()
            .filter(|(n, _)| !is_state(n) && !is_cache(n) && !n.ends_with(".num_batches_tracked"))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let buffers: IndexMap<String, Tensor> = parameters
            .iter()
            .chain(state)
            .filter(|(n, _)| is_state(n) && !is_cache(n))
            .map(|(n, t)| (n.clone(), t.clone()))
            .chain(cache)
            .collect();
        self.session
            .load_parameters(&params)
            .map_err(|e| e.to_string())?;
        if !state_leaves.is_empty() {
            self.session
                .load_optimizer_state(&buffers)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The planned slot of the step input `name` (its node and bytes), if the step has it.
    pub fn input(&self, name: &str) -> Option<(NodeId, usize)> {
        let g = self.session.graph();
        g.leaf(name)
            .filter(|id| g.leaves(LeafKind::Input).contains(id))
            .map(|id| (id, self.session.exe().plan().location(g, id).bytes))
    }

    /// The bytes of the step's one allocation: its whole peak, known before the first run.
    pub fn planned_bytes(&self) -> usize {
        self.session.exe().plan().total_bytes
    }

    /// The resident bytes of the step's state leaves whose names `which` accepts (a decode
    /// step's KV cache).
    pub fn state_bytes(&self, which: impl Fn(&str) -> bool) -> usize {
        let g = self.session.graph();
        g.leaves(LeafKind::State)
            .into_iter()
            .filter(|&id| g.leaf_name(id).is_some_and(&which))
            .map(|id| g.ty(id).bytes())
            .sum()
    }

    /// Runs the step with `inputs` (nodes from [`Inference::input`] and their bytes) copied
    /// into their planned slots. Allocates nothing.
    pub fn run_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), String> {
        self.session
            .run_with_inputs(inputs)
            .map_err(|e| format!("running the forward step: {e}"))
    }

    /// Runs the step on the batch given as the bytes of `x` (and `y`, where the step reads
    /// labels), copied straight into their planned slots. Allocates nothing.
    pub fn run(&mut self, x: &[u8], y: Option<&[u8]>) -> Result<(), String> {
        let x = (self.x.0, x.get(..self.x.1).unwrap_or(x));
        let run = match (self.y, y) {
            (Some((id, n)), Some(y)) => self
                .session
                .run_with_inputs(&[x, (id, y.get(..n).unwrap_or(y))]),
            _ => self.session.run_with_inputs(&[x]),
        };
        run.map_err(|e| format!("running the forward step: {e}"))
    }

    /// The scalar output `name` after the last run, if the step has it.
    pub fn scalar(&self, name: &str) -> Result<Option<f64>, String> {
        let g = self.session.graph();
        let Some(&id) = g.outputs.get(name) else {
            return Ok(None);
        };
        let at = self.session.exe().plan().location(g, id);
        self.session
            .exe()
            .read_scalar(at, g.ty(id).dtype)
            .map(Some)
            .map_err(|e| format!("reading {name}: {e}"))
    }

    /// Row `row` of the logits after the last run, as f32, into `out` (the classes long):
    /// copied from its planned slot through a buffer allocated once. Allocates nothing.
    pub fn logits_row(&mut self, row: usize, out: &mut [f32]) -> Result<(), String> {
        let (at, dtype, rows, classes) =
            self.logits.ok_or("the forward step has no logits output")?;
        if row >= rows || out.len() != classes {
            return Err(format!(
                "logits row {row} into {} values: the logits are {rows} rows of {classes}",
                out.len()
            ));
        }
        let size = dtype.size();
        let at = Location {
            offset: at.offset + row * classes * size,
            bytes: classes * size,
        };
        self.session
            .read_at(at, &mut self.row_bytes)
            .map_err(|e| format!("reading the logits: {e}"))?;
        for (o, b) in out.iter_mut().zip(self.row_bytes.chunks_exact(size)) {
            *o = match dtype {
                DType::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")),
                DType::BF16 => f32::from_bits(
                    (u16::from_le_bytes(b.try_into().expect("2 bytes")) as u32) << 16,
                ),
                other => return Err(format!("logits of {other} cannot be read as numbers")),
            };
        }
        Ok(())
    }

    /// Runs every whole batch of `source` (read in order) through the step, calling `each`
    /// after each batch with the step, the batch's index and its label bytes; returns the mean
    /// loss and, for a classifier, the top-1 and top-5 accuracy over all of them.
    pub fn over_dataset(
        &mut self,
        source: &mut dyn BatchSource,
        mut each: impl FnMut(&mut Inference, u64, &[u8]) -> Result<(), String>,
    ) -> Result<Totals, String> {
        let mut x = vec![0u8; source.x().bytes().max(self.x.1)];
        let mut y = vec![0u8; source.y().bytes()];
        let rows = source.y().dims.first().copied().unwrap_or(1) as u64;
        let (mut t, mut loss, mut hits) = (Totals::default(), 0.0, None::<(f64, f64)>);
        for b in 0..source.batches_per_epoch() {
            source
                .fill(0, b, &mut x, &mut y)
                .map_err(|e| format!("--dataset: {e}"))?;
            self.run(&x, Some(&y))?;
            loss += self
                .scalar(ingot_compiler::autodiff::LOSS)?
                .unwrap_or(f64::NAN);
            use ingot_compiler::trace::accuracy::{TOP1, TOP5};
            if let (Some(a), Some(b)) = (self.scalar(TOP1)?, self.scalar(TOP5)?) {
                let h = hits.get_or_insert((0.0, 0.0));
                h.0 += a;
                h.1 += b;
            }
            each(self, b, &y)?;
            t.batches += 1;
            t.samples += rows;
        }
        t.loss = loss / t.batches.max(1) as f64;
        if t.samples > 0 {
            t.top1 = hits.map(|h| h.0 / t.samples as f64);
            t.top5 = hits.map(|h| h.1 / t.samples as f64);
        }
        Ok(t)
    }
}
