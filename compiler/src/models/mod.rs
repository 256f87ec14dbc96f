//! The reference models of reference-models.md, traced into forward graphs.
//!
//! A [`Model`] is a forward graph with two step inputs, `x` and `y`, one output, `loss` (a scalar
//! of the model's float dtype), and the optimizer its training step uses. Autodiff turns it into
//! a training step. Parameters are named and laid out as PyTorch names them, and are declared in
//! a fixed order (the order of reference-models.md), so two builds give equal graphs.
//!
//! Integer inputs (class ids, token ids, targets) are [`ID_DTYPE`], i.e. `i64`: PyTorch's dtype
//! for class and token indices, so a batch saved from PyTorch loads without conversion. (The
//! builder and the layers accept `i32` ids as well.)
//!
//! Models are chosen by name with [`by_name`]: `mlp`, `gpt-mini`, `gpt2`, `gpt2-medium`, `gpt-1.3b`, `cnn`, `resnet18`,
//! `gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..` for any GPT shape,
//! `cnn:batch=..,classes=..,side=..` for the `cnn` at another shape, or
//! `resnet:depth=..,side=..,batch=..,classes=..,width=..` for torchvision's ResNets.

mod cnn;
mod gpt;
pub mod gpt_decode;
mod mlp;
mod optimizer;
mod precision;
mod resnet;
mod spec;

pub use cnn::{cnn, cnn_of, cnn_with, CnnConfig, CNN_BATCH, CNN_CLASSES, CNN_SIDE};
pub use gpt::{gpt, GptConfig, LN_EPS};
pub use mlp::{mlp, mlp_with, MLP_BATCH, MLP_CLASSES, MLP_HIDDEN, MLP_IN};
pub use optimizer::{parse_betas as optimizer_betas, Optimizer, OptimizerKind, OptimizerSettings};
pub use precision::Precision;
pub use resnet::{
    resnet, resnet18, resnet18_with, ResNetConfig, RESNET_BATCH, RESNET_CLASSES, RESNET_SIDE,
};
pub use spec::{at_batch, by_name, by_name_with, min_batch, spec_batch, KNOWN_MODELS};

use crate::error::{IrError, Result};
use crate::ir::{DType, Graph, LeafKind, Mode};

/// The dtype of the integer inputs (`x` of the GPTs, `y` of every model).
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

/// Models train in floats; `f64` is for gradient checks.
fn check_float(spec: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(model_err(
            spec,
            format!("models are built in f32 or f64, not {dtype}"),
        ))
    }
}

