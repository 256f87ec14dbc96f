//! ONNX import: a forward graph exported by any framework becomes the same
//! [`ingot_compiler::model::Model`] the built-in models give, so everything after tracing
//! (autodiff, optimizers, rewrites, fusion, attention recognition, planning, budget fitting,
//! CUDA) applies to it unchanged. This crate is its own room: it uses the compiler's tracing
//! API and IR, and nothing in the compiler knows it exists.
//!
//! ```no_run
//! use ingot_onnx::{import, ImportOptions, Loss};
//! let opts = ImportOptions { loss: Loss::CrossEntropy { logits: None }, batch: Some(32), ..Default::default() };
//! let imported = import("model.onnx".as_ref(), &opts)?;
//! // imported.model: the Model; imported.weights: the initializers' values, by ONNX name.
//! # Ok::<(), ingot_onnx::OnnxError>(())
//! ```
//!
//! # What a model becomes
//!
//! - **Parameters** are the float initializers, named as in the file (PyTorch's exporter keeps
//!   the `state_dict` names, `fc1.weight`, so `--init`/`--save` files match), declared in the
//!   file's order. Their values are in [`Imported::weights`]; the graph's leaves carry
//!   `Init::Zeros`, so **load the weights** before the first step.
//! - **State** (resident, not trained): a BatchNormalization's running mean and variance
//!   (updated in place by the training step, read by the evaluation step), the initializers
//!   the exporter lists as buffers (metadata `ingot.frozen`, comma-separated names; or
//!   [`ImportOptions::frozen`]), every initializer not in the metadata `ingot.parameters`
//!   when the file has that list (`scripts/export_onnx.py` writes both, from the module's
//!   `named_parameters` and `named_buffers`), and any other constant a graph op reads that
//!   Ingot cannot compute ([`Weight::constant`]: a step that does not load it computes
//!   something else, so `ingot compile` refuses such a model). Constants Ingot computes are
//!   not stored: all elements equal is a `full` node, `0..n` an `iota`, one repeated along an
//!   axis that smaller constant broadcast, and a triangle (a
//!   causal mask, a buffer or built with `Trilu`) a compare of two iotas, the form attention
//!   recognition fuses.
//! - **Embeddings' padding rows**: PyTorch's `nn.Embedding(padding_idx=r)` passes no gradient
//!   from the lookup into row `r`, which an ONNX `Gather` cannot say; the metadata
//!   `ingot.padding_idx` (`table:row,...`, written by `scripts/export_onnx.py`) restores it
//!   (`select(ids == r, stop_gradient(y), y)`: the same values, no gradient at those rows).
//! - **Inputs**: a model's data inputs (its graph inputs that are not initializers) become
//!   Ingot's `x` and `y`, the two inputs every Ingot model has and the trainer feeds: with
//!   [`Loss::Output`] the first data input is `x` and a second, if any, is `y` (a model that
//!   computes its own loss from `(data, target)`); with [`Loss::CrossEntropy`] or [`Loss::Mse`]
//!   the model has one data input, `x`, and the loss adds `y`, the labels. Other data inputs
//!   are held at a value ([`ImportOptions::fixed_inputs`], `--input-value NAME=VALUE`: BERT's
//!   `attention_mask` at 1, `token_type_ids` at 0, a decoder's `position_ids` at 0, 1, ..
//!   along the sequence, [`HeldValue`]), constants folded into what reads them; more data
//!   inputs than that are refused naming them ([`OnnxError::DataInputs`]). [`Imported::inputs`] maps ONNX names
//!   to Ingot's.
//! - **Shapes are static**: a symbolic axis 0 of a data input takes [`ImportOptions::batch`],
//!   another symbolic axis its size in [`ImportOptions::dims`] (by its `dim_param` name); one
//!   left unresolved is an error naming the input and the axis. Shape arithmetic (`Shape`,
//!   `Gather`, `Concat`, `Unsqueeze`, `Cast`, `Constant`, `ConstantOfShape`, `Range`,
//!   arithmetic on constants, ...) is folded on the host while tracing; a shape, axis list or
//!   exponent computed from the data is an error naming the node.
//! - **Training and evaluation**: the model is traced twice ([`Model::trace_modes`]). In
//!   training mode a BatchNormalization with `training_mode=1` normalises by the batch and
//!   updates its running statistics (ONNX's rule, `r·momentum + s·(1 − momentum)`, with the
//!   batch's biased variance as onnxruntime computes it; PyTorch's own running variance uses
//!   the unbiased one), and a Dropout with `training_mode` true draws Ingot's seeded mask
//!   (`nn::dropout`, salted by the node's name; the file's `seed` attribute is not used, since
//!   no mask would match another framework's draw anyway); its mask output, where a node reads
//!   it, is the same draw of a tensor of ones (an output nothing reads is not computed). A
//!   `RandomUniformLike` compared with a constant (PyTorch's `bernoulli_`, torchvision's
//!   stochastic depth) is a Bernoulli mask drawn the same way, salted by its node; read any
//!   other way it is refused. In evaluation mode these are the inference forms: dropout and
//!   its mask the identity and all true, a Bernoulli mask all true, and cast to a float its
//!   expectation (so stochastic depth's `mask / p` is 1).
//! - **Refusals**: every op, attribute and dtype Ingot cannot compute exactly is refused before
//!   anything is traced, all such nodes in one [`OnnxError::Unsupported`] naming each node's
//!   op type, name and what Ingot would need ([`check`] lists them without importing). Ops with
//!   no exact expression in Ingot's primitives (`Resize` by a fraction or in cubic mode, `Pad`
//!   in wrap mode, `ArgMax`, ...) are refused, never approximated. `Pad` (constant, reflect,
//!   edge; negative pads crop) is slices, broadcasts, constants and joins, axis by axis;
//!   `SplitToSequence` read by `SequenceAt` at constant positions (PyTorch's dynamo exporter
//!   writes `split` so) is Split's slices; ONNX's `Attention` (the dynamo exporter's
//!   `scaled_dot_product_attention`) is its plain math, which recognition fuses. `Erf` and exact `Gelu` use the IR's
//!   `erf`; `ConvTranspose` is the input with zeros between its elements, padded, convolved
//!   with the flipped kernel (differentiable, as Ingot's conv is); `Resize` by integer factors
//!   repeats (nearest) or blends neighbours with fixed weights (linear).
//!
//! # The command line
//!
//! `ingot onnx check MODEL.onnx` prints [`check`]'s list, and when it is empty runs the whole
//! [`import`] with the same flags as train (without `--loss`, [`Loss::Forward`]), so that a file
//! check passes imports in train too; `ingot plan|train|compile --onnx MODEL.onnx [--loss
//! output|cross-entropy|mse] [--logits NAME] [--batch N] [--class-axis last|1]` imports with
//! these options ([`ClassAxis`]: which axis of three-or-more-axis logits holds the classes), and `train` loads [`Imported::weights`] into the session before `--init`
//! (cli/src/onnx.rs). [`trace_forward`] traces a model into a graph of the caller's
//! (the gradient checks use it).
//!
//! # Reading files
//!
//! Files are read with a size cap ([`ImportOptions::max_file_bytes`]); every tensor's data
//! must match its type and dims; external data is read only from plain relative paths inside
//! the model's folder (canonicalized, so no symbolic link leaves it), its size checked against
//! the tensor's type first. A truncated or garbage file, a cycle, a name nothing produces or
//! two producers of one name are errors, never panics.
//!
//! # Why the protobuf code is committed
//!
//! The types are generated by prost from ONNX's own `onnx.proto` (vendored in `onnx/proto/`
//! with its licence). Generating them in a build script needs `prost-build` and `protox`
//! (a pure-Rust protobuf compiler): measured on the 2-core development machine, a clean
//! release build of those two and their dependencies took 3 min 58 s (`cargo build --release`
//! of `onnx/codegen`), added to every clean build of the workspace for a file that changes
//! only when ONNX's schema does. So the generated `src/proto/onnx.rs` is committed, and
//! `onnx/codegen` (a crate outside the workspace) regenerates it, or with `--check` fails
//! when the committed file differs from a fresh generation:
//! `cargo run --release --manifest-path onnx/codegen/Cargo.toml -- --check`.

