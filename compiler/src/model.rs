//! A model: the forward pass the pipeline trains, with the optimizer of its training step and
//! the precision it asks for. This is the pipeline's input (`pipeline::compile`).
//!
//! A [`Model`] is a forward graph with two step inputs, `x` and `y`, one output, `loss` (a scalar
//! of the model's float dtype), and the optimizer its training step uses. Autodiff turns it into
//! a training step. Models come from the reference-model zoo (the `ingot-models` crate, by name),
//! from IR text ([`Model::from_ir_text`]), from an ONNX file (`ingot-onnx`), or from a graph
//! built with the tracing API ([`Model::new`]).

use crate::autodiff::optim::{Optimizer, OptimizerSettings};
use crate::error::{IrError, Result};
use crate::ir::{DType, Graph, LeafKind, Mode};
use crate::precision::Precision;

/// The dtype of a model's integer inputs (the class ids `y`, a GPT's token ids `x`): `i64`,
/// PyTorch's dtype for class and token indices, so a batch saved from PyTorch loads without
/// conversion. The zoo's models and ONNX imports declare them so.
pub const ID_DTYPE: DType = DType::I64;

/// A model's forward pass and the optimizer of its training step.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// The name it was built from (`mlp`, `gpt-mini`, `gpt2`, `gpt:vocab=...`).
    pub name: String,
    /// Forward graph: inputs `x` and `y`, output `loss`, traced in [`Mode::Train`].
    pub graph: Graph,
    /// The same forward pass traced in [`Mode::Eval`] (`model.eval()`), for the evaluation
    /// step, when it differs from `graph` (batch norm, dropout); `None` when the model has no
    /// layer that behaves differently in evaluation. Read it through [`Model::eval_graph`].
    pub eval_graph: Option<Graph>,
    pub optimizer: Optimizer,
    /// The precision the model asks to train in (a model file's `precision` line; f32 for the
    /// built-in models). The command line's `--precision` overrides it.
    pub precision: Precision,
}

impl Model {
    /// The optimizer a model read from a file trains with unless the file has an `optimizer`
    /// line (or the command line chooses one): SGD without momentum, lr 0.1 (the reference
    /// `mlp`'s optimizer).
    pub const FILE_OPTIMIZER: Optimizer = Optimizer::Sgd { lr: 0.1 };

    /// A model named `name` that trains `graph` with `optimizer` in f32 (the built-in models'
    /// precision) and evaluates the same trace (`eval_graph` `None`: set it, or the precision,
    /// with struct update syntax where a model differs).
    pub fn new(name: impl Into<String>, graph: Graph, optimizer: Optimizer) -> Model {
        Model {
            name: name.into(),
            graph,
            eval_graph: None,
            optimizer,
            precision: Precision::F32,
        }
    }

    /// The forward pass the evaluation step runs: the [`Mode::Eval`] trace, or `graph` when the
    /// model traces the same in both modes. Its loss reads the same parameter and state leaves
    /// as `graph` (same names and types), and it updates nothing.
    pub fn eval_graph(&self) -> &Graph {
        self.eval_graph.as_ref().unwrap_or(&self.graph)
    }

    /// Traces a forward pass with `build` in both modes: the training graph, and the
    /// evaluation graph when it differs from it (see [`Model::eval_graph`]). `build` must
    /// declare the same leaves in both modes; a difference is an error naming `name`.
    pub fn trace_modes(
        name: &str,
        build: impl Fn(&mut Graph) -> Result<()>,
    ) -> Result<(Graph, Option<Graph>)> {
        let mut train = Graph::new();
        build(&mut train)?;
        let mut eval = Graph::new();
        eval.set_mode(Mode::Eval);
        build(&mut eval)?;
        eval.set_mode(Mode::Train);
        if eval == train {
            return Ok((train, None));
        }
        check_eval_graph(name, &train, &eval)?;
        Ok((train, Some(eval)))
    }

