//! A node's attributes, read by name with ONNX's defaults, and the static check of which ops
//! and attribute values Ingot imports ([`check_node`]): run over every node before anything is
//! traced, so that one error lists every node that cannot be imported.

use crate::proto::{AttributeProto, NodeProto, TensorProto};

/// The attributes of one node.
pub struct Attrs<'a>(pub &'a [AttributeProto]);

impl<'a> Attrs<'a> {
    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.0.iter().find(|a| a.name() == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).map_or(default, |a| a.i())
    }

    pub fn float(&self, name: &str, default: f64) -> f64 {
        self.get(name).map_or(default, |a| a.f() as f64)
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }

    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.get(name).map(|a| a.floats.clone())
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        self.get(name).map_or(default.to_string(), |a| {
            String::from_utf8_lossy(a.s()).into_owned()
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&'a TensorProto> {
        self.get(name).and_then(|a| a.t.as_ref())
    }
}

/// The node's name for messages: its own, else `#index` (its place in the file).
pub fn node_name(n: &NodeProto, index: usize) -> String {
    if n.name().is_empty() {
        format!("#{index}")
    } else {
        n.name().to_string()
    }
}

/// Attributes each supported op accepts (ONNX's names; anything else is refused, since an
/// attribute Ingot ignored could change what the node computes).
fn known_attributes(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "Conv" => &[
            "auto_pad",
            "dilations",
            "group",
            "kernel_shape",
            "pads",
            "strides",
        ],
        "BatchNormalization" => &["epsilon", "momentum", "training_mode"],
        "MaxPool" => &[
            "auto_pad",
            "ceil_mode",
            "dilations",
            "kernel_shape",
            "pads",
            "storage_order",
            "strides",
        ],
        "AveragePool" => &[
            "auto_pad",
            "ceil_mode",
            "count_include_pad",
            "dilations",
            "kernel_shape",
            "pads",
            "strides",
        ],
        "Gemm" => &["alpha", "beta", "transA", "transB"],
        "Flatten" | "Concat" | "Softmax" | "LogSoftmax" | "Gather" => &["axis"],
        "Split" => &["axis", "num_outputs", "split"],
        "Reshape" => &["allowzero"],
        "Transpose" => &["perm"],
        "Dropout" => &["seed"],
        "Squeeze" | "Unsqueeze" => &["axes"],
        "Constant" => &[
            "value",
            "value_float",
            "value_floats",
            "value_int",
            "value_ints",
        ],
        "Shape" => &["start", "end"],
        "ConstantOfShape" => &["value"],
        "Cast" => &["to", "saturate"],
        "LayerNormalization" => &["axis", "epsilon", "stash_type"],
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => {
            &["axes", "keepdims", "noop_with_empty_axes"]
        }
        "Clip" => &["min", "max"],
        "HardSigmoid" => &["alpha", "beta"],
        "LeakyRelu" => &["alpha"],
        "Gelu" => &["approximate"],
        "Einsum" => &["equation"],
        "Mod" => &["fmod"],
        "ConvTranspose" => &[
            "auto_pad",
            "dilations",
            "group",
            "kernel_shape",
            "output_padding",
            "pads",
            "strides",
        ],
        "Resize" => &[
            "antialias",
            "coordinate_transformation_mode",
            "cubic_coeff_a",
            "exclude_outside",
            "extrapolation_value",
            "mode",
            "nearest_mode",
            "keep_aspect_ratio_policy",
        ],
        "GatherElements" => &["axis"],
        "RandomUniformLike" => &["dtype", "high", "low", "seed"],
        "Trilu" => &["upper"],
        "Pad" => &["mode", "pads", "value"],
        "SplitToSequence" => &["axis", "keepdims"],
        "GatherND" => &["batch_dims"],
        "Attention" => &[
            "is_causal",
            "kv_num_heads",
            "q_num_heads",
            "qk_matmul_output_mode",
            "scale",
            "softcap",
            "softmax_precision",
        ],
        "Relu" | "GlobalAveragePool" | "GlobalMaxPool" | "MatMul" | "Add" | "Sub" | "Mul"
        | "Div" | "Max" | "Min" | "Neg" | "Exp" | "Log" | "Sqrt" | "Tanh" | "Sigmoid"
        | "Reciprocal" | "Abs" | "Pow" | "Identity" | "Slice" | "Size" | "Range" | "Expand"
        | "Where" | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "Not"
        | "And" | "Or" | "HardSwish" | "Softplus" | "Floor" | "Ceil" | "CastLike" | "Erf"
        | "IsNaN" | "SequenceAt" => &[],
        _ => return None,
    })
}

/// Why an op ONNX defines has no import, and what Ingot would need for one.
fn missing(op: &str) -> String {
    match op {
        "Upsample" => "is deprecated since opset 10 (export with a newer opset: Resize is imported)".into(),
        "LSTM" | "GRU" | "RNN" | "Loop" | "Scan" | "If" => "needs control flow or a recurrent op; Ingot plans a static graph of primitives".into(),
        "ArgMax" | "ArgMin" | "TopK" | "NonZero" | "Unique" => "needs an index-producing primitive (argmax/top-k), which Ingot's IR lacks".into(),
        "Tile" => "needs a tile primitive (Expand of size-1 axes is imported)".into(),
        "InstanceNormalization" | "GroupNormalization" => "needs its reduction written out; not mapped yet (LayerNormalization and BatchNormalization are)".into(),
        _ => "no mapping onto Ingot's primitives yet".into(),
    }
}