mod attrs;
mod error;
mod lower;
mod order;
#[allow(missing_docs)]
pub mod proto;
mod read;
mod value;

pub use attrs::SUPPORTED;
pub use error::{OnnxError, Result, Unsupported};
pub use read::{MAX_FILE_BYTES, MAX_TENSOR_BYTES};

use indexmap::IndexMap;
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::ir::{DType, Graph, Init, LeafKind, Mode, NodeId, Origin, Shape, TensorType};
use ingot_compiler::model::Model;
use ingot_compiler::precision::Precision;
use ingot_compiler::trace::nn;
use lower::{Lower, Val};
use proto::{ModelProto, NodeProto};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use value::Const;

/// What the training step minimises.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Loss {
    /// The graph's scalar float output: the one named `loss`, else the only scalar float
    /// output.
    #[default]
    Auto,
    /// The graph output of this name (a float scalar).
    Output(String),
    /// Mean softmax cross-entropy (`F.cross_entropy`) of a logits output `[.., C]` (this one,
    /// else the graph's only output) against integer labels `y` `[..]` (i64), a new input.
    CrossEntropy { logits: Option<String> },
    /// Mean squared error (`F.mse_loss`) of an output (this one, else the only output)
    /// against a float target `y` of its shape, a new input.
    Mse { output: Option<String> },
    /// No loss: the forward pass alone, traced with its shapes (what `ingot onnx check` imports
    /// when no loss is asked for). Such a model has no `loss` output and cannot be trained.
    Forward,
}

/// Which axis of a cross-entropy's logits holds the classes. PyTorch's `CrossEntropyLoss`
/// takes `[N, C, d1, ..]` with labels `[N, d1, ..]` (axis 1); a token model's logits are
/// `[N, S, V]` with labels `[N, S]` (the last axis: `F.cross_entropy(z.view(-1, V),
/// y.view(-1))`). The two agree for `[N, C]`; for more axes the labels' shape tells them apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClassAxis {
    /// The axis (1 or the last) whose removal gives [`ImportOptions::labels_shape`]; an error
    /// when both readings fit it, when neither does, or when the labels' shape is not known
    /// and the logits have more than two axes.
    #[default]
    FromLabels,
    /// The last axis (token models: `[N, S, V]`, labels `[N, S]`).
    Last,
    /// Axis 1 (`CrossEntropyLoss`'s layout: `[N, C, d1, ..]`, labels `[N, d1, ..]`).
    Second,
}

/// The value a data input is held at instead of being fed ([`ImportOptions::fixed_inputs`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HeldValue {
    /// Every element this number: BERT's `attention_mask` at 1, `token_type_ids` at 0.
    Fill(f64),
    /// Each element its index along the input's last axis, 0, 1, ..: a decoder's
    /// `position_ids` `[batch, seq]` (transformers' exports take them as an input) for tokens
    /// that sit at positions 0.. of the window, as Ingot's training batches and generation's
    /// windows place them.
    Positions,
}

impl HeldValue {
    /// The value of element `i` of an input whose last axis has `last` elements.
    fn at(self, i: usize, last: usize) -> f64 {
        match self {
            HeldValue::Fill(v) => v,
            HeldValue::Positions => (i % last.max(1)) as f64,
        }
    }
}

impl From<f64> for HeldValue {
    fn from(v: f64) -> HeldValue {
        HeldValue::Fill(v)
    }
}

