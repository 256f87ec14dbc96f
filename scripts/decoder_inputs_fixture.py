#!/usr/bin/env python3
"""Writes the two small ONNX decoders of `ingot generate --input-value`'s tests
(cli/tests/fixtures/decoder_inputs/): the same weights, traced two ways.

- plain.onnx: one data input, input_ids [batch, 8]; the positions are the constant 0..8.
- inputs.onnx: input_ids, attention_mask and position_ids, all [batch, 8] int64, as
  transformers exports a decoder: the mask adds (1 - mask) * -1e4 to the attention scores of
  the keys it masks, the positions index the position embedding.

Held at attention_mask=1 and position_ids=0..8, inputs.onnx computes what plain.onnx computes
(the mask adds -0.0: the same bits), so both draw the same tokens.

    pip install onnx numpy
    python3 scripts/decoder_inputs_fixture.py [OUT_DIR]   # default cli/tests/fixtures/decoder_inputs

Deterministic: a fixed seed, opset 17, IR version 8. The weights are listed in the metadata
`ingot.parameters`, so the causal mask and the scalars are constants.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "cli", "tests", "fixtures", "decoder_inputs")
VOCAB, SEQ, WIDTH = 32, 8, 16
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def weights():
    r = np.random.default_rng(50)
    f = lambda *s: (r.standard_normal(s)).astype(np.float32)
    causal = np.triu(np.full((SEQ, SEQ), -1e4, dtype=np.float32), k=1)
    return [
        numpy_helper.from_array(f(VOCAB, WIDTH), "wte"),
        numpy_helper.from_array(f(SEQ, WIDTH), "wpe"),
        numpy_helper.from_array(f(WIDTH, VOCAB) * np.float32(0.5), "head"),
        numpy_helper.from_array(causal, "causal"),
        numpy_helper.from_array(np.array(0.25, dtype=np.float32), "scale"),
    ]


def decoder(with_inputs):
    n = helper.make_node
    ids = lambda name: helper.make_tensor_value_info(name, I64, ["batch", SEQ])
    inputs = [ids("input_ids")]
    inits = weights()
    nodes = [n("Gather", ["wte", "input_ids"], ["tok"], name="tok")]
    if with_inputs:
        inputs += [ids("attention_mask"), ids("position_ids")]
        nodes.append(n("Gather", ["wpe", "position_ids"], ["pos"], name="pos"))
    else:
        inits.append(numpy_helper.from_array(np.arange(SEQ, dtype=np.int64), "positions"))
        nodes.append(n("Gather", ["wpe", "positions"], ["pos"], name="pos"))
    nodes += [
        n("Add", ["tok", "pos"], ["h"], name="embed"),
        n("Transpose", ["h"], ["ht"], perm=[0, 2, 1], name="keys"),
        n("MatMul", ["h", "ht"], ["dots"], name="dots"),
        n("Mul", ["dots", "scale"], ["scaled"], name="scaled"),
        n("Add", ["scaled", "causal"], ["causal_scores"], name="causal"),
    ]
    scores = "causal_scores"
    if with_inputs:
        inits += [
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
            numpy_helper.from_array(np.array(-1e4, dtype=np.float32), "masked"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "key_axis"),
        ]
        nodes += [
            n("Cast", ["attention_mask"], ["maskf"], to=F, name="maskf"),
            n("Sub", ["one", "maskf"], ["unmasked"], name="unmasked"),
            n("Mul", ["unmasked", "masked"], ["bias2"], name="bias2"),
            n("Unsqueeze", ["bias2", "key_axis"], ["bias"], name="bias"),
            n("Add", ["causal_scores", "bias"], ["scores"], name="masked_scores"),
        ]
        scores = "scores"
    nodes += [
        n("Softmax", [scores], ["p"], axis=-1, name="softmax"),
        n("MatMul", ["p", "h"], ["att"], name="att"),
        n("Add", ["h", "att"], ["h2"], name="residual"),
        n("MatMul", ["h2", "head"], ["logits"], name="head"),
    ]
    out = helper.make_tensor_value_info("logits", F, ["batch", SEQ, VOCAB])
    g = helper.make_graph(nodes, "decoder", inputs, [out], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    m.producer_name = "scripts/decoder_inputs_fixture.py"
    helper.set_model_props(m, {"ingot.parameters": "wte,wpe,head"})
    onnx.checker.check_model(m)
    return m


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, with_inputs in [("plain.onnx", False), ("inputs.onnx", True)]:
        onnx.save(decoder(with_inputs), os.path.join(OUT, name))
        print("wrote", os.path.join(OUT, name))