/// The op types Ingot imports (some only on constants: `Shape`, `Range`, `ConstantOfShape`,
/// `Floor`, `Ceil` and the like are folded while importing).
pub const SUPPORTED: &[&str] = &[
    "Conv",
    "BatchNormalization",
    "MaxPool",
    "AveragePool",
    "Gemm",
    "Flatten",
    "Concat",
    "Softmax",
    "LogSoftmax",
    "Gather",
    "Split",
    "Reshape",
    "Transpose",
    "Dropout",
    "Squeeze",
    "Unsqueeze",
    "Constant",
    "Shape",
    "ConstantOfShape",
    "Cast",
    "LayerNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "Clip",
    "HardSigmoid",
    "LeakyRelu",
    "Gelu",
    "Einsum",
    "Trilu",
    "Relu",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "MatMul",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Tanh",
    "Sigmoid",
    "Reciprocal",
    "Abs",
    "Pow",
    "Identity",
    "Slice",
    "Size",
    "Range",
    "Expand",
    "Where",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "Not",
    "And",
    "Or",
    "HardSwish",
    "Softplus",
    "Floor",
    "Ceil",
    "CastLike",
    "Erf",
    "IsNaN",
    "Mod",
    "GatherElements",
    "RandomUniformLike",
    "ConvTranspose",
    "Resize",
    "Pad",
    "SplitToSequence",
    "SequenceAt",
    "GatherND",
    "Attention",
];

/// Whether Ingot imports node `n`, judged from its op type and attributes alone (shapes and
/// constant inputs are checked while tracing); the reason otherwise.
pub fn check_node(n: &NodeProto) -> Result<(), String> {
    let op = n.op_type();
    if !(n.domain().is_empty() || n.domain() == "ai.onnx") {
        return Err(format!(
            "op of the custom domain {:?}: Ingot imports ONNX's standard operators only",
            n.domain()
        ));
    }
    let Some(known) = known_attributes(op) else {
        return Err(missing(op));
    };
    for a in &n.attribute {
        if !known.contains(&a.name()) {
            return Err(format!(
                "attribute {:?} is not one Ingot reads for {op} ({}), and it could change the result",
                a.name(),
                if known.is_empty() { "it takes none".to_string() } else { known.join(", ") }
            ));
        }
    }
    let at = Attrs(&n.attribute);
    let auto_pad = at.string("auto_pad", "NOTSET");
    let refuse = |what: String| Err(what);
    match op {
        "Conv" | "MaxPool" | "AveragePool"
            if !matches!(auto_pad.as_str(), "NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER") =>
        {
            refuse(format!("auto_pad {auto_pad:?} is not an ONNX value"))
        }
        "MaxPool" | "AveragePool" if at.int("ceil_mode", 0) != 0 => {
            refuse("ceil_mode=1 needs a window that overhangs the image's edge (export with ceil_mode=False)".into())
        }
        "MaxPool" if at.int("storage_order", 0) != 0 => {
            refuse("storage_order=1 (column-major indices) is not supported".into())
        }
        "MaxPool" if n.output.len() > 1 && !n.output[1].is_empty() => {
            refuse("its Indices output needs an argmax primitive".into())
        }
        "AveragePool" if at.ints("dilations").is_some_and(|d| d.iter().any(|&x| x != 1)) => {
            refuse("dilated average pooling is not supported".into())
        }
        "Gelu" if !matches!(at.string("approximate", "none").as_str(), "none" | "tanh") => refuse(
            format!("approximate {:?} is not an ONNX value (none or tanh)", at.string("approximate", "none")),
        ),
        "ConvTranspose" if auto_pad != "NOTSET" => {
            refuse(format!("auto_pad {auto_pad:?}: Ingot imports ConvTranspose with explicit pads"))
        }
        "Resize" if at.int("antialias", 0) != 0 => refuse("antialias=1 is not supported".into()),
        "Resize" if at.int("exclude_outside", 0) != 0 => {
            refuse("exclude_outside=1 is not supported".into())
        }
        "Resize"
            if at.string("keep_aspect_ratio_policy", "stretch") != "stretch" =>
        {
            refuse("keep_aspect_ratio_policy other than stretch is not supported".into())
        }
        "Resize" if !matches!(at.string("mode", "nearest").as_str(), "nearest" | "linear") => {
            refuse(format!(
                "mode {:?}: Ingot imports nearest and linear resizing",
                at.string("mode", "nearest")
            ))
        }
        "Attention" if at.float("softcap", 0.0) != 0.0 => {
            refuse("softcap other than 0 is not supported".into())
        }
        "GatherND" if at.int("batch_dims", 0) != 0 => {
            refuse("batch_dims other than 0 is not supported".into())
        }
        "LayerNormalization" if at.int("stash_type", 1) != 1 => {
            refuse("stash_type other than 1 (f32 statistics) is not supported".into())
        }
        "Cast" if at.has("saturate") && at.int("saturate", 1) != 1 => {
            refuse("saturate=0 applies only to float8 types, which Ingot lacks".into())
        }
        "Pad" if !matches!(at.string("mode", "constant").as_str(), "constant" | "reflect" | "edge") => {
            refuse(format!(
                "mode {:?}: Ingot imports constant, reflect and edge padding (wrap would need its slices joined in a ring; not mapped yet)",
                at.string("mode", "constant")
            ))
        }
        _ => Ok(()),
    }
}
