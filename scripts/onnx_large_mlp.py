"""An MLP whose weights pass protobuf's 2 GiB, written as ONNX with external data, with a batch
and the cross-entropy loss of its first step computed here in float64 (issue 46: models over
2 GB import). Needs onnx, numpy and safetensors (no PyTorch).

usage: python3 scripts/onnx_large_mlp.py OUTDIR [--width 16384] [--layers 2] [--batch 4] [--classes 1000]
Writes OUTDIR/model.onnx, OUTDIR/weights.bin (external data, one file), OUTDIR/batch.safetensors
(x f32 [batch, width], y i64 [batch]) and prints the loss Ingot's first step must report:
    ingot train --onnx OUTDIR/model.onnx --loss cross-entropy --data OUTDIR/batch.safetensors \
        --optimizer sgd --lr 0.01 --steps 2
"""
import argparse, os
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--width", type=int, default=16384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--classes", type=int, default=1000)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    dims = [a.width] * (a.layers + 1) + [a.classes]
    inits, nodes, h = [], [], "x"
    for i in range(len(dims) - 1):
        w = (rng.standard_normal((dims[i], dims[i + 1]), dtype=np.float32) / np.sqrt(dims[i])).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"fc{i}.weight"))
        out = f"h{i}" if i < len(dims) - 2 else "logits"
        nodes.append(helper.make_node("MatMul", [h, f"fc{i}.weight"], [f"m{i}" if out != "logits" else out]))
        if out != "logits":
            nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        h = out
    graph = helper.make_graph(
        nodes, "large_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [a.batch, a.width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [a.batch, a.classes])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="scripts/onnx_large_mlp.py")
    total = sum(numpy_helper.to_array(t).nbytes for t in inits)
    path = os.path.join(a.out, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    x = rng.standard_normal((a.batch, a.width), dtype=np.float32)
    y = rng.integers(0, a.classes, a.batch).astype(np.int64)
    save_file({"x": x, "y": y}, os.path.join(a.out, "batch.safetensors"))
    # The first step's loss in float64, from the weights as written.
    z = x.astype(np.float64)
    for i, t in enumerate(inits):
        z = z @ numpy_helper.to_array(t).astype(np.float64)
        if i < len(inits) - 1:
            z = np.maximum(z, 0)
    z -= z.max(axis=1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(a.batch), y]))
    print(f"weights {total} bytes ({total / 2**30:.3f} GiB) in {a.out}/weights.bin; "
          f"model.onnx {os.path.getsize(path)} bytes; first-step loss (f64) {loss:.7f}")


if __name__ == "__main__":
    main()