/// How to import a model.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// The size of a symbolic axis 0 of the data inputs (the batch).
    pub batch: Option<usize>,
    /// Sizes of other symbolic axes, by their `dim_param` name.
    pub dims: BTreeMap<String, usize>,
    pub loss: Loss,
    /// The float dtype floats are traced in: f32, or f64 for gradient checks.
    pub float: DType,
    /// Float initializers that are constants, not parameters (besides the file's
    /// `ingot.frozen` metadata).
    pub frozen: Vec<String>,
    /// The largest file read.
    pub max_file_bytes: u64,
    /// The optimizer of the training step ([`Model::FILE_OPTIMIZER`] unless set).
    pub optimizer: Optimizer,
    /// Data inputs held at a value, by ONNX name (BERT's `attention_mask` at 1 and
    /// `token_type_ids` at 0, a decoder's `position_ids` at [`HeldValue::Positions`]): each
    /// becomes a constant of its declared type and shape, folded into what reads it, instead
    /// of a step input. Ingot's trainer feeds two inputs (`x`, `y`), so a model with more data
    /// inputs than that trains with the rest held this way.
    pub fixed_inputs: BTreeMap<String, HeldValue>,
    /// Which axis of [`Loss::CrossEntropy`]'s logits holds the classes.
    pub class_axis: ClassAxis,
    /// The labels' shape, where the caller knows it (a batch file's `y`), for
    /// [`ClassAxis::FromLabels`].
    pub labels_shape: Option<Vec<usize>>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            batch: None,
            dims: BTreeMap::new(),
            loss: Loss::Auto,
            float: DType::F32,
            frozen: Vec::new(),
            max_file_bytes: MAX_FILE_BYTES,
            optimizer: Model::FILE_OPTIMIZER,
            fixed_inputs: BTreeMap::new(),
            class_axis: ClassAxis::default(),
            labels_shape: None,
        }
    }
}

/// The initial value of a parameter or state leaf, from the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Weight {
    pub kind: LeafKind,
    /// A constant the graph reads (a frozen initializer, a `Constant` with no pattern Ingot
    /// computes): state the training step never changes, but needs, so a step that does not
    /// load it computes something else. Batch norm's running statistics are state, not
    /// constants.
    pub constant: bool,
    pub ty: TensorType,
    /// Little-endian elements of `ty`'s dtype.
    pub bytes: Vec<u8>,
}

/// An imported model and what it needs besides its graph.
#[derive(Clone, Debug)]
pub struct Imported {
    pub model: Model,
    /// Every parameter's and state leaf's value, by leaf name: parameters first, in the file's
    /// order, then state.
    pub weights: IndexMap<String, Weight>,
    /// Each ONNX data input's name and the Ingot input it became (`x`, `y`); the labels input
    /// a loss adds appears as `("", "y")`.
    pub inputs: Vec<(String, String)>,
    /// The ONNX graph's outputs that are computed (not constants), by name, as nodes of
    /// `model.graph` (so a harness can read them: `graph.set_output(name, id)`).
    pub outputs: IndexMap<String, NodeId>,
    /// The same outputs as nodes of `model.eval_graph`, when the model traces differently in
    /// evaluation (empty otherwise).
    pub eval_outputs: IndexMap<String, NodeId>,
    /// The names of the file's initializers, leaves or not (a constant Ingot computes, such as
    /// a causal mask buffer, is an initializer of the file but no leaf).
    pub initializers: Vec<String>,
    /// What the file asks that a user training it may not expect, one line each, for the CLI
    /// to print (imported as the file says, never changed): batch norms written in their
    /// inference form ([`inference_batch_norms`]).
    pub notes: Vec<String>,
}

/// The note for a graph whose BatchNormalization nodes have `training_mode` 0 (absent): each
/// normalises by its running statistics and never updates them, in training too, as ONNX
/// specifies. A module exported in `eval()` mode, and PyTorch's `dynamo=True` exporter even in
/// training mode, write batch norms so; trained that way, they do not learn as PyTorch's
/// training step does, so the user is told, with the node and the way out.
pub fn inference_batch_norms(graph: &proto::GraphProto) -> Option<String> {
    let inference: Vec<&str> = graph
        .node
        .iter()
        .filter(|n| {
            n.op_type() == "BatchNormalization"
                && attrs::Attrs(&n.attribute).int("training_mode", 0) == 0
        })
        .map(|n| n.name())
        .collect();
    let first = inference.first()?;
    Some(format!(
        "{} BatchNormalization node{} (first: {first:?}) have training_mode 0: they normalise by \
         their running statistics and do not update them, in training too; to train batch \
         statistics as PyTorch does, export the module in training mode with the TorchScript \
         exporter (scripts/export_onnx.py, dynamo=False)",
        inference.len(),
        if inference.len() == 1 { "" } else { "s" }
    ))
}

/// Imports the model at `path` (external data is read from its folder).
pub fn import(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let model = read::read_model(path, opts.max_file_bytes)?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "onnx".into());
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".").to_path_buf()
        } else {
            p.to_path_buf()
        }
    });
    import_model(&model, &name, read::DataDir(dir), opts)
}

/// Imports a model from its bytes, named `name` (external data cannot be read: it is an
/// error naming the tensor).
pub fn import_bytes(bytes: &[u8], name: &str, opts: &ImportOptions) -> Result<Imported> {
    let model = read::decode_model(bytes, name)?;
    import_model(&model, name, read::DataDir(None), opts)
}

/// Every node of the model at `path` that Ingot cannot import, with why (empty when all can).
/// A file that cannot be read or is not an ONNX graph is an error.
pub fn check(path: &Path) -> Result<Vec<Unsupported>> {
    let model = read::read_model(path, MAX_FILE_BYTES)?;
    Ok(unsupported(&model))
}