/// The product of `dims` times the widest element size (8 bytes), or an error when the tensor's
/// byte size would not fit in a `usize` (so no later pass overflows computing sizes).
fn check_size(spec: &str, what: &str, dims: &[usize]) -> Result<()> {
    dims.iter()
        .try_fold(8usize, |acc, &d| acc.checked_mul(d))
        .map(|_| ())
        .ok_or_else(|| {
            model_err(
                spec,
                format!("{what} {dims:?} is too large: its size overflows"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Shape, TensorType};

    fn param_table(g: &Graph) -> Vec<(String, Vec<usize>)> {
        g.leaves(LeafKind::Parameter)
            .into_iter()
            .map(|id| {
                (
                    g.leaf_name(id).unwrap().to_string(),
                    g.ty(id).shape.dims().to_vec(),
                )
            })
            .collect()
    }

    #[test]
    fn mlp_has_1_863_690_parameters() {
        assert_eq!(parameter_count(&mlp(DType::F32).unwrap().graph), 1_863_690);
    }

    #[test]
    fn gpt_mini_has_21_130_240_parameters() {
        assert_eq!(
            parameter_count(&gpt(&GptConfig::gpt_mini(), DType::F32).unwrap().graph),
            21_130_240
        );
    }

    #[test]
    fn gpt2_has_163_109_376_parameters_and_builds_in_well_under_a_second() {
        let t = std::time::Instant::now();
        let m = gpt(&GptConfig::gpt2(), DType::F32).unwrap();
        let took = t.elapsed();
        assert_eq!(parameter_count(&m.graph), 163_109_376);
        // Only graph construction: no tensor data exists. Generous bound for slow CI machines.
        assert!(took.as_secs_f64() < 5.0, "building gpt2 took {took:?}");
    }

    #[test]
    fn the_larger_gpts_have_the_parameters_their_shapes_give() {
        // Per block 4d² + 2·d·d_ff + 9d + d_ff; wte, wpe, the final norm and the untied head.
        for (name, want) in [("gpt2-medium", 406_382_592), ("gpt-1.3b", 1_416_744_960)] {
            let m = by_name(name).unwrap();
            assert_eq!(parameter_count(&m.graph), want, "{name}");
            assert_eq!(m.name, name, "named by its own name");
        }
        let m = at_batch("gpt-1.3b", 2, DType::F32).unwrap();
        assert_eq!(
            *m.graph.ty(m.graph.leaf("x").unwrap()),
            TensorType::new([2, 1024], ID_DTYPE),
            "--batch builds it at another batch"
        );
    }

    #[test]
    fn mlp_parameters_are_named_and_laid_out_as_pytorch_in_order() {
        let m = mlp(DType::F32).unwrap();
        let want: Vec<(String, Vec<usize>)> = [
            ("fc1.weight", vec![1024, 784]),
            ("fc1.bias", vec![1024]),
            ("fc2.weight", vec![1024, 1024]),
            ("fc2.bias", vec![1024]),
            ("fc3.weight", vec![10, 1024]),
            ("fc3.bias", vec![10]),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
        assert_eq!(param_table(&m.graph), want);
    }

    #[test]
    fn gpt_parameters_are_named_and_laid_out_as_pytorch_in_order() {
        let cfg = GptConfig::gpt_mini();
        let m = gpt(&cfg, DType::F32).unwrap();
        let (v, d, f, s) = (cfg.vocab, cfg.d_model, cfg.d_ff, cfg.seq);
        let mut want: Vec<(String, Vec<usize>)> = vec![
            ("wte.weight".into(), vec![v, d]),
            ("wpe.weight".into(), vec![s, d]),
        ];
        for i in 0..cfg.layers {
            for (n, sh) in [
                ("ln1.weight", vec![d]),
                ("ln1.bias", vec![d]),
                ("qkv.weight", vec![3 * d, d]),
                ("qkv.bias", vec![3 * d]),
                ("proj.weight", vec![d, d]),
                ("proj.bias", vec![d]),
                ("ln2.weight", vec![d]),
                ("ln2.bias", vec![d]),
                ("fc.weight", vec![f, d]),
                ("fc.bias", vec![f]),
                ("fc2.weight", vec![d, f]),
                ("fc2.bias", vec![d]),
            ] {
                want.push((format!("blocks.{i}.{n}"), sh));
            }
        }
        want.push(("lnf.weight".into(), vec![d]));
        want.push(("lnf.bias".into(), vec![d]));
        want.push(("head.weight".into(), vec![v, d]));
        assert_eq!(param_table(&m.graph), want);
    }

    #[test]
    fn every_reference_graph_verifies_with_inputs_x_y_and_a_scalar_loss() {
        for name in ["mlp", "gpt-mini", "gpt2"] {
            let m = by_name(name).unwrap();
            m.graph.verify().unwrap();
            let x = m.graph.leaf("x").unwrap();
            let y = m.graph.leaf("y").unwrap();
            assert_eq!(m.graph.leaves(LeafKind::Input), vec![x, y], "{name}");
            assert_eq!(m.graph.ty(y).dtype, ID_DTYPE);
            assert_eq!(
                m.graph.outputs.keys().collect::<Vec<_>>(),
                ["loss"],
                "{name}"
            );
            assert_eq!(
                *m.graph.ty(m.graph.outputs["loss"]),
                TensorType::new(Shape::scalar(), DType::F32)
            );
            assert_eq!(m.name, name);
        }
    }

    #[test]
    fn reference_inputs_have_the_reference_shapes() {
        let m = by_name("mlp").unwrap();
        assert_eq!(
            *m.graph.ty(m.graph.leaf("x").unwrap()),
            TensorType::new([256, 784], DType::F32)
        );
        assert_eq!(
            *m.graph.ty(m.graph.leaf("y").unwrap()),
            TensorType::new([256], ID_DTYPE)
        );
        let m = by_name("gpt-mini").unwrap();
        assert_eq!(
            *m.graph.ty(m.graph.leaf("x").unwrap()),
            TensorType::new([16, 256], ID_DTYPE)
        );
        assert_eq!(
            *m.graph.ty(m.graph.leaf("y").unwrap()),
            TensorType::new([16, 256], ID_DTYPE)
        );
        let m = by_name("gpt2").unwrap();
        assert_eq!(
            *m.graph.ty(m.graph.leaf("x").unwrap()),
            TensorType::new([8, 1024], ID_DTYPE)
        );
    }

    #[test]
    fn f64_models_verify_and_have_an_f64_loss() {
        let m = mlp_with(4, DType::F64).unwrap();
        m.graph.verify().unwrap();
        assert_eq!(m.graph.ty(m.graph.outputs["loss"]).dtype, DType::F64);
        let cfg =
            GptConfig::parse("vocab=11,d_model=8,layers=2,heads=2,d_ff=16,seq=5,batch=3").unwrap();
        let m = gpt(&cfg, DType::F64).unwrap();
        m.graph.verify().unwrap();
        assert_eq!(m.graph.ty(m.graph.outputs["loss"]).dtype, DType::F64);
    }

    #[test]
    fn models_refuse_integer_dtypes_and_zero_batches() {
        assert!(matches!(mlp(DType::I32), Err(IrError::Model { .. })));
        assert!(matches!(
            gpt(&GptConfig::gpt_mini(), DType::Bool),
            Err(IrError::Model { .. })
        ));
        let e = mlp_with(0, DType::F32).unwrap_err().to_string();
        assert!(e.contains("batch"), "{e}");
    }

    #[test]
    fn optimizers_are_the_reference_ones() {
        assert_eq!(
            by_name("mlp").unwrap().optimizer,
            Optimizer::Sgd { lr: 0.1 }
        );
        let want = Optimizer::AdamW {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        };
        assert_eq!(by_name("gpt-mini").unwrap().optimizer, want);
        assert_eq!(by_name("gpt2").unwrap().optimizer, want);
    }

    #[test]
    fn building_the_same_model_twice_gives_equal_graphs() {
        assert_eq!(by_name("mlp").unwrap(), by_name("mlp").unwrap());
        assert_eq!(by_name("gpt-mini").unwrap(), by_name("gpt-mini").unwrap());
    }

    #[test]
    fn a_custom_gpt_spec_builds_the_shape_it_names() {
        let m = by_name("gpt:vocab=8192,d_model=512,layers=4,heads=8,d_ff=2048,seq=256,batch=16")
            .unwrap();
        assert_eq!(m.graph, by_name("gpt-mini").unwrap().graph);
        assert_eq!(
            m.name,
            "gpt:vocab=8192,d_model=512,layers=4,heads=8,d_ff=2048,seq=256,batch=16"
        );
    }

    #[test]
    fn an_unknown_model_name_lists_the_known_ones() {
        let e = by_name("resnet50").unwrap_err();
        assert!(matches!(e, IrError::Model { .. }));
        let e = e.to_string();
        for k in ["resnet50", "mlp", "gpt-mini", "gpt2", "gpt:"] {
            assert!(e.contains(k), "{e}");
        }
    }
}
