#!/usr/bin/env python3
"""JAX reference of Ingot's training steps (mlp, gpt-mini, gpt2, gpt:...), written from
reference-models.md, the same math as scripts/torch_reference.py in pure jax.numpy.

    python3 scripts/jax_reference.py --model mlp --init P.safetensors --data B.safetensors \
        --steps 5 [--device cpu|cuda] [--precision highest|tensorfloat32|default] [--save P2.safetensors]

prints one JSON object per step: {"step": i, "loss": ..., "seconds": ...}; the loss is the loss
of the batch before that step's update, as `ingot train --json` and torch_reference.py print it.

scripts/gpu_bench.py imports this module for its "jax" cells. Parameters are a flat dict named as
PyTorch names them (`blocks.0.qkv.weight`, ...), Linear weights [out, in]; a step is
`jax.jit(step, donate_argnums=(0, 1))` over (params, opt_state, x, y). Only jax and numpy are
needed (safetensors files are read and written here by hand, as torch_reference.py does).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

# Importing jax starts no backend: the platform, the precision and XLA_PYTHON_CLIENT_PREALLOCATE
# still take effect if set after this, before the first array is made.
import jax
import jax.numpy as jnp

import safetensors_io  # beside this script

# --- the shapes of reference-models.md (the same as torch_reference.py's) ----------------------

GPT_KEYS = ["vocab", "d_model", "layers", "heads", "d_ff", "seq", "batch"]
GPT_MINI = dict(vocab=8192, d_model=512, layers=4, heads=8, d_ff=2048, seq=256, batch=16)
GPT2 = dict(vocab=50304, d_model=768, layers=12, heads=12, d_ff=3072, seq=1024, batch=8)
MLP_BATCH = 256


class ModelError(ValueError):
    pass


def config(spec):
    """None for the mlp, else the gpt configuration dict of a model name as `ingot` takes it."""
    if spec == "mlp":
        return None
    if spec == "gpt-mini":
        return dict(GPT_MINI)
    if spec == "gpt2":
        return dict(GPT2)
    if not spec.startswith("gpt:"):
        raise ModelError(
            f"unknown model {spec!r}; known: mlp, gpt-mini, gpt2, "
            "gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=.."
        )
    cfg = {}
    for item in spec[len("gpt:") :].split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ModelError(f"{item!r} is not key=value (keys: {', '.join(GPT_KEYS)})")
        k, v = (s.strip() for s in item.split("=", 1))
        if k not in GPT_KEYS or k in cfg:
            raise ModelError(f"unknown or repeated key {k!r} (keys: {', '.join(GPT_KEYS)})")
        cfg[k] = int(v)
    missing = [k for k in GPT_KEYS if k not in cfg]
    if missing:
        raise ModelError(f"missing keys: {', '.join(missing)}")
    if cfg["d_model"] % cfg["heads"] != 0:
        raise ModelError("d_model must be divisible by heads")
    return cfg


def param_shapes(cfg):
    """{name: shape} in PyTorch's names and layouts (Linear weight [out, in])."""
    if cfg is None:
        return {
            "fc1.weight": (1024, 784), "fc1.bias": (1024,),
            "fc2.weight": (1024, 1024), "fc2.bias": (1024,),
            "fc3.weight": (10, 1024), "fc3.bias": (10,),
        }  # fmt: skip
    d, f = cfg["d_model"], cfg["d_ff"]
    out = {"wte.weight": (cfg["vocab"], d), "wpe.weight": (cfg["seq"], d)}
    for i in range(cfg["layers"]):
        p = f"blocks.{i}."
        out.update({
            p + "ln1.weight": (d,), p + "ln1.bias": (d,),
            p + "qkv.weight": (3 * d, d), p + "qkv.bias": (3 * d,),
            p + "proj.weight": (d, d), p + "proj.bias": (d,),
            p + "ln2.weight": (d,), p + "ln2.bias": (d,),
            p + "fc.weight": (f, d), p + "fc.bias": (f,),
            p + "fc2.weight": (d, f), p + "fc2.bias": (d,),
        })  # fmt: skip
    out.update({"lnf.weight": (d,), "lnf.bias": (d,), "head.weight": (cfg["vocab"], d)})
    return out


def batch_shapes(cfg):
    """(x shape, y shape) of one batch."""
    if cfg is None:
        return (MLP_BATCH, 784), (MLP_BATCH,)
    return (cfg["batch"], cfg["seq"]), (cfg["batch"], cfg["seq"])


