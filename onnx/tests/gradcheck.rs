//! Gradients of imported graphs: autodiff's gradient of `sum(out · w)` with respect to every
//! parameter of the imported model, and to its input `x` (declared as a parameter here), agrees
//! with central finite differences of the reference interpreter in f64
//! (`ingot_ir_tests::gradcheck`).

mod support;

use ingot_compiler::ir::{DType, Init, Shape};
use ingot_compiler::IrError;
use ingot_ir_tests::gradcheck::check;
use ingot_onnx::{trace_forward, ImportOptions};
use support::*;

fn gradcheck_fixture(name: &str) {
    let dir = fixtures().join("ops");
    let bytes = std::fs::read(dir.join(format!("{name}.onnx"))).unwrap();
    let doc = json(&dir.join(format!("{name}.json")));
    let x = tensor(&doc["x"], DType::F64);
    let int_input = x.dtype() == DType::I64;
    let opts = ImportOptions {
        float: DType::F64,
        ..Default::default()
    };
    let fixed = if int_input {
        vec![("x", x.clone())]
    } else {
        vec![]
    };
    check(name, &[], fixed, |g, _| {
        if !int_input {
            // A parameter named `x`: the import reads it as its input, and the check covers it.
            g.parameter("x", Shape::new(x.dims()), DType::F64, Init::Zeros)?;
        }
        let (outs, _) =
            trace_forward(g, &bytes, &opts).map_err(|e| IrError::Invalid(e.to_string()))?;
        Ok(outs["out"])
    });
}

#[test]
fn imported_graphs_have_the_gradients_finite_differences_give() {
    for name in [
        "conv",
        "conv_groups_dilation_stride",
        "conv1d",
        "avgpool1d",
        "batchnorm_train",
        "batchnorm_eval",
        "layer_norm",
        "layer_norm_two_axes",
        "softmax_axis1",
        "log_softmax",
        "gemm",
        "gemm_trans_a",
        "matmul_broadcast_batch",
        "matmul_vector",
        "einsum_bmm",
        "einsum_scores",
        "sigmoid",
        "softplus",
        "hardswish",
        "avgpool_pad_exclude",
        "maxpool",
        "embedding",
        "mlp",
        "cnn",
        "pow",
        "slice",
        "concat_split",
        "shape_folding",
        "reduce_sum_drop",
        "gelu_tanh",
        "gpt",
        "erf",
        "gelu_exact",
        "gelu_erf_pattern",
        "conv_transpose",
        "conv_transpose_unet",
        "conv_transpose_stride1",
        "conv_transpose1d",
        "pad_constant",
        "pad_reflect",
        "pad_edge",
        "pad_axes_crop",
        "pad_reflect_crop",
        "pad_opset13_edge",
        "split_to_sequence",
        "attention_causal",
        // (attention_bool_mask's mask is a bool state leaf, which the check fills with f64
        // values; its forward is ops.rs's against onnxruntime.)
        "gather_nd_const",
        "conv_transpose_groups_dilation",
        "resize_nearest_scales",
        "resize_nearest_sizes",
        "resize_linear",
        "resize_linear_asymmetric",
    ] {
        gradcheck_fixture(name);
    }
}