/// [`check`] of a model's bytes.
pub fn check_bytes(bytes: &[u8], name: &str) -> Result<Vec<Unsupported>> {
    Ok(unsupported(&read::decode_model(bytes, name)?))
}

fn unsupported(model: &ModelProto) -> Vec<Unsupported> {
    let graph = model.graph.as_ref().expect("decode_model checked");
    let mut out = Vec::new();
    if let Some(v) = opset_problem(model) {
        out.push(Unsupported {
            op_type: "(model)".into(),
            node: "opset_import".into(),
            reason: v,
        });
    }
    // Who reads each value: a random draw is imported only as a Bernoulli mask (a comparison
    // with a constant), so its readers are checked here, with the graph in view.
    let mut readers: HashMap<&str, Vec<&str>> = HashMap::new();
    for n in &graph.node {
        for i in &n.input {
            readers.entry(i.as_str()).or_default().push(n.op_type());
        }
    }
    for o in &graph.output {
        readers.entry(o.name()).or_default().push("(graph output)");
    }
    for (i, n) in graph.node.iter().enumerate() {
        let checked = attrs::check_node(n).and_then(|()| {
            if n.op_type() != "RandomUniformLike" {
                return Ok(());
            }
            let rs = n.output.first().and_then(|o| readers.get(o.as_str()));
            match rs.into_iter().flatten().find(|r| {
                !matches!(**r, "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual")
            }) {
                Some(r) => Err(format!(
                    "its draw is read by {r}: Ingot imports a uniform draw only compared with a constant (a Bernoulli mask, as PyTorch's bernoulli_ exports), drawn with its seeded dropout mask"
                )),
                None => Ok(()),
            }
        });
        if let Err(reason) = checked {
            let op_type = if n.domain().is_empty() {
                n.op_type().to_string()
            } else {
                format!("{}:{}", n.domain(), n.op_type())
            };
            out.push(Unsupported {
                op_type,
                node: attrs::node_name(n, i),
                reason,
            });
        }
    }
    out
}

/// The lowest opset whose operator semantics the importer implements.
pub const MIN_OPSET: i64 = 13;

fn opset_problem(model: &ModelProto) -> Option<String> {
    let v = model
        .opset_import
        .iter()
        .find(|o| o.domain().is_empty() || o.domain() == "ai.onnx")
        .map(|o| o.version())?;
    (v < MIN_OPSET).then(|| {
        format!("opset {v} is older than {MIN_OPSET}, the oldest Ingot imports (export with opset_version=17)")
    })
}

/// Input slots that must be constants known at import: an initializer read only there is a
/// constant, not a parameter.
fn constant_slot(op: &str, i: usize) -> bool {
    match op {
        "Reshape" | "Expand" | "Squeeze" | "Unsqueeze" | "Split" | "ReduceMean" | "ReduceSum"
        | "ReduceMax" | "ReduceMin" | "Pow" | "Tile" | "Trilu" => i == 1,
        "Slice" => (1..=4).contains(&i),
        "Pad" => (1..=3).contains(&i),
        "SplitToSequence" | "SequenceAt" => i == 1,
        "GatherND" => true,
        "Resize" => i >= 1,
        "RandomUniformLike" => true,
        "Clip" | "Dropout" => i == 1 || i == 2,
        "ConstantOfShape" | "Range" => true,
        _ => false,
    }
}

/// A model checked and decoded, ready to trace (in either mode, into any graph).
struct Prepared<'a> {
    /// Data inputs held at a value ([`ImportOptions::fixed_inputs`]).
    fixed: Vec<(String, Const)>,
    graph: &'a proto::GraphProto,
    order: Vec<usize>,
    /// The initializers that are not leaves, as constants (folded into what reads them).
    consts: HashMap<String, Const>,
    /// The leaves' (parameters', running statistics') dtypes and dims, by name.
    leaf_types: HashMap<String, (DType, Vec<usize>)>,
    /// Their elements (little-endian, of the leaf's dtype), moved into the first trace's
    /// weights: held once, never as f64 ([`read::leaf_bytes`]).
    leaf_bytes: RefCell<HashMap<String, Vec<u8>>>,
    state: Vec<String>,
    /// The batch norms' running variances among `state`.
    variances: HashSet<String>,
    inputs: Vec<(String, String)>,
    input_types: Vec<TensorType>,
    dir: read::DataDir,
    /// Embedding tables' padding rows (metadata `ingot.padding_idx`): [`Lower::padding`].
    padding: HashMap<String, i64>,
}