    /// A model from the IR text form of its forward pass (see [`crate::ir::text`]): a graph
    /// with an output named `loss` that is a float scalar, parameters to train, and no
    /// `update` lines (autodiff appends the backward pass and the update). It trains with
    /// [`Model::FILE_OPTIMIZER`]. A syntax or type error is [`IrError::Parse`] naming the line;
    /// a graph that is not a forward pass is [`IrError::Model`] naming `name`.
    ///
    /// One line `optimizer NAME key=value ...` (e.g. `optimizer adamw lr=3e-4 betas=0.9,0.95
    /// weight_decay=0.1`; see [`OptimizerSettings::parse`]) anywhere in the file chooses the
    /// optimizer instead, and one line `precision f32|tf32|bf16` the precision
    /// ([`Model::precision`]); the IR parser sees both as blank lines, so line numbers stay.
    /// The precision line changes no dtype written in the file: under `bf16` the autocast
    /// policy inserts the casts, and an op whose operands the file itself gives two float
    /// dtypes is a type error naming its line, as always.
    pub fn from_ir_text(name: &str, text: &str) -> Result<Model> {
        let mut optimizer = Model::FILE_OPTIMIZER;
        let mut precision = Precision::default();
        let mut seen = None;
        let mut seen_precision: Option<usize> = None;
        let mut body = String::with_capacity(text.len());
        for (i, line) in text.lines().enumerate() {
            let code = line.split('#').next().unwrap_or("").trim();
            if let Some(rest) = code
                .strip_prefix("precision")
                .filter(|r| r.is_empty() || r.starts_with(char::is_whitespace))
            {
                let at = format!("line {}", i + 1);
                if let Some(first) = seen_precision {
                    return Err(model_err(
                        name,
                        format!("{at}: a second precision line (the first is line {first})"),
                    ));
                }
                seen_precision = Some(i + 1);
                precision = Precision::from_name(rest.trim()).ok_or_else(|| {
                    model_err(
                        name,
                        format!(
                            "{at}: precision {:?} is not one of f32, tf32, bf16",
                            rest.trim()
                        ),
                    )
                })?;
                body.push('\n');
                continue;
            }
            if let Some(rest) = code
                .strip_prefix("optimizer")
                .filter(|r| r.is_empty() || r.starts_with(char::is_whitespace))
            {
                if let Some(first) = seen {
                    return Err(model_err(
                        name,
                        format!(
                            "line {}: a second optimizer line (the first is line {first})",
                            i + 1
                        ),
                    ));
                }
                seen = Some(i + 1);
                optimizer = OptimizerSettings::parse(rest)
                    .and_then(|s| s.apply(optimizer))
                    .map_err(|e| model_err(name, format!("line {}: optimizer: {e}", i + 1)))?;
                body.push('\n');
                continue;
            }
            body.push_str(line);
            body.push('\n');
        }
        let text = body.as_str();
        let parsed = crate::trace::layers::parse(text, Mode::Train)?;
        let mut graph = parsed.graph;
        // Each node's provenance is its line of the file (`step:12`), unless a layer line
        // named it (`fc1`, as the Rust API's layer does).
        for (k, line) in parsed.lines.iter().enumerate() {
            let id = crate::ir::NodeId(k as u32);
            if !graph.node(id).op.is_leaf() && graph.origin(id).is_empty() {
                graph.set_origin(id, crate::ir::Origin::new(&format!("{name}:{line}")));
            }
        }
        let Some(&loss) = graph.outputs.get("loss") else {
            return Err(model_err(
                name,
                "the forward pass has no output named \"loss\" (write `output \"loss\" = %N`)",
            ));
        };
        let ty = graph.ty(loss);
        if ty.shape.rank() != 0 || !ty.dtype.is_float() {
            return Err(model_err(
                name,
                format!(
                    "the output \"loss\" must be a float scalar (`f32[]`), not {}{:?}",
                    ty.dtype,
                    ty.shape.dims()
                ),
            ));
        }
        if !graph.updates.is_empty() {
            return Err(model_err(
                name,
                "the file has `update` lines: give the forward pass only; ingot appends the backward pass and the optimizer's update",
            ));
        }
        if graph.leaves(LeafKind::Parameter).is_empty() {
            return Err(model_err(
                name,
                "the forward pass has no parameters to train",
            ));
        }
        // A file with dropout lines has an evaluation trace of its own (dropout the identity);
        // its nodes keep the training trace's provenance (one node per line in both).
        let eval_graph = if graph
            .nodes()
            .iter()
            .any(|n| matches!(n.op, crate::ir::Op::Dropout { .. }))
        {
            let mut e = crate::trace::layers::parse(text, Mode::Eval)?.graph;
            for id in graph.ids() {
                e.set_origin(id, graph.origin(id).clone());
            }
            check_eval_graph(name, &graph, &e)?;
            Some(e)
        } else {
            None
        };
        Ok(Model {
            name: name.to_string(),
            graph,
            eval_graph,
            optimizer,
            precision,
        })
    }
}

/// Checks that `eval` (a forward pass traced in evaluation mode) reads the parameters and
/// state `train` (the same pass in training mode) declares, with the same types, and updates
/// nothing; it may lack inputs (dropout's seed). An error names the model.
fn check_eval_graph(name: &str, train: &Graph, eval: &Graph) -> Result<()> {
    let resident = |g: &Graph| -> Vec<(String, crate::ir::TensorType)> {
        let mut ids = g.leaves(LeafKind::Parameter);
        ids.extend(g.leaves(LeafKind::State));
        ids.into_iter()
            .map(|id| (g.leaf_name(id).unwrap_or("").to_string(), g.ty(id).clone()))
            .collect()
    };
    if resident(train) != resident(eval) {
        return Err(model_err(
            name,
            "the forward pass declares different parameters or state in training and evaluation mode",
        ));
    }
    if !eval.updates.is_empty() {
        return Err(model_err(
            name,
            "the forward pass traced in evaluation mode updates state; evaluation must change nothing",
        ));
    }
    Ok(())
}

/// The number of trainable scalars: the element counts of the parameter leaves, summed.
pub fn parameter_count(g: &Graph) -> usize {
    g.leaves(LeafKind::Parameter)
        .into_iter()
        .map(|id| g.ty(id).shape.numel())
        .sum()
}

/// A model error naming the spec.
fn model_err(spec: &str, reason: impl Into<String>) -> IrError {
    IrError::Model {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}
