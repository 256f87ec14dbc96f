#!/usr/bin/env python3
"""Writes the ONNX importer's per-op fixtures (onnx/tests/fixtures/): for each case a small
.onnx model built with onnx.helper and a .json beside it holding the input and the outputs
onnxruntime computes for it (the reference the Rust tests compare with, within 1e-5
relative), and the files of the error tests (a cycle, a dangling name, unsupported ops, a
symbolic batch, external data inside and outside the model's folder).

    pip install onnx onnxruntime numpy
    python3 scripts/onnx_op_fixtures.py [OUT_DIR]   # default onnx/tests/fixtures
    ONLY=pad_,split_to_,attention_,gather_nd_ python3 scripts/onnx_op_fixtures.py   # only those cases

Deterministic: fixed seeds, fixed opset (18; 20 for Gelu) and IR version (10).
"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "onnx", "tests", "fixtures")
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def rng(name):
    return np.random.default_rng(abs(hash_name(name)) % (2**32))


def hash_name(s):
    h = 1469598103934665603
    for b in s.encode():
        h = ((h ^ b) * 1099511628211) % (2**64)
    return h


def init(name, shape, r, scale=0.5):
    return numpy_helper.from_array((r.standard_normal(shape) * scale).astype(np.float32), name)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def model(name, nodes, x_shape, outputs, inits=(), x_type=F, opset=18, extra_inputs=()):
    inputs = [helper.make_tensor_value_info("input", x_type, x_shape)] + list(extra_inputs)
    outs = [helper.make_tensor_value_info(o, F, None) for o in outputs]
    g = helper.make_graph(nodes, name, inputs, outs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=11 if opset >= 23 else 10)
    m.producer_name = "scripts/onnx_op_fixtures.py"
    return m


def tensor_json(a):
    a = np.asarray(a)
    kind = "i64" if a.dtype.kind in "iu" else "f32"
    data = [int(v) for v in a.reshape(-1)] if kind == "i64" else [float(v) for v in a.reshape(-1).astype(np.float32)]
    return {"shape": list(a.shape), "dtype": kind, "data": data}


CASES = []


def case(name, nodes, x_shape, outputs=("out",), inits=(), x=None, opset=18, loss="out", **kw):
    CASES.append((name, nodes, x_shape, list(outputs), list(inits), x, opset, loss, kw))


_COUNT = [0]


def N(op, ins, outs, name=None, **attrs):
    """A node; unnamed ones are numbered (names must be unique within a graph)."""
    _COUNT[0] += 1
    return helper.make_node(op, ins, outs, name=name or f"{op.lower()}_{_COUNT[0]}", **attrs)


def build_cases():
    r = rng("cases")
    # The CNN/MLP set.
    case("conv", [N("Conv", ["input", "W", "B"], ["out"], name="conv1", pads=[1, 1, 1, 1])],
         [2, 3, 8, 8], inits=[init("W", [4, 3, 3, 3], r), init("B", [4], r)])
    case("conv_groups_dilation_stride",
         [N("Conv", ["input", "W"], ["out"], group=2, dilations=[2, 2], strides=[2, 2], pads=[2, 2, 2, 2],
            kernel_shape=[3, 3])],
         [2, 4, 9, 9], inits=[init("W", [6, 2, 3, 3], r)])
    case("conv_same_upper", [N("Conv", ["input", "W"], ["out"], auto_pad="SAME_UPPER")],
         [1, 2, 7, 7], inits=[init("W", [3, 2, 3, 3], r)])
    case("conv1d", [N("Conv", ["input", "W", "B"], ["out"], pads=[2, 2], strides=[2], dilations=[2])],
         [2, 3, 11], inits=[init("W", [4, 3, 3], r), init("B", [4], r)])
    case("conv1d_same", [N("Conv", ["input", "W"], ["out"], auto_pad="SAME_UPPER", group=3)],
         [2, 3, 9], inits=[init("W", [3, 1, 5], r)])
    case("maxpool1d", [N("MaxPool", ["input"], ["out"], kernel_shape=[3], strides=[2], pads=[1, 1])], [2, 3, 10])
    case("avgpool1d", [N("AveragePool", ["input"], ["out"], kernel_shape=[3], strides=[2], pads=[1, 1])],
         [2, 3, 10])
    bn = [init("bn.weight", [3], r), init("bn.bias", [3], r),
          numpy_helper.from_array(r.standard_normal(3).astype(np.float32) * 0.1, "bn.running_mean"),
          numpy_helper.from_array((r.random(3) + 0.5).astype(np.float32), "bn.running_var")]
    case("batchnorm_train",
         [N("BatchNormalization", ["input", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["out", "rm", "rv"], name="bn", training_mode=1, momentum=0.9, epsilon=1e-5)],
         [4, 3, 5, 5], outputs=["out", "rm", "rv"], inits=bn)
    case("batchnorm_eval",
         [N("BatchNormalization", ["input", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["out"], name="bn")],
         [4, 3, 5, 5], inits=bn)
    for op in ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Softplus", "HardSigmoid", "HardSwish"]:
        case(op.lower(), [N(op, ["input"], ["out"])], [3, 7])
    case("leaky_relu", [N("LeakyRelu", ["input"], ["out"], alpha=0.2)], [3, 7])
    case("sigmoid_wide", [N("Sigmoid", ["input"], ["out"])], [2, 5],
         x=np.array([[-100, -20, -1, 0, 1], [2, 20, 100, -0.5, 0.5]], dtype=np.float32))
    sq = [N("Mul", ["input", "input"], ["sq"]), N("Add", ["sq", "one"], ["pos"])]
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    for op in ["Log", "Sqrt", "Reciprocal"]:
        case(op.lower(), sq + [N(op, ["pos"], ["out"])], [3, 7], inits=[one])
    case("maxpool", [N("MaxPool", ["input"], ["out"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         [2, 3, 8, 8])
    case("avgpool_pad_exclude",
         [N("AveragePool", ["input"], ["out"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         [2, 3, 8, 8])
    case("avgpool_pad_include",
         [N("AveragePool", ["input"], ["out"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
            count_include_pad=1)],
         [2, 3, 6, 6])
    case("avgpool", [N("AveragePool", ["input"], ["out"], kernel_shape=[2, 2], strides=[2, 2])], [2, 3, 8, 8])
    case("global_avgpool", [N("GlobalAveragePool", ["input"], ["out"])], [2, 3, 5, 5])
    case("global_maxpool", [N("GlobalMaxPool", ["input"], ["out"])], [2, 3, 5, 5])
    case("gemm", [N("Gemm", ["input", "fc.weight", "fc.bias"], ["out"], name="fc", transB=1, alpha=0.5, beta=2.0)],
         [4, 6], inits=[init("fc.weight", [5, 6], r), init("fc.bias", [5], r)])
    case("gemm_listed_parameters",
         [N("Gemm", ["input", "fc.weight", "fc.bias"], ["out"], name="fc", transB=1)],
         [4, 6], inits=[init("fc.weight", [5, 6], r), init("fc.bias", [5], r)],
         meta={"ingot.parameters": "fc.weight"})
    case("gemm_trans_a", [N("Gemm", ["input", "W"], ["out"], transA=1)], [6, 4], inits=[init("W", [6, 3], r)])
    case("matmul_batched_2d_weight", [N("MatMul", ["input", "W"], ["out"])], [2, 3, 4, 5],
         inits=[init("W", [5, 6], r)])
    case("matmul_broadcast_batch", [N("MatMul", ["input", "W"], ["out"])], [2, 1, 4, 5],
         inits=[init("W", [3, 5, 2], r)])
    case("matmul_vector", [N("MatMul", ["input", "W"], ["out"])], [3, 5], inits=[init("W", [5], r)])
    for op in ["Add", "Sub", "Mul", "Div"]:
        b = init("b", [1, 4], r) if op != "Div" else numpy_helper.from_array(
            (r.random([1, 4]) + 0.5).astype(np.float32), "b")
        case(op.lower() + "_broadcast", [N(op, ["input", "b"], ["out"])], [3, 4], inits=[b])
    case("max_min", [N("Max", ["input", "b"], ["m"]), N("Min", ["m", "c"], ["out"])], [3, 4],
         inits=[init("b", [4], r), init("c", [3, 1], r)])
    case("flatten", [N("Flatten", ["input"], ["out"], axis=2)], [2, 3, 4, 5])
    case("reshape", [N("Reshape", ["input", "shape"], ["out"])], [2, 3, 4],
         inits=[ints("shape", [0, -1, 2])])
    case("transpose", [N("Transpose", ["input"], ["out"], perm=[2, 0, 1])], [2, 3, 4])
    case("identity_dropout_eval",
         [N("Identity", ["input"], ["i"]), N("Dropout", ["i", "ratio"], ["out"], name="drop")], [3, 4],
         inits=[numpy_helper.from_array(np.array(0.3, dtype=np.float32), "ratio")])
    case("softmax_axis1", [N("Softmax", ["input"], ["out"], axis=1)], [2, 3, 4])
    case("log_softmax", [N("LogSoftmax", ["input"], ["out"])], [2, 3, 4])
    case("concat_split",
         [N("Split", ["input", "sizes"], ["a", "b"], axis=1), N("Concat", ["b", "a"], ["out"], axis=1)],
         [2, 5, 3], inits=[ints("sizes", [2, 3])])
    case("split_equal", [N("Split", ["input"], ["a", "b"], axis=2, num_outputs=2),
                         N("Sub", ["a", "b"], ["out"])], [2, 3, 4])
    case("slice", [N("Slice", ["input", "st", "en", "ax"], ["out"])], [4, 6, 5],
         inits=[ints("st", [1, -4]), ints("en", [3, 9223372036854775807]), ints("ax", [0, 1])])
    case("squeeze_unsqueeze",
         [N("Unsqueeze", ["input", "ax"], ["u"]), N("Squeeze", ["u", "ax2"], ["out"])], [3, 1, 4],
         inits=[ints("ax", [0, 3]), ints("ax2", [0, 2])])
    # Shape arithmetic folded at import: x.view(x.size(0), -1) as PyTorch exports it, and more.
    case("shape_folding", [
        N("Shape", ["input"], ["s"]),
        N("Gather", ["s", "zero"], ["n"], axis=0),
        N("Unsqueeze", ["n", "ax0"], ["n1"]),
        N("Concat", ["n1", "minus1"], ["shape"], axis=0),
        N("Reshape", ["input", "shape"], ["flat"]),
        N("Shape", ["flat"], ["fs"], start=-1),
        N("Cast", ["fs"], ["fsf"], to=F),
        N("ConstantOfShape", ["fs"], ["ones"], value=helper.make_tensor("v", F, [1], [1.0])),
        N("Range", ["r0", "r1", "r2"], ["rng"]),
        N("Cast", ["rng"], ["rngf"], to=F),
        N("Add", ["ones", "rngf"], ["row"]),
        N("Div", ["row", "fsf"], ["scaled"]),
        N("Mul", ["flat", "scaled"], ["out"]),
    ], [2, 3, 4], inits=[ints("zero", 0), ints("ax0", [0]), ints("minus1", [-1]),
                         ints("r0", 0), ints("r1", 12), ints("r2", 1)])
    case("constant_expand", [
        N("Constant", [], ["c"], value=helper.make_tensor("c", F, [3, 1], [1.0, 2.0, 3.0])),
        N("Expand", ["c", "shape"], ["e"]),
        N("Mul", ["input", "e"], ["out"]),
    ], [3, 4], inits=[ints("shape", [3, 4])])
    # The transformer set.
    case("layer_norm", [N("LayerNormalization", ["input", "ln.weight", "ln.bias"], ["out"], name="ln",
                          epsilon=1e-5)], [2, 3, 8], inits=[init("ln.weight", [8], r), init("ln.bias", [8], r)])
    case("layer_norm_two_axes", [N("LayerNormalization", ["input", "g"], ["out"], axis=1)], [2, 3, 4],
         inits=[init("g", [3, 4], r)])
    case("reduce_mean_keep", [N("ReduceMean", ["input", "ax"], ["out"])], [2, 3, 4], inits=[ints("ax", [1])])
    case("reduce_sum_drop", [N("ReduceSum", ["input", "ax"], ["out"], keepdims=0)], [2, 3, 4],
         inits=[ints("ax", [0, 2])])
    case("reduce_max_all", [N("ReduceMax", ["input"], ["out"], keepdims=0)], [2, 3, 4])
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    half = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half")
    case("pow", sq + [N("Pow", ["pos", "two"], ["p2"]), N("Pow", ["pos", "half"], ["p5"]),
                      N("Add", ["p2", "p5"], ["out"])], [3, 5], inits=[one, two, half])
    case("where_compare", [
        N("Less", ["input", "zero_f"], ["neg"]), N("Not", ["neg"], ["pos"]),
        N("Equal", ["input", "input"], ["same"]),
        N("Where", ["pos", "input", "zero_f"], ["w"]),
        N("Cast", ["same"], ["samef"], to=F),
        N("Add", ["w", "samef"], ["out"])], [3, 5],
         inits=[numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero_f")])
    case("clip", [N("Clip", ["input", "lo", "hi"], ["out"])], [3, 5],
         inits=[numpy_helper.from_array(np.array(-0.5, dtype=np.float32), "lo"),
                numpy_helper.from_array(np.array(0.7, dtype=np.float32), "hi")])
    case("gelu_tanh", [N("Gelu", ["input"], ["out"], approximate="tanh")], [3, 5], opset=20)
    case("einsum_bmm", [N("Einsum", ["input", "W"], ["out"], equation="bij,bjk->bik")], [2, 3, 4],
         inits=[init("W", [2, 4, 5], r)])
    case("einsum_scores", [N("Einsum", ["input", "K"], ["out"], equation="bhid,bhjd->bhij")], [1, 2, 3, 4],
         inits=[init("K", [1, 2, 5, 4], r)])
    case("embedding", [N("Gather", ["wte.weight", "input"], ["out"], name="wte")], [2, 5],
         inits=[init("wte.weight", [10, 4], r)], x_type=I64,
         x=np.array([[0, 3, 9, 3, 1], [2, 2, 7, 5, 0]], dtype=np.int64))
    case("gather_axis1_const", [N("Gather", ["input", "idx"], ["out"], axis=1)], [2, 5, 3],
         inits=[ints("idx", [[4, 0], [1, -1]])])
    case("gather_scalar_index", [N("Gather", ["input", "idx"], ["out"], axis=1)], [2, 5, 3],
         inits=[ints("idx", 2)])
    case("trilu_lower", [N("Trilu", ["input", "k"], ["out"], upper=0)], [2, 4, 5], inits=[ints("k", 1)])
    case("trilu_upper", [N("Trilu", ["input"], ["out"])], [4, 4])
    # A causal mask built in the forward pass, as Hugging Face models export it: folded.
    case("causal_mask_folded", [
        N("Shape", ["input"], ["s"]),
        N("Slice", ["s", "m2", "big"], ["tt"]),
        N("ConstantOfShape", ["tt"], ["ones"], value=helper.make_tensor("v", F, [1], [1.0])),
        N("Trilu", ["ones"], ["tri"], upper=0),
        N("Equal", ["tri", "zero_f"], ["masked"]),
        N("Where", ["masked", "neg", "input"], ["out"])], [2, 4, 4],
        inits=[ints("m2", [-2]), ints("big", [9223372036854775807]),
               numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero_f"),
               numpy_helper.from_array(np.array(-1e9, dtype=np.float32), "neg")])
    # A causal mask kept as a bool buffer (nanoGPT's `bias`), imported as two iotas.
    case("causal_mask_buffer", [
        N("Constant", [], ["neg"], value=helper.make_tensor("neg", F, [], [-1e9])),
        N("Where", ["mask", "input", "neg"], ["out"])], [2, 1, 4, 4],
         inits=[numpy_helper.from_array(np.tril(np.ones((4, 4), dtype=bool))[None, None], "mask")])
    # The rest of the comparisons and logic, integer rounding on constants, CastLike, Size,
    # ReduceMin and a variadic Max.
    case("logic_and_rounding", [
        N("Greater", ["input", "lo"], ["g"]), N("LessOrEqual", ["input", "hi"], ["le"]),
        N("And", ["g", "le"], ["band"]), N("GreaterOrEqual", ["input", "hi"], ["ge"]),
        N("Or", ["band", "ge"], ["either"]), N("CastLike", ["either", "input"], ["ef"]),
        N("Size", ["input"], ["n"]), N("CastLike", ["n", "input"], ["nf"]),
        N("Constant", [], ["frac"], value=helper.make_tensor("frac", F, [], [-0.25])),
        N("Floor", ["frac"], ["fl"]), N("Ceil", ["frac"], ["ce"]), N("Add", ["fl", "ce"], ["fc"]),
        N("ReduceMin", ["input", "ax"], ["mn"]),
        N("Max", ["input", "mn", "fc"], ["m3"]),
        N("Div", ["ef", "nf"], ["efn"]),
        N("Add", ["m3", "efn"], ["out"])], [3, 5],
         inits=[numpy_helper.from_array(np.array(-0.3, dtype=np.float32), "lo"),
                numpy_helper.from_array(np.array(0.4, dtype=np.float32), "hi"),
                ints("ax", [1])])
    # Whole small models, with a cross-entropy loss.
    case("mlp", [
        N("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], name="fc1", transB=1),
        N("Relu", ["h"], ["a"], name="relu"),
        N("Gemm", ["a", "fc2.weight", "fc2.bias"], ["out"], name="fc2", transB=1)],
        [4, 6], inits=[init("fc1.weight", [8, 6], r), init("fc1.bias", [8], r),
                       init("fc2.weight", [3, 8], r), init("fc2.bias", [3], r)], loss="ce")
    gpt_case(r)
    case("cnn", [
        N("Conv", ["input", "conv.weight", "conv.bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
          ["b", "rm", "rv"], name="bn", training_mode=1),
        N("Relu", ["b"], ["a"], name="relu"),
        N("MaxPool", ["a"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        N("Flatten", ["p"], ["f"], name="flatten"),
        N("Gemm", ["f", "fc.weight", "fc.bias"], ["out"], name="fc", transB=1)],
        [2, 3, 4, 4], inits=[init("conv.weight", [3, 3, 3, 3], r), init("conv.bias", [3], r)] + bn
        + [init("fc.weight", [5, 12], r), init("fc.bias", [5], r)], loss="ce")
    new_op_cases()
    packed_attention_cases()
    pad_cases()


def pad_cases():
    """Pad (session 44): constant with a value, reflect, edge, negative pads (crops), the
    `axes` input of opset 18 (negative axes), reflect beside a crop, and opset 13's form
    (no `axes`). Their own rng and node names, so the cases above keep their values."""
    r = rng("pad")
    f32 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    mk = helper.make_node
    case("pad_constant", [mk("Pad", ["input", "pads", "cv"], ["out"], name="pad_c", mode="constant")],
         [2, 3, 4, 5], inits=[ints("pads", [0, 1, 2, 0, 1, 0, 1, 3]), f32("cv", -0.7)])
    case("pad_reflect", [mk("Pad", ["input", "pads"], ["out"], name="pad_r", mode="reflect")],
         [2, 3, 5, 6], inits=[ints("pads", [0, 0, 2, 1, 0, 0, 1, 3])])
    case("pad_edge", [mk("Pad", ["input", "pads"], ["out"], name="pad_e", mode="edge")],
         [2, 3, 4], inits=[ints("pads", [0, 2, 1, 1, 0, 3])])
    case("pad_axes_crop", [mk("Pad", ["input", "pads", "", "axes"], ["out"], name="pad_a")],
         [2, 4, 5], inits=[ints("pads", [2, -1, -1, 1]), ints("axes", [-1, 1])])
    case("pad_reflect_crop", [mk("Pad", ["input", "pads", "", "axes"], ["out"], name="pad_rc", mode="reflect")],
         [1, 2, 6, 7], inits=[ints("pads", [-1, 2, 1, -2]), ints("axes", [2, 3])])
    case("pad_opset13_edge", [mk("Pad", ["input", "pads"], ["p"], name="pad_13", mode="edge"),
                              mk("Tanh", ["p"], ["out"], name="tanh_13")],
         [3, 4], inits=[ints("pads", [1, 0, -1, 2])], opset=13)
    # SplitToSequence read by SequenceAt, as PyTorch's dynamo exporter writes `split`: sizes,
    # a scalar chunk size (the last part smaller), and keepdims=0 without a split.
    case("split_to_sequence", [
        mk("SplitToSequence", ["input", "sizes"], ["s1"], name="seq_sizes", axis=1),
        mk("SequenceAt", ["s1", "zero"], ["a"], name="at_0"),
        mk("SequenceAt", ["s1", "minus1"], ["b"], name="at_last"),
        mk("SplitToSequence", ["b", "two"], ["s2"], name="seq_chunks", axis=1),
        mk("SequenceAt", ["s2", "zero"], ["c"], name="at_chunk"),
        mk("Mul", ["a", "c"], ["out"], name="mul"),
        mk("SplitToSequence", ["input"], ["s3"], name="seq_ones", axis=2, keepdims=0),
        mk("SequenceAt", ["s3", "one"], ["d"], name="at_1")],
         [2, 5, 3], outputs=("out", "d"),
         inits=[ints("sizes", [2, 3]), ints("zero", 0), ints("minus1", -1), ints("two", 2), ints("one", 1)])
    # ONNX's Attention (opset 23), as the dynamo exporter writes scaled_dot_product_attention:
    # causal, and with a boolean mask and a scale; GatherND of constants (BERT's token types).
    case("attention_causal", [mk("Mul", ["input", "wk"], ["k"], name="att_k"),
                              mk("Mul", ["input", "wv"], ["v"], name="att_v"),
                              mk("Attention", ["input", "k", "v"], ["out"], name="sdpa_causal", is_causal=1)],
         [2, 2, 4, 3], inits=[init("wk", [3], r), init("wv", [3], r)], opset=23)
    mask = rng("attention_mask").random((4, 5)) < 0.6
    mask[:, 0] = True
    case("attention_bool_mask", [mk("Attention", ["input", "K", "V", "mask"], ["out"], name="sdpa_mask", scale=0.3)],
         [2, 2, 4, 3], inits=[init("K", [2, 2, 5, 3], r), init("V", [2, 2, 5, 3], r),
                              numpy_helper.from_array(mask, "mask")], opset=23)
    case("gather_nd_const", [mk("GatherND", ["table", "rows"], ["g"], name="gnd"),
                             mk("Add", ["input", "g"], ["out"], name="gnd_add")],
         [2, 4], inits=[init("table", [3, 4], r), ints("rows", [[2], [0]])])
    del r


def write_pad_errors():
    """A Pad in wrap mode (opset 19), which Ingot refuses naming the node, and pads it cannot
    compute."""
    d = os.path.join(OUT, "errors")
    g = helper.make_graph(
        [helper.make_node("Pad", ["input", "pads"], ["out"], name="the_wrap_pad", mode="wrap")], "pad_wrap",
        [helper.make_tensor_value_info("input", F, [2, 3])], [helper.make_tensor_value_info("out", F, None)],
        initializer=[ints("pads", [0, 1, 0, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)
    onnx.save(m, os.path.join(d, "pad_wrap.onnx"))
    # Pads Ingot cannot compute: a crop to nothing, a reflection wider than the axis.
    for name, pads, mode in [("pad_crop_all", [0, -2, 0, -1], "constant"), ("pad_reflect_wide", [0, 3, 0, 0], "reflect")]:
        g = helper.make_graph(
            [helper.make_node("Pad", ["input", "pads"], ["out"], name=f"the_{name}", mode=mode)], name,
            [helper.make_tensor_value_info("input", F, [2, 3])], [helper.make_tensor_value_info("out", F, None)],
            initializer=[ints("pads", pads)])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10),
                  os.path.join(d, name + ".onnx"))


def packed_attention_cases():
    """nn.MultiheadAttention's packed projection as torch.onnx (opset 17) exports it in
    torchvision's vit_b_16: one in_proj matmul, `unflatten(-1, (3, E))` written as a Reshape
    to `Concat(shape[:2], [3, E], shape[3:])` where `shape[3:]` is `Slice(Shape, [3],
    [INT64_MAX])`, empty (the slice the H200 run refused), then q, k and v sliced off with
    starts and ends given as Constant nodes, negative, INT64_MAX, from Shape arithmetic; and a
    shape reversed by a step of -1 from INT64_MAX to INT64_MIN. Nodes are made directly
    (named as PyTorch names them), so the numbering of the cases above is unchanged."""
    r = rng("packed_attention")
    imax, imin = 9223372036854775807, -9223372036854775808
    mk = helper.make_node
    cst = lambda out, v: mk("Constant", [], [out], name=f"/attn/{out}",
                            value=numpy_helper.from_array(np.array(v, dtype=np.int64), out))
    nodes = [
        mk("Transpose", ["in_proj_weight"], ["wT"], name="/attn/Transpose", perm=[1, 0]),
        mk("MatMul", ["input", "wT"], ["mm"], name="/attn/MatMul"),
        mk("Add", ["mm", "in_proj_bias"], ["proj"], name="/attn/Add"),
        mk("Shape", ["proj"], ["shape"], name="/attn/Shape"),
        cst("zero", [0]), cst("two", [2]), cst("one", [1]), cst("three_i", [3]),
        cst("int64_max", [imax]), cst("int64_min", [imin]), cst("minus1", [-1]),
        cst("minus2", [-2]), cst("axis_m2", [-2]),
        mk("Slice", ["shape", "zero", "two"], ["head"], name="/attn/Slice"),
        mk("Add", ["two", "one"], ["tail_start"], name="/attn/Add_1"),
        mk("Slice", ["shape", "tail_start", "int64_max"], ["tail"], name="/attn/Slice_1"),
        mk("Shape", ["proj"], ["last"], name="/attn/Shape_1", start=-1),
        mk("Div", ["last", "three_i"], ["e"], name="/attn/Div"),
        mk("Concat", ["head", "three_i", "e", "tail"], ["unflat"], name="/attn/Concat", axis=0),
        mk("Reshape", ["proj", "unflat"], ["qkv"], name="/attn/Reshape"),
        mk("Slice", ["qkv", "zero", "one", "axis_m2"], ["q"], name="/attn/Slice_2"),
        mk("Slice", ["qkv", "minus2", "minus1", "axis_m2"], ["k"], name="/attn/Slice_3"),
        mk("Slice", ["qkv", "two", "int64_max", "axis_m2"], ["v"], name="/attn/Slice_4"),
        mk("Mul", ["q", "k"], ["qk"], name="/attn/Mul"),
        mk("Add", ["qk", "v"], ["mix"], name="/attn/Add_2"),
        # [2, 5, 36] reversed is [36, 5, 2]: its last two, reversed again, are [5, 2]... read
        # as (batch, seq) = (rev[2], rev[1]).
        mk("Slice", ["shape", "int64_max", "int64_min", "zero", "minus1"], ["rev"], name="/attn/Slice_5"),
        mk("Slice", ["rev", "two", "int64_max"], ["b"], name="/attn/Slice_6"),
        mk("Slice", ["rev", "one", "two"], ["s"], name="/attn/Slice_7"),
        mk("Concat", ["b", "s", "minus1"], ["flat_shape"], name="/attn/Concat_1", axis=0),
        mk("Reshape", ["mix", "flat_shape"], ["out"], name="/attn/Reshape_1"),
    ]
    case("packed_attention_slices", nodes, [2, 5, 12],
         inits=[init("in_proj_weight", [36, 12], r), init("in_proj_bias", [36], r)])
    # BERT's masked-LM head in small: the decoder tied to the word embeddings (one
    # initializer, read by the Gather and, transposed, by the head's MatMul), so the last
    # matrix parameter (the transform's dense, 4 rows) is not the vocabulary (7): logits
    # [2, 3, 7], token labels [2, 3] up to 6 (the H200 run's "outside 0..128").
    nodes = [
        mk("Gather", ["word_embeddings.weight", "input"], ["h"], name="/embeddings/Gather"),
        mk("MatMul", ["h", "dense.weight"], ["h2"], name="/transform/MatMul"),
        mk("Tanh", ["h2"], ["h3"], name="/transform/Tanh"),
        mk("Transpose", ["word_embeddings.weight"], ["decT"], name="/decoder/Transpose", perm=[1, 0]),
        mk("MatMul", ["h3", "decT"], ["z"], name="/decoder/MatMul"),
        mk("Add", ["z", "decoder.bias"], ["out"], name="/decoder/Add"),
    ]
    x = rng("tied_head_x").integers(0, 7, (2, 3)).astype(np.int64)
    case("tied_head", nodes, [2, 3], x=x, x_type=I64, loss="ce",
         inits=[init("word_embeddings.weight", [7, 4], r), init("dense.weight", [4, 4], r),
                init("decoder.bias", [7], r)])


def new_op_cases():
    """Erf and exact GELU, IsNaN, Mod and GatherElements (folded shape arithmetic), a
    Dropout whose mask is read, ConvTranspose and Resize (their own rng, so the cases above
    keep their values)."""
    r = rng("session24")
    f32 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    case("erf", [N("Erf", ["input"], ["out"])], [3, 7],
         x=(rng("erf").standard_normal([3, 7]) * 1.5).astype(np.float32))
    case("gelu_exact", [N("Gelu", ["input"], ["out"])], [3, 7], opset=20,
         x=(rng("gelu_exact").standard_normal([3, 7]) * 2).astype(np.float32))
    # GELU as PyTorch's TorchScript exporter writes F.gelu: x·½·(1 + erf(x/√2)).
    case("gelu_erf_pattern", [N("Div", ["input", "sqrt2"], ["d"]), N("Erf", ["d"], ["e"]),
                              N("Add", ["e", "one"], ["e1"]), N("Mul", ["input", "e1"], ["m"]),
                              N("Mul", ["m", "half"], ["out"])], [2, 6],
         inits=[f32("sqrt2", 1.4142135381698608), f32("one", 1.0), f32("half", 0.5)])
    case("isnan_where", [N("Sqrt", ["input"], ["s"]), N("IsNaN", ["s"], ["nan"]),
                         N("Where", ["nan", "zero", "s"], ["out"])], [3, 5],
         inits=[f32("zero", 0.0)])
    # Mod in shape arithmetic: fmod=0 takes the divisor's sign (Python's %), fmod=1 the
    # dividend's; the reshape fails unless both fold as ONNX says.
    case("mod_shape", [
        N("Shape", ["input"], ["sh"]),
        N("Mod", ["sh", "m"], ["md"]),
        N("Mod", ["neg7", "three"], ["py"]),
        N("Mod", ["neg7", "three"], ["c"], fmod=1),
        N("Abs", ["c"], ["ac"]),
        N("Mul", ["py", "ac"], ["p1"]),
        N("Mul", ["p1", "six"], ["last"]),
        N("Concat", ["md", "last"], ["target"], axis=0),
        N("Reshape", ["input", "target"], ["out"])], [2, 6, 4],
         inits=[ints("m", [5, 4, 3]), ints("neg7", [-7]), ints("three", [3]), ints("six", [6])])
    # BERT's token type ids: a constant buffer gathered by constant position ids.
    case("gather_elements_const", [
        N("GatherElements", ["buf", "pos"], ["g"], axis=1),
        N("Cast", ["g"], ["gf"], to=F),
        N("Add", ["input", "gf"], ["out"])], [2, 3],
         inits=[ints("buf", [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]]),
                ints("pos", [[1, 3, -1], [0, 7, 2]])])
    case("dropout_mask_eval", [
        N("Dropout", ["input", "ratio", "training"], ["d", "mask"], name="drop"),
        N("Cast", ["mask"], ["mf"], to=F),
        N("Mul", ["d", "mf"], ["out"])], [3, 4],
         inits=[f32("ratio", 0.3), numpy_helper.from_array(np.array(False), "training")])
    case("conv_transpose", [N("ConvTranspose", ["input", "W", "B"], ["out"], name="up",
                              strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])],
         [2, 3, 4, 5], inits=[init("W", [3, 4, 3, 3], r), init("B", [4], r)])
    case("conv_transpose_unet", [N("ConvTranspose", ["input", "W", "B"], ["out"], kernel_shape=[2, 2],
                                   strides=[2, 2])],
         [2, 4, 3, 3], inits=[init("W", [4, 2, 2, 2], r), init("B", [2], r)])
    case("conv_transpose_stride1", [N("ConvTranspose", ["input", "W"], ["out"], pads=[0, 1, 0, 1])],
         [1, 2, 4, 4], inits=[init("W", [2, 3, 3, 3], r)])
    case("conv_transpose_groups_dilation", [N("ConvTranspose", ["input", "W", "B"], ["out"], group=2,
                                             strides=[1, 2], dilations=[2, 1], pads=[1, 0, 2, 1])],
         [1, 4, 3, 4], inits=[init("W", [4, 3, 3, 2], r), init("B", [6], r)])
    case("conv_transpose1d", [N("ConvTranspose", ["input", "W"], ["out"], strides=[3], pads=[1, 0])],
         [2, 2, 5], inits=[init("W", [2, 3, 4], r)])
    case("resize_nearest_scales", [N("Resize", ["input", "", "sc"], ["out"], mode="nearest")],
         [2, 3, 3, 4], inits=[f32("sc", [1, 1, 2, 3])])
    case("resize_nearest_torch", [N("Resize", ["input", "", "sc"], ["out"], mode="nearest",
                                    coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
         [1, 2, 3, 3], inits=[f32("sc", [1, 1, 2, 2])])
    case("resize_nearest_sizes", [N("Resize", ["input", "", "", "sz"], ["out"], mode="nearest")],
         [1, 2, 3, 2], inits=[ints("sz", [1, 2, 6, 8])])
    case("resize_linear", [N("Resize", ["input", "", "sc"], ["out"], mode="linear")],
         [2, 2, 3, 4], inits=[f32("sc", [1, 1, 2, 2])])
    case("resize_linear_asymmetric", [N("Resize", ["input", "", "", "sz"], ["out"], mode="linear",
                                       coordinate_transformation_mode="asymmetric")],
         [1, 2, 3, 4], inits=[ints("sz", [1, 2, 9, 8])])


def gpt_case(r, vocab=11, d=8, heads=2, t=5, b=2):
    """A GPT-like model written as PyTorch's TorchScript exporter writes one: embedding
    Gathers, position ids from Shape and Range, LayerNormalization, linear layers as MatMul by
    a Transpose of the weight, q/k/v by Split, heads by Reshape and Transpose with shapes from
    Shape/Gather/Concat, a causal mask sliced from a bool buffer and negated, Where with the
    dtype's lowest value, Softmax, GELU(tanh) written out with Pow 3, residual Adds."""
    hd = d // heads
    nodes, inits = [], []

    def p(name, shape, scale=0.3):
        inits.append(init(name, shape, r, scale))
        return name

    def const(name, value, dtype=np.float32):
        nodes.append(N("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=dtype), name)))
        return name

    def linear(x, name, din, dout, out):
        w = p(name + ".weight", [dout, din])
        bias = p(name + ".bias", [dout], 0.1)
        nodes.append(N("Transpose", [w], [name + ".wT"], perm=[1, 0]))
        nodes.append(N("MatMul", [x, name + ".wT"], [name + ".mm"]))
        nodes.append(N("Add", [name + ".mm", bias], [out]))
        return out

    inits.append(numpy_helper.from_array(np.tril(np.ones((t, t), dtype=bool))[None, None], "attn.mask"))
    nodes.append(N("Shape", ["input"], ["shp"]))
    const("one_i", 1, np.int64)
    nodes.append(N("Gather", ["shp", "one_i"], ["T"], axis=0))
    const("zero_i", 0, np.int64)
    nodes.append(N("Range", ["zero_i", "T", "one_i"], ["pos"]))
    p("wte.weight", [vocab, d])
    p("wpe.weight", [t, d])
    nodes.append(N("Gather", ["wte.weight", "input"], ["tok"]))
    nodes.append(N("Gather", ["wpe.weight", "pos"], ["pe"]))
    nodes.append(N("Add", ["tok", "pe"], ["h0"]))
    p("ln1.weight", [d]), p("ln1.bias", [d], 0.1)
    nodes.append(N("LayerNormalization", ["h0", "ln1.weight", "ln1.bias"], ["a0"], epsilon=1e-5))
    linear("a0", "attn.qkv", d, 3 * d, "qkv")
    inits.append(ints("split_d", [d, d, d]))
    nodes.append(N("Split", ["qkv", "split_d"], ["q", "k", "v"], axis=2))
    inits.append(ints("heads_shape", [heads, hd]))
    nodes.append(N("Gather", ["shp", "zero_i"], ["B"], axis=0))
    inits.append(ints("ax0", [0]))
    nodes.append(N("Unsqueeze", ["B", "ax0"], ["B1"]))
    nodes.append(N("Unsqueeze", ["T", "ax0"], ["T1"]))
    nodes.append(N("Concat", ["B1", "T1", "heads_shape"], ["hshape"], axis=0))
    for z in "qkv":
        nodes.append(N("Reshape", [z, "hshape"], [z + "4"]))
        nodes.append(N("Transpose", [z + "4"], [z + "h"], perm=[0, 2, 1, 3]))
    nodes.append(N("Transpose", ["kh"], ["khT"], perm=[0, 1, 3, 2]))
    nodes.append(N("MatMul", ["qh", "khT"], ["att0"]))
    const("scale", 1.0 / hd ** 0.5)
    nodes.append(N("Mul", ["att0", "scale"], ["att1"]))
    inits.append(ints("sl_start", [0, 0]))
    nodes.append(N("Concat", ["T1", "T1"], ["sl_end"], axis=0))
    inits.append(ints("sl_axes", [2, 3]))
    nodes.append(N("Slice", ["attn.mask", "sl_start", "sl_end", "sl_axes"], ["m"]))
    nodes.append(N("Not", ["m"], ["notm"]))
    const("lowest", np.finfo(np.float32).min)
    nodes.append(N("Where", ["notm", "lowest", "att1"], ["att2"]))
    nodes.append(N("Softmax", ["att2"], ["att"], axis=-1))
    nodes.append(N("MatMul", ["att", "vh"], ["y4"]))
    nodes.append(N("Transpose", ["y4"], ["y4t"], perm=[0, 2, 1, 3]))
    inits.append(ints("bt_d", [0, 0, d]))
    nodes.append(N("Reshape", ["y4t", "bt_d"], ["y"]))
    linear("y", "attn.proj", d, d, "yo")
    nodes.append(N("Add", ["h0", "yo"], ["h1"]))
    p("ln2.weight", [d]), p("ln2.bias", [d], 0.1)
    nodes.append(N("LayerNormalization", ["h1", "ln2.weight", "ln2.bias"], ["a1"], epsilon=1e-5))
    linear("a1", "fc", d, 4 * d, "f")
    const("three", 3.0)
    const("kappa", 0.044715)
    const("beta", (2 / np.pi) ** 0.5)
    const("one_f", 1.0)
    const("half_f", 0.5)
    nodes += [N("Pow", ["f", "three"], ["f3"]), N("Mul", ["f3", "kappa"], ["kf3"]),
              N("Add", ["f", "kf3"], ["inner"]), N("Mul", ["inner", "beta"], ["binner"]),
              N("Tanh", ["binner"], ["th"]), N("Add", ["th", "one_f"], ["th1"]),
              N("Mul", ["f", "th1"], ["fth"]), N("Mul", ["fth", "half_f"], ["gelu"])]
    linear("gelu", "fc2", 4 * d, d, "g2")
    nodes.append(N("Add", ["h1", "g2"], ["h2"]))
    p("lnf.weight", [d]), p("lnf.bias", [d], 0.1)
    nodes.append(N("LayerNormalization", ["h2", "lnf.weight", "lnf.bias"], ["hf"], epsilon=1e-5))
    p("head.weight", [vocab, d])
    nodes.append(N("Transpose", ["head.weight"], ["headT"], perm=[1, 0]))
    nodes.append(N("MatMul", ["hf", "headT"], ["out"]))
    x = rng("gpt_x").integers(0, vocab, (b, t)).astype(np.int64)
    case("gpt", nodes, [b, t], inits=inits, x=x, x_type=I64, loss="ce")


def write_case(c):
    name, nodes, x_shape, outputs, inits, x, opset, loss, kw = c
    m = model(name, nodes, x_shape, outputs, inits, opset=opset, x_type=kw.get("x_type", F))
    for k, v in kw.get("meta", {}).items():
        helper.set_model_props(m, {k: v})
    if x is None:
        x = rng(name).standard_normal(x_shape).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(outputs, {"input": x})
    onnx.save(m, os.path.join(OUT, "ops", name + ".onnx"))
    doc = {"x": tensor_json(x), "outputs": {o: tensor_json(v) for o, v in zip(outputs, got)},
           "loss": loss}
    if loss == "ce":
        y = rng(name + "y").integers(0, got[0].shape[-1], got[0].shape[:-1]).astype(np.int64)
        z = got[0].astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        lsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
        ce = -np.take_along_axis(lsm, y[..., None], -1).mean()
        doc["y"] = tensor_json(y)
        doc["ce"] = float(ce)
    if name == "tied_head":
        # The other reading of [2, 3, 7] logits: classes on axis 1 (3 of them), labels [2, 7].
        y1 = rng(name + "y1").integers(0, got[0].shape[1], (got[0].shape[0], got[0].shape[2])).astype(np.int64)
        z = np.moveaxis(got[0].astype(np.float64), 1, -1)
        z = z - z.max(-1, keepdims=True)
        lsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
        doc["y_axis1"] = tensor_json(y1)
        doc["ce_axis1"] = float(-np.take_along_axis(lsm, y1[..., None], -1).mean())
    if name == "mlp":
        doc["lr"] = 0.1
        doc["sgd_losses"] = mlp_sgd_losses(m, x, y, lr=0.1, steps=5)
    with open(os.path.join(OUT, "ops", name + ".json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))


def mlp_sgd_losses(m, x, y, lr, steps):
    """The losses of `steps` SGD steps on the mlp fixture (Gemm, Relu, Gemm, mean
    cross-entropy), backpropagated by hand in f64: an independent reference for Ingot's
    training step on an imported model."""
    p = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in m.graph.initializer}
    x = x.astype(np.float64)
    n = x.shape[0]
    losses = []
    for _ in range(steps):
        h = x @ p["fc1.weight"].T + p["fc1.bias"]
        a = np.maximum(h, 0)
        z = a @ p["fc2.weight"].T + p["fc2.bias"]
        zs = z - z.max(-1, keepdims=True)
        e = np.exp(zs)
        sm = e / e.sum(-1, keepdims=True)
        losses.append(float(-np.log(sm[np.arange(n), y]).mean()))
        dz = sm.copy()
        dz[np.arange(n), y] -= 1
        dz /= n
        g = {"fc2.weight": dz.T @ a, "fc2.bias": dz.sum(0)}
        dh = (dz @ p["fc2.weight"]) * (h > 0)
        g["fc1.weight"] = dh.T @ x
        g["fc1.bias"] = dh.sum(0)
        for k in g:
            p[k] = p[k] - lr * g[k]
    return losses


def write_errors():
    d = os.path.join(OUT, "errors")
    xi = helper.make_tensor_value_info("input", F, [2, 3])
    out = helper.make_tensor_value_info("out", F, None)

    def save(name, nodes, inputs=(xi,), inits=(), check=False, outputs=(out,)):
        g = helper.make_graph(nodes, name, list(inputs), list(outputs), initializer=list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
        if check:
            onnx.checker.check_model(m)
        onnx.save(m, os.path.join(d, name + ".onnx"))
        return m

    save("cycle", [N("Relu", ["b"], ["a"], name="first"), N("Relu", ["a"], ["b"], name="second"),
                   N("Add", ["input", "a"], ["out"], name="sum")])
    save("dangling", [N("Add", ["input", "nowhere"], ["out"], name="add_missing")])
    save("unsupported", [
        N("Hardmax", ["input"], ["e"], name="the_hardmax"),
        N("Relu", ["e"], ["r"], name="fine_relu"),
        N("Resize", ["r", "", "scales"], ["rs"], name="upsample", mode="cubic"),
        N("Softmax", ["rs"], ["s"], name="softmax_with_junk", junk=3),
        N("MaxPool", ["s"], ["out"], name="pool_ceil", kernel_shape=[2, 2], ceil_mode=1)],
        inits=[numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")])
    save("dropout_train", [N("Dropout", ["input", "ratio", "training"], ["out"], name="drop")],
         inits=[numpy_helper.from_array(np.array(0.25, dtype=np.float32), "ratio"),
                numpy_helper.from_array(np.array(True), "training")])
    # A model that computes its own loss from (data, target): two inputs, a scalar output.
    tgt = helper.make_tensor_value_info("target", F, [2, 3])
    loss = helper.make_tensor_value_info("loss", F, [])
    save("own_loss", [N("Mul", ["input", "w"], ["p"], name="scale"), N("Sub", ["p", "target"], ["d"], name="diff"),
                      N("Mul", ["d", "d"], ["sq"], name="square"),
                      N("ReduceMean", ["sq"], ["loss"], name="mean", keepdims=0)],
         inputs=[xi, tgt], inits=[numpy_helper.from_array(np.full((3,), 2.0, dtype=np.float32), "w")],
         outputs=[loss])
    three = helper.make_tensor_value_info("third", F, [2, 3])
    save("three_inputs", [N("Add", ["input", "target"], ["s"]), N("Add", ["s", "third"], ["out"])],
         inputs=[xi, tgt, three])
    sym = helper.make_tensor_value_info("input", F, ["batch", 3])
    W = numpy_helper.from_array(np.ones((3, 2), dtype=np.float32), "W")
    save("symbolic_batch", [N("MatMul", ["input", "W"], ["out"], name="mm")], inputs=[sym], inits=[W])
    sym_seq = helper.make_tensor_value_info("input", F, [2, "seq"])
    save("symbolic_seq", [N("Relu", ["input"], ["out"])], inputs=[sym_seq])
    # Weights as external data, inside the model's folder, and one whose location escapes it.
    ext = os.path.join(d, "external")
    os.makedirs(ext, exist_ok=True)
    W = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) / 10, "W")
    g = helper.make_graph([N("MatMul", ["input", "W"], ["out"], name="mm")], "ext", [xi], [out], initializer=[W])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save_model(m, os.path.join(ext, "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    m2 = onnx.load(os.path.join(ext, "model.onnx"), load_external_data=False)
    for e in m2.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../outside.bin"
    onnx.save(m2, os.path.join(ext, "escape.onnx"))
    with open(os.path.join(d, "outside.bin"), "wb") as f:
        f.write(np.zeros(6, dtype=np.float32).tobytes())
    m3 = onnx.load(os.path.join(ext, "model.onnx"), load_external_data=False)
    for e in m3.graph.initializer[0].external_data:
        if e.key == "length":
            e.value = "20"
    onnx.save(m3, os.path.join(ext, "short.onnx"))

    # Logits [2, 3, 3]: labels [2, 3] fit both class axes (1 and the last).
    save("class_axis_square", [helper.make_node("Mul", ["input", "w"], ["out"], name="scale")],
         inputs=[helper.make_tensor_value_info("input", F, [2, 3, 3])],
         inits=[numpy_helper.from_array(np.full((3,), 2.0, dtype=np.float32), "w")])
    # Every op supported, so `check`'s node list is empty; the import fails at tracing (a
    # computed tensor sliced to nothing), which `ingot onnx check` must report too.
    save("slice_to_nothing", [
        helper.make_node("Slice", ["input", "st", "en", "ax"], ["s"], name="/attn/Slice_9"),
        helper.make_node("Mul", ["s", "w"], ["out"], name="/attn/Mul")],
        inits=[numpy_helper.from_array(np.array([3], dtype=np.int64), "st"),
               numpy_helper.from_array(np.array([2**63 - 1], dtype=np.int64), "en"),
               numpy_helper.from_array(np.array([1], dtype=np.int64), "ax"),
               numpy_helper.from_array(np.full((1,), 2.0, dtype=np.float32), "w")])


def write_random():
    """Training-mode randomness, which no reference reproduces draw for draw (the tests check
    the draws' structure and rate): a Dropout whose mask is read, and stochastic depth as
    PyTorch's exporter writes torchvision's (`bernoulli_(0.8)` then `div_(0.8)`)."""
    d = os.path.join(OUT, "random")
    os.makedirs(d, exist_ok=True)
    f32 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.float32), name)

    def save(name, nodes, x_shape, outputs, inits):
        g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("input", F, x_shape)],
                              [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              initializer=list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
        onnx.save(m, os.path.join(d, name + ".onnx"))

    save("dropout_mask_train", [
        N("Dropout", ["input", "ratio", "training"], ["out", "mask"], name="drop"),
        N("Cast", ["mask"], ["kept"], to=F, name="mask_float")], [40, 50], ["out", "kept"],
        [f32("ratio", 0.25), numpy_helper.from_array(np.array(True), "training")])
    # As PyTorch's exporter writes nn.Dropout in training mode: the mask declared, never read.
    save("dropout_mask_unread", [
        N("Dropout", ["input", "ratio", "training"], ["out", "mask"], name="drop")], [40, 50], ["out"],
        [f32("ratio", 0.25), numpy_helper.from_array(np.array(True), "training")])
    save("stochastic_depth", [
        N("Constant", [], ["survival"], name="sd/Constant", value=f32("v", 0.8)),
        N("ConstantOfShape", ["shape"], ["empty"], name="empty"),
        N("RandomUniformLike", ["empty"], ["u"], name="sd/RandomUniformLike", dtype=F),
        N("Less", ["u", "survival"], ["keep"], name="sd/Less"),
        N("Cast", ["keep"], ["keepf"], to=F, name="sd/Cast"),
        N("Div", ["keepf", "survival"], ["noise"], name="sd/Div"),
        N("Mul", ["input", "noise"], ["out"], name="sd/Mul")], [2000, 3], ["out"],
        [ints("shape", [2000, 1])])
    save("random_read_directly", [
        N("RandomUniformLike", ["input"], ["u"], name="noise"),
        N("Add", ["input", "u"], ["out"], name="add_noise")], [2, 3], ["out"], [])


def save_safetensors(path, tensors):
    """A safetensors file (the format torch's safetensors.torch.save_file writes), without
    the safetensors package: an 8-byte header length, the JSON header, the data."""
    import struct
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.array(a, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_state_dict():
    """A whole PyTorch state_dict of the cnn fixture's module (what `model.state_dict()` of a
    Conv2d, BatchNorm2d, Linear module saved with safetensors holds): parameters, running
    statistics, and the batch norm's i64 `num_batches_tracked`, with values unlike the
    .onnx file's, for `ingot train --onnx ops/cnn.onnx --init`."""
    d = os.path.join(OUT, "state_dict")
    os.makedirs(d, exist_ok=True)
    r = rng("state_dict")
    f = lambda *s: (r.standard_normal(s) * 0.3).astype(np.float32)
    save_safetensors(os.path.join(d, "cnn.safetensors"), {
        "conv.weight": f(3, 3, 3, 3), "conv.bias": f(3),
        "bn.weight": (1 + f(3)).astype(np.float32), "bn.bias": f(3),
        "bn.running_mean": f(3), "bn.running_var": (r.random(3) + 0.5).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
        "fc.weight": f(5, 12), "fc.bias": f(5)})


def main():
    os.makedirs(os.path.join(OUT, "ops"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "errors"), exist_ok=True)
    build_cases()
    # ONLY=pad_,split_to_,attention_,gather_nd_ (session 44's cases) writes only the cases whose names start so (and the Pad error fixtures).
    only = [p for p in os.environ.get("ONLY", "").split(",") if p]
    for c in CASES:
        if not only or any(c[0].startswith(p) for p in only):
            write_case(c)
    write_pad_errors()
    if only:
        print(f"wrote the {only} op fixtures under {OUT}")
        return
    write_errors()
    write_random()
    write_state_dict()
    print(f"wrote {len(CASES)} op fixtures and the error fixtures under {OUT}")


if __name__ == "__main__":
    main()