fn prepare<'a>(
    model: &'a ModelProto,
    dir: read::DataDir,
    opts: &ImportOptions,
    labels: bool,
) -> Result<Prepared<'a>> {
    let problems = unsupported(model);
    if !problems.is_empty() {
        return Err(OnnxError::Unsupported(problems));
    }
    let graph = model.graph.as_ref().expect("decode_model checked");
    let order = order::topological(graph)?;
    let inits: HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    // Roles of initializers, from how nodes read them.
    let mut frozen: HashSet<String> = opts.frozen.iter().cloned().collect();
    let listed = |key: &str| {
        model
            .metadata_props
            .iter()
            .filter(|p| p.key() == key)
            .flat_map(|p| {
                p.value()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
            })
            .collect::<HashSet<String>>()
    };
    frozen.extend(listed("ingot.frozen"));
    // With the exporter's list of parameters, every other initializer is a constant.
    if model
        .metadata_props
        .iter()
        .any(|p| p.key() == "ingot.parameters")
    {
        let params = listed("ingot.parameters");
        frozen.extend(
            graph
                .initializer
                .iter()
                .map(|t| t.name().to_string())
                .filter(|n| !params.contains(n)),
        );
    }
    let mut data_use: HashSet<String> = HashSet::new();
    let mut state: Vec<String> = Vec::new();
    let mut variances: HashSet<String> = HashSet::new();
    for n in &graph.node {
        for (i, inp) in n.input.iter().enumerate() {
            if !inits.contains(inp.as_str()) {
                continue;
            }
            if n.op_type() == "BatchNormalization" && (i == 3 || i == 4) {
                if !state.contains(inp) {
                    state.push(inp.clone());
                }
                if i == 4 {
                    variances.insert(inp.clone());
                }
            } else if !constant_slot(n.op_type(), i) {
                data_use.insert(inp.clone());
            }
        }
    }
    let all_data: Vec<&proto::ValueInfoProto> = graph
        .input
        .iter()
        .filter(|v| !inits.contains(v.name()))
        .collect();
    if let Some(bad) = opts
        .fixed_inputs
        .keys()
        .find(|k| !all_data.iter().any(|v| v.name() == k.as_str()))
    {
        let names: Vec<&str> = all_data.iter().map(|v| v.name()).collect();
        return Err(OnnxError::Options(format!(
            "{bad:?} is held at a value, but it is not a data input of the model (they are {names:?})"
        )));
    }
    let mut fixed = Vec::new();
    for v in all_data
        .iter()
        .filter(|v| opts.fixed_inputs.contains_key(v.name()))
    {
        let ty = input_type(v, opts)?;
        let value = opts.fixed_inputs[v.name()];
        let numel = ty.shape.numel();
        let last = ty.shape.dims().last().copied().unwrap_or(1);
        if numel > lower::MAX_FOLDED {
            return Err(OnnxError::Options(format!(
                "input {:?} ({ty}) is too large to hold at a value",
                v.name()
            )));
        }
        let at = |i| value.at(i, last);
        let data = if ty.dtype.is_float() {
            value::Data::F((0..numel).map(at).collect())
        } else {
            value::Data::I((0..numel).map(|i| at(i) as i64).collect())
        };
        let c = Const::new(ty.dtype, ty.shape.dims().to_vec(), data);
        fixed.push((v.name().to_string(), c));
    }
    let data_inputs: Vec<&proto::ValueInfoProto> = all_data
        .into_iter()
        .filter(|v| !opts.fixed_inputs.contains_key(v.name()))
        .collect();
    let max_inputs = if labels { 1 } else { 2 };
    if data_inputs.len() > max_inputs {
        return Err(OnnxError::DataInputs {
            names: data_inputs.iter().map(|v| v.name().to_string()).collect(),
            fed: max_inputs,
            labels,
        });
    }
    let mut inputs = Vec::new();
    let mut input_types = Vec::new();
    for (k, v) in data_inputs.iter().enumerate() {
        let ingot = if k == 0 { "x" } else { "y" };
        input_types.push(input_type(v, opts)?);
        inputs.push((v.name().to_string(), ingot.to_string()));
    }
    let mut consts: HashMap<String, Const> = HashMap::new();
    let mut leaf_types = HashMap::new();
    let mut leaf_bytes = HashMap::new();
    for t in &graph.initializer {
        let n = t.name();
        let float = read::dtype_of(t.data_type(), opts.float).is_ok_and(|d| d.is_float());
        let param = float && data_use.contains(n) && !frozen.contains(n);
        if param || state.iter().any(|s| s == n) {
            let (dtype, dims, bytes) = read::leaf_bytes(t, opts.float, &dir)?;
            leaf_types.insert(n.to_string(), (dtype, dims));
            leaf_bytes.insert(n.to_string(), bytes);
        } else {
            consts.insert(n.to_string(), read::tensor(t, opts.float, &dir)?);
        }
    }
    let padding = padding_rows(model)?;
    Ok(Prepared {
        fixed,
        graph,
        order,
        consts,
        leaf_types,
        leaf_bytes: RefCell::new(leaf_bytes),
        state,
        variances,
        inputs,
        input_types,
        dir,
        padding,
    })
}

/// The metadata `ingot.padding_idx` (`table:row,...`, written by `scripts/export_onnx.py` for
/// each `nn.Embedding` with a `padding_idx`): rows whose embedding lookups pass no gradient back,
/// as PyTorch's embedding backward skips them. ONNX's `Gather` cannot say so, and without it
/// a tied table (BERT's word embeddings) trains its padding row differently from PyTorch.
fn padding_rows(model: &ModelProto) -> Result<HashMap<String, i64>> {
    let mut rows = HashMap::new();
    for p in model
        .metadata_props
        .iter()
        .filter(|p| p.key() == "ingot.padding_idx")
    {
        for entry in p.value().split(',').filter(|s| !s.is_empty()) {
            let row = entry
                .rsplit_once(':')
                .and_then(|(name, row)| Some((name, row.parse::<i64>().ok()?)));
            let Some((name, row)) = row else {
                return Err(OnnxError::Options(format!(
                    "metadata ingot.padding_idx: {entry:?} is not TABLE:ROW"
                )));
            };
            rows.insert(name.to_string(), row);
        }
    }
    Ok(rows)
}