# --- the models ---------------------------------------------------------------------------------


def linear(p, name, x, bias=True):
    y = x @ p[name + ".weight"].T  # weight [out, in], as PyTorch's
    return y + p[name + ".bias"] if bias else y


def layer_norm(p, name, x, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)  # biased, as nn.LayerNorm's
    return (x - mean) * jax.lax.rsqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def cross_entropy(logits, y):
    """Mean softmax cross-entropy of logits [n, classes] against integer labels [n]."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=-1))


def mlp_loss(p, x, y):
    h = jax.nn.relu(linear(p, "fc1", x))
    h = jax.nn.relu(linear(p, "fc2", h))
    return cross_entropy(linear(p, "fc3", h), y)


def attention(p, name, x, heads):
    """The plain attention of reference-models.md: it materialises [b, h, t, t] scores."""
    b, t, d = x.shape
    hd = d // heads
    q, k, v = jnp.split(linear(p, name + ".qkv", x), 3, axis=-1)  # order q, k, v
    q = q.reshape(b, t, heads, hd).transpose(0, 2, 1, 3)  # [b, h, t, hd]
    k = k.reshape(b, t, heads, hd).transpose(0, 2, 1, 3)
    v = v.reshape(b, t, heads, hd).transpose(0, 2, 1, 3)
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
    future = jnp.triu(jnp.ones((t, t), dtype=bool), k=1)
    scores = jnp.where(future, -jnp.inf, scores)
    att = jax.nn.softmax(scores, axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return linear(p, name + ".proj", y)


def gpt_loss(p, x, y, cfg):
    b, t = x.shape
    h = p["wte.weight"][x] + p["wpe.weight"][:t]
    for i in range(cfg["layers"]):
        n = f"blocks.{i}"
        h = h + attention(p, n, layer_norm(p, n + ".ln1", h), cfg["heads"])
        ff = jax.nn.gelu(linear(p, n + ".fc", layer_norm(p, n + ".ln2", h)), approximate=True)
        h = h + linear(p, n + ".fc2", ff)
    logits = linear(p, "head", layer_norm(p, "lnf", h), bias=False)
    return cross_entropy(logits.reshape(b * t, -1), y.reshape(b * t))


def loss_fn(cfg):
    """loss(params, x, y) of the model."""
    if cfg is None:
        return mlp_loss
    return lambda p, x, y: gpt_loss(p, x, y, cfg)


# --- optimizers (PyTorch's formulas, in PyTorch's order) ---------------------------------------

SGD_LR = 0.1
ADAMW = dict(lr=3e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def init_opt_state(cfg, params):
    """SGD without momentum has no state; AdamW has a step count and two moments per parameter."""
    if cfg is None:
        return {}
    return {
        "step": jnp.zeros((), jnp.int32),
        "m": {k: jnp.zeros_like(v) for k, v in params.items()},
        "v": {k: jnp.zeros_like(v) for k, v in params.items()},
    }


def sgd_update(params, grads, state):
    return {k: params[k] - SGD_LR * grads[k] for k in params}, state


def adamw_update(params, grads, state):
    """torch.optim.AdamW (single tensor, not capturable): decay, moments, bias-corrected step.
    Weight decay applies to every parameter, as reference-models.md says."""
    lr, b1, b2, eps, wd = (ADAMW[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay"))
    step = state["step"] + 1
    t = step.astype(jnp.float32)
    bc1 = 1.0 - b1**t
    bc2_sqrt = jnp.sqrt(1.0 - b2**t)
    step_size = lr / bc1
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k]
        p = p * (1.0 - lr * wd)
        m = state["m"][k] + (g - state["m"][k]) * (1.0 - b1)  # lerp, as torch's exp_avg.lerp_
        v = state["v"][k] * b2 + (1.0 - b2) * g * g
        denom = jnp.sqrt(v) / bc2_sqrt + eps
        new_p[k] = p - step_size * m / denom
        new_m[k], new_v[k] = m, v
    return new_p, {"step": step, "m": new_m, "v": new_v}


def make_step(cfg, donate=True):
    """A jitted step(params, opt_state, x, y) -> (params, opt_state, loss); the loss is the one
    before the update. Params and optimizer state are donated: updated in place, as PyTorch does."""
    loss = loss_fn(cfg)
    update = sgd_update if cfg is None else adamw_update

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        params, opt_state = update(params, grads, opt_state)
        return params, opt_state, value

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


# --- safetensors, by hand (numpy) ---------------------------------------------------------------

NP_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip
NP_NAMES = {np.dtype(v).str: k for k, v in NP_DTYPES.items()}


def fail(msg):
    print(f"jax_reference: {msg}", file=sys.stderr)
    sys.exit(1)


def load_safetensors(path):
    """{name: numpy array} of a safetensors file."""

    def itemsize(name):
        return np.dtype(NP_DTYPES[name]).itemsize if name in NP_DTYPES else None

    out = {}
    for name, dtype_name, shape, data in safetensors_io.read(path, fail, itemsize):
        dtype = np.dtype(NP_DTYPES[dtype_name]).newbyteorder("<")
        out[name] = np.frombuffer(data, dtype=dtype).reshape(tuple(shape)).copy()
    return out


def save_safetensors(path, tensors):
    """Writes {name: array} as a safetensors file (little-endian; the header padded to 8)."""

    def entry(name, a):
        a = np.ascontiguousarray(np.asarray(a))
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        return name, NP_NAMES[a.dtype.str], a.shape, a.tobytes()

    safetensors_io.write(path, (entry(name, a) for name, a in tensors.items()))


# --- command line -------------------------------------------------------------------------------


def set_precision(name):
    """f32 matrix products: "highest" is true f32 (JAX on a recent GPU otherwise may use TF32),
    "tensorfloat32" lets them use TF32, "default" is JAX's own choice."""
    if name != "default":
        jax.config.update("jax_default_matmul_precision", name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="mlp, gpt-mini, gpt2 or gpt:vocab=..,d_model=..,...")
    ap.add_argument("--init", required=True, help="parameters (safetensors, PyTorch names)")
    ap.add_argument("--data", required=True, help="batch (safetensors with x and y)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="JAX platform (default cpu)")
    ap.add_argument("--precision", default="highest", choices=["highest", "tensorfloat32", "default"],
                    help="f32 matmul precision (default highest: no TF32)")
    ap.add_argument("--save", help="write the parameters after the last step here")
    a = ap.parse_args()

    try:
        jax.config.update("jax_platforms", a.device)
        device = jax.devices()[0]
    except RuntimeError as e:
        fail(f"--device {a.device}: JAX finds no such device ({e})")
    set_precision(a.precision)
    try:
        cfg = config(a.model)
    except ModelError as e:
        fail(str(e))

    params = load_safetensors(a.init)
    expected = param_shapes(cfg)
    missing = [k for k in expected if k not in params]
    unknown = [k for k in params if k not in expected]
    if missing or unknown:
        fail(f"{a.init}: missing parameters {missing}, unknown ones {unknown}")
    for k, shape in expected.items():
        if params[k].shape != tuple(shape) or params[k].dtype != np.float32:
            fail(f"{a.init}: {k} is {params[k].dtype} {list(params[k].shape)}, the model needs float32 {list(shape)}")
    batch = load_safetensors(a.data)
    if "x" not in batch or "y" not in batch:
        fail(f"{a.data}: a batch holds x and y; this one holds {list(batch)}")
    x = batch["x"].astype(np.float32 if cfg is None else np.int32)
    y = batch["y"].astype(np.int32)
    xs, ys = batch_shapes(cfg)
    if cfg is not None:
        xs, ys = x.shape, y.shape  # batch and sequence come from the file, as in torch_reference.py
        if len(xs) != 2 or xs != ys or xs[1] > cfg["seq"]:
            fail(f"{a.data}: x {list(x.shape)} and y {list(y.shape)} must be [batch, seq ≤ {cfg['seq']}]")
    elif x.shape[1:] != xs[1:] or y.shape != (x.shape[0],):
        fail(f"{a.data}: x {list(x.shape)} and y {list(y.shape)} must be [n, 784] and [n]")

    params = {k: jax.device_put(params[k], device) for k in expected}
    x, y = jax.device_put(x, device), jax.device_put(y, device)
    opt_state = init_opt_state(cfg, params)
    step = make_step(cfg)
    for i in range(1, a.steps + 1):
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        value = float(loss)  # waits for the step
        seconds = time.perf_counter() - t0
        print(json.dumps({"step": i, "loss": value, "seconds": seconds}), flush=True)

    if a.save:
        save_safetensors(a.save, {k: np.asarray(v) for k, v in params.items()})


if __name__ == "__main__":
    main()