fn import_model(
    model: &ModelProto,
    name: &str,
    dir: read::DataDir,
    opts: &ImportOptions,
) -> Result<Imported> {
    let labels = matches!(opts.loss, Loss::CrossEntropy { .. } | Loss::Mse { .. });
    let with_loss = opts.loss != Loss::Forward;
    let p = prepare(model, dir, opts, labels)?;
    let weights: RefCell<IndexMap<String, Weight>> = RefCell::new(IndexMap::new());
    let failure: RefCell<Option<OnnxError>> = RefCell::new(None);
    let outputs: RefCell<IndexMap<String, NodeId>> = RefCell::new(IndexMap::new());
    let eval_outputs: RefCell<IndexMap<String, NodeId>> = RefCell::new(IndexMap::new());
    let build = |g: &mut Graph| -> ingot_compiler::Result<()> {
        let r = p.trace(g, opts, &weights, with_loss);
        match r {
            Ok(outs) => {
                if g.mode() == Mode::Train {
                    *outputs.borrow_mut() = outs;
                } else {
                    *eval_outputs.borrow_mut() = outs;
                }
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                *failure.borrow_mut() = Some(e);
                Err(ingot_compiler::IrError::Invalid(msg))
            }
        }
    };
    let traced = Model::trace_modes(name, build);
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    let (graph_train, eval_graph) = traced?;
    let eval_graph_present = eval_graph.is_some();
    let mut inputs = p.inputs.clone();
    if labels {
        inputs.push((String::new(), "y".into()));
    }
    let notes = model
        .graph
        .as_ref()
        .and_then(inference_batch_norms)
        .into_iter()
        .collect();
    Ok(Imported {
        model: Model {
            name: name.to_string(),
            graph: graph_train,
            eval_graph,
            optimizer: opts.optimizer,
            precision: Precision::default(),
        },
        weights: weights.into_inner(),
        inputs,
        outputs: outputs.into_inner(),
        initializers: p
            .graph
            .initializer
            .iter()
            .map(|t| t.name().to_string())
            .collect(),
        eval_outputs: if eval_graph_present {
            eval_outputs.into_inner()
        } else {
            IndexMap::new()
        },
        notes,
    })
}

/// Traces the forward pass of the model in `bytes` into `g` (in `g`'s mode), without a loss:
/// the graph's outputs by ONNX name, and the leaves' values. A data input whose Ingot name
/// (`x`, `y`) is already a leaf of `g` of the same type is read from it (a harness that
/// declares its inputs first, as the gradient checks do). For tests and tools; models come
/// from [`import`].
pub fn trace_forward(
    g: &mut Graph,
    bytes: &[u8],
    opts: &ImportOptions,
) -> Result<(IndexMap<String, NodeId>, IndexMap<String, Weight>)> {
    let model = read::decode_model(bytes, "model")?;
    let p = prepare(&model, read::DataDir(None), opts, false)?;
    let weights = RefCell::new(IndexMap::new());
    let outs = p.trace(g, opts, &weights, false)?;
    Ok((outs, weights.into_inner()))
}

/// The static type of a data input.
fn input_type(v: &proto::ValueInfoProto, opts: &ImportOptions) -> Result<TensorType> {
    use proto::tensor_shape_proto::dimension::Value as D;
    use proto::type_proto::Value as T;
    let bad = |reason: String| OnnxError::Options(format!("input {:?}: {reason}", v.name()));
    let Some(T::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(bad(
            "is not a tensor (Ingot imports tensor inputs only)".into()
        ));
    };
    let dtype = read::dtype_of(t.elem_type(), opts.float).map_err(bad)?;
    let shape = t
        .shape
        .as_ref()
        .ok_or_else(|| bad("has no shape in the file (export with input shapes)".into()))?;
    let mut dims = Vec::new();
    for (axis, d) in shape.dim.iter().enumerate() {
        let size = match &d.value {
            Some(D::DimValue(s)) if *s > 0 => {
                if axis == 0 {
                    if let Some(b) = opts.batch.filter(|&b| b as i64 != *s) {
                        return Err(OnnxError::FixedBatch {
                            input: v.name().to_string(),
                            fixed: *s,
                            asked: b,
                        });
                    }
                }
                *s as usize
            }
            Some(D::DimParam(p)) if axis == 0 && opts.batch.is_some() => {
                let _ = p;
                opts.batch.expect("checked")
            }
            Some(D::DimParam(p)) => match opts.dims.get(p) {
                Some(&s) if s > 0 => s,
                _ => {
                    return Err(bad(format!(
                        "axis {axis} is symbolic ({p:?}); Ingot plans static shapes: give its size ({})",
                        if axis == 0 { "--batch N".to_string() } else { format!("a size for {p:?}") }
                    )))
                }
            },
            _ => {
                return Err(bad(format!(
                    "axis {axis} has no size (neither a value nor a name)"
                )))
            }
        };
        dims.push(size);
    }
    Ok(TensorType::new(Shape::new(&dims), dtype))
}

impl Prepared<'_> {
    /// Traces the model into `g`: leaves, every node, and with `loss` the loss as output
    /// `loss`. Returns the ONNX graph outputs that are nodes, by name.
    fn trace(
        &self,
        g: &mut Graph,
        opts: &ImportOptions,
        weights: &RefCell<IndexMap<String, Weight>>,
        loss: bool,
    ) -> Result<IndexMap<String, NodeId>> {
        let graph = self.graph;
        let mut env: HashMap<String, Val> = HashMap::new();
        for ((onnx, ingot), ty) in self.inputs.iter().zip(&self.input_types) {
            let id = match g.leaf(ingot) {
                Some(id) if g.ty(id) == ty => id,
                Some(id) => {
                    return Err(OnnxError::Options(format!(
                        "input {onnx:?} is {ty}, but the graph's {ingot} is {}",
                        g.ty(id)
                    )))
                }
                None => match id_rows(graph, &self.leaf_types, onnx) {
                    Some(rows) if ty.dtype.is_int() => {
                        g.ids_input(ingot, ty.shape.clone(), ty.dtype, rows as u64)?
                    }
                    _ => g.input(ingot, ty.shape.clone(), ty.dtype)?,
                },
            };
            env.insert(onnx.clone(), Val::Node(id));
        }
        for (name, c) in &self.fixed {
            env.insert(name.clone(), Val::Const(c.clone()));
        }
        let mut w = weights.borrow_mut();
        // The leaves' bytes move into the weights the first time (a second trace, of the
        // other mode, finds them there).
        let bytes_of = |n: &str| self.leaf_bytes.borrow_mut().remove(n).unwrap_or_default();
        // Parameters in the file's order, then state.
        for t in &graph.initializer {
            let n = t.name();
            let Some((dtype, dims)) = self.leaf_types.get(n) else {
                continue;
            };
            if self.state.iter().any(|s| s == n) {
                continue;
            }
            let id = g.parameter(n, Shape::new(dims), *dtype, Init::Zeros)?;
            w.entry(n.to_string()).or_insert_with(|| Weight {
                kind: LeafKind::Parameter,
                constant: false,
                ty: g.ty(id).clone(),
                bytes: bytes_of(n),
            });
            env.insert(n.to_string(), Val::Node(id));
        }
        for n in &self.state {
            let (dtype, dims) = &self.leaf_types[n];
            // A running variance starts at one, as PyTorch's does, where no weights are loaded.
            let init = if self.variances.contains(n) {
                Init::Ones
            } else {
                Init::Zeros
            };
            let id = g.state(n, Shape::new(dims), *dtype, init)?;
            w.entry(n.to_string()).or_insert_with(|| Weight {
                kind: LeafKind::State,
                constant: false,
                ty: g.ty(id).clone(),
                bytes: bytes_of(n),
            });
            env.insert(n.to_string(), Val::Node(id));
        }
        for (name, c) in &self.consts {
            env.entry(name.clone())
                .or_insert_with(|| Val::Const(c.clone()));
        }
        let mut l = Lower {
            g,
            float: opts.float,
            dir: self.dir.clone(),
            env,
            constants: IndexMap::new(),
            used: graph
                .node
                .iter()
                .flat_map(|n| n.input.iter().cloned())
                .chain(graph.output.iter().map(|o| o.name().to_string()))
                .collect(),
            uniforms: HashMap::new(),
            bernoulli: HashMap::new(),
            sequences: HashMap::new(),
            padding: &self.padding,
        };
        for &i in &self.order {
            let n: &NodeProto = &graph.node[i];
            let name = attrs::node_name(n, i);
            let prev = l.g.set_scope(Origin::new(&name));
            let out = l.lower(n, &name);
            l.g.set_scope(prev);
            let out = out.map_err(|reason| OnnxError::Node {
                op_type: n.op_type().to_string(),
                node: name.clone(),
                reason,
            })?;
            for (k, o) in n.output.iter().enumerate() {
                // An output nothing reads (a Dropout's mask, as PyTorch's exporter declares
                // it) need not be computed.
                if o.is_empty()
                    || (out.get(k).is_none()
                        && (!l.used.contains(o) || l.sequences.contains_key(o)))
                {
                    continue;
                }
                let v = out.get(k).cloned().ok_or_else(|| OnnxError::Node {
                    op_type: n.op_type().to_string(),
                    node: name.clone(),
                    reason: format!("output {k} ({o:?}) is not one Ingot computes"),
                })?;
                l.env.insert(o.clone(), v);
            }
        }
        let mut outs = IndexMap::new();
        for o in &graph.output {
            if let Some(Val::Node(id)) = l.env.get(o.name()) {
                outs.insert(o.name().to_string(), *id);
            }
        }
        if loss {
            let id = attach_loss(&mut l, graph, opts)?;
            l.g.set_output("loss", id)?;
        }
        for (name, (ty, bytes)) in std::mem::take(&mut l.constants) {
            w.entry(name).or_insert(Weight {
                kind: LeafKind::State,
                constant: true,
                ty,
                bytes,
            });
        }
        // The weights map lists parameters first.
        w.sort_by(|_, a, _, b| {
            (a.kind != LeafKind::Parameter).cmp(&(b.kind != LeafKind::Parameter))
        });
        Ok(outs)
    }
}

/// The rows of the tables an integer data input indexes: the fewest of any initializer a
/// `Gather` (axis 0) reads at the input's ids, through views (Reshape, Flatten, Squeeze,
/// Unsqueeze, Identity). Declared on the input (`Init::Ids`), so that a batch is checked
/// against the embedding it indexes rather than the first matrix the file lists (PyTorch's
/// dynamo exporter lists GPT-2's tied token embedding after the position embedding).
fn id_rows(
    graph: &proto::GraphProto,
    leaf_types: &HashMap<String, (DType, Vec<usize>)>,
    input: &str,
) -> Option<usize> {
    let mut names: HashSet<&str> = HashSet::from([input]);
    // Views of views, in any node order.
    let mut grew = true;
    while grew {
        grew = false;
        for n in &graph.node {
            let view = matches!(
                n.op_type(),
                "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity"
            );
            if view && n.input.first().is_some_and(|i| names.contains(i.as_str())) {
                if let Some(o) = n.output.first() {
                    grew |= names.insert(o.as_str());
                }
            }
        }
    }
    graph
        .node
        .iter()
        .filter(|n| {
            n.op_type() == "Gather"
                && attrs::Attrs(&n.attribute).int("axis", 0) == 0
                && n.input.get(1).is_some_and(|i| names.contains(i.as_str()))
        })
        .filter_map(|n| leaf_types.get(n.input.first()?)?.1.first().copied())
        .min()
}

fn output_node(
    l: &mut Lower,
    graph: &proto::GraphProto,
    want: Option<&str>,
    what: &str,
) -> Result<NodeId> {
    let outs: Vec<&str> = graph.output.iter().map(|o| o.name()).collect();
    let name = match want {
        Some(n) => n.to_string(),
        None if outs.len() == 1 => outs[0].to_string(),
        None => {
            return Err(OnnxError::Options(format!(
                "the graph has outputs {outs:?}: name the {what} output"
            )))
        }
    };
    let v = l.env.get(&name).cloned().ok_or_else(|| {
        OnnxError::Options(format!(
            "no value is named {name:?} (the graph's outputs are {outs:?})"
        ))
    })?;
    match v {
        Val::Node(id) => Ok(id),
        Val::Const(_) => Err(OnnxError::Options(format!(
            "output {name:?} is a constant: it does not depend on the parameters"
        ))),
    }
}

/// `d` without axis `axis`.
fn without_axis(d: &[usize], axis: usize) -> Vec<usize> {
    d.iter()
        .enumerate()
        .filter(|&(a, _)| a != axis)
        .map(|(_, &s)| s)
        .collect()
}

/// The class axis of cross-entropy logits of dims `d` ([`ClassAxis`]): 1 or the last.
fn class_axis(d: &[usize], opts: &ImportOptions) -> Result<usize> {
    let last = d.len() - 1;
    if last == 1 {
        return Ok(1);
    }
    match opts.class_axis {
        ClassAxis::Last => return Ok(last),
        ClassAxis::Second => return Ok(1),
        ClassAxis::FromLabels => {}
    }
    let readings = format!(
        "axis 1 (PyTorch's CrossEntropyLoss layout [N, C, ..]: {} classes, labels {:?}) or the last axis (a token model's [N, S, V]: {} classes, labels {:?})",
        d[1],
        without_axis(d, 1),
        d[last],
        without_axis(d, last)
    );
    let Some(labels) = &opts.labels_shape else {
        return Err(OnnxError::Options(format!(
            "cross-entropy on logits {d:?}: the classes are on {readings}; say which with --class-axis 1|last (ImportOptions::class_axis), or give the labels (a --data file with y) to decide by their shape"
        )));
    };
    let fits: Vec<usize> = [1, last]
        .into_iter()
        .filter(|&a| &without_axis(d, a) == labels)
        .collect();
    match fits.as_slice() {
        [a] => Ok(*a),
        [] => Err(OnnxError::Options(format!(
            "cross-entropy on logits {d:?}: labels {labels:?} fit neither {readings}"
        ))),
        _ => Err(OnnxError::Options(format!(
            "cross-entropy on logits {d:?} with labels {labels:?}: both readings fit, {readings}; say which with --class-axis 1|last (ImportOptions::class_axis)"
        ))),
    }
}

fn attach_loss(l: &mut Lower, graph: &proto::GraphProto, opts: &ImportOptions) -> Result<NodeId> {
    let scalar_float = |l: &Lower, id: NodeId| {
        let t = l.g.ty(id);
        t.shape.rank() == 0 && t.dtype.is_float()
    };
    match &opts.loss {
        Loss::Auto | Loss::Output(_) => {
            let want = match &opts.loss {
                Loss::Output(n) => Some(n.clone()),
                _ => {
                    let cands: Vec<String> = graph
                        .output
                        .iter()
                        .map(|o| o.name().to_string())
                        .filter(
                            |n| matches!(l.env.get(n), Some(Val::Node(id)) if scalar_float(l, *id)),
                        )
                        .collect();
                    if cands.iter().any(|c| c == "loss") {
                        Some("loss".to_string())
                    } else if cands.len() == 1 {
                        Some(cands[0].clone())
                    } else {
                        return Err(OnnxError::Options(format!(
                            "the graph has {} scalar float outputs ({cands:?}): name the loss, or ask for a cross-entropy or mse loss on an output",
                            cands.len()
                        )));
                    }
                }
            };
            let id = output_node(l, graph, want.as_deref(), "loss")?;
            if !scalar_float(l, id) {
                return Err(OnnxError::Options(format!(
                    "output {:?} is {}, not a float scalar: ask for a cross-entropy or mse loss on it",
                    want.unwrap_or_default(),
                    l.g.ty(id)
                )));
            }
            Ok(id)
        }
        Loss::CrossEntropy { logits } => {
            let z = output_node(l, graph, logits.as_deref(), "logits")?;
            let t = l.g.ty(z).clone();
            if t.shape.rank() < 2 || !t.dtype.is_float() {
                return Err(OnnxError::Options(format!(
                    "cross-entropy needs float logits [N, C, ..] or [N, .., C], got {t}"
                )));
            }
            let d = t.shape.dims().to_vec();
            let axis = class_axis(&d, opts)?;
            let classes = d[axis];
            let lead = without_axis(&d, axis);
            let rows: usize = lead.iter().product();
            // The labels declare their range: the class count (BERT's tied head leaves no
            // parameter whose rows say it).
            let y = l.g.ids_input(
                "y",
                Shape::new(&lead),
                ingot_compiler::model::ID_DTYPE,
                classes as u64,
            )?;
            // Axis 1 moved last: each row of [rows, C] is one position's logits.
            let zc = if axis == d.len() - 1 {
                z
            } else {
                let mut perm: Vec<usize> = (0..d.len()).filter(|&a| a != axis).collect();
                perm.push(axis);
                l.g.transpose(z, &perm)?
            };
            let z2 = l.g.reshape(zc, [rows, classes])?;
            let y2 = l.g.reshape(y, [rows])?;
            Ok(l.g.scoped("loss", |g| nn::softmax_cross_entropy(g, z2, y2))?)
        }
        Loss::Forward => unreachable!("no loss is attached without one"),
        Loss::Mse { output } => {
            let z = output_node(l, graph, output.as_deref(), "mse")?;
            let t = l.g.ty(z).clone();
            if !t.dtype.is_float() {
                return Err(OnnxError::Options(format!(
                    "mse needs a float output, got {t}"
                )));
            }
            let y = l.g.input("y", t.shape.clone(), t.dtype)?;
            let loss = l.g.scoped("loss", |g| -> ingot_compiler::Result<NodeId> {
                let d = g.sub(z, y)?;
                let sq = g.mul(d, d)?;
                let s = g.sum_all(sq)?;
                g.mul_scalar(s, 1.0 / t.shape.numel().max(1) as f64)
            })?;
            Ok(loss)
        }
    }
}
