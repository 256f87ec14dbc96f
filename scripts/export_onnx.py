#!/usr/bin/env python3
"""Exports a PyTorch module to ONNX with the settings Ingot's importer needs
(onnx/src/lib.rs): the training-mode graph (BatchNormalization with training_mode=1, Dropout
with training_mode true), parameters as initializers named as in the module's state_dict
(`fc1.weight`), no constant folding (which would fold a weight's transpose into a new,
renamed initializer), opset 17, and the module's parameters listed in the model's metadata
(`ingot.parameters`; its float buffers as `ingot.frozen`; its embeddings' padding rows as
`ingot.padding_idx`) so that Ingot trains those and
nothing else (the exporter also writes literal constants as initializers).

As a library:

    from export_onnx import export
    export(module, (x,), "model.onnx", input_names=["input"], output_names=["logits"])

Then `ingot_onnx::import` (or `ingot train --onnx model.onnx --loss cross-entropy`) reads it.
Ingot plans static shapes: export with the batch you will train with, or pass
`dynamic_batch=True` and give Ingot the batch (`ImportOptions::batch`, `--batch N`).
"""
import warnings

import onnx
import torch

OPSET = 17


def export(module, args, path, input_names=("input",), output_names=("logits",), opset=OPSET,
           dynamic_batch=False, dynamo=False):
    """Writes `module` (called on `args`) to `path` as Ingot imports it; returns the names of
    the module's parameters that are initializers of the file (all of them, or a warning says
    which are missing). The module's state (running statistics) is restored after export,
    since tracing runs it once in training mode.

    `dynamo=True` exports with torch.export (`torch.onnx.export(..., dynamo=True)`, which
    needs onnxscript) at `opset` (the exporter converts to it where onnx's version converter
    can; PyTorch 2.15's leaves a model with Gelu at 18), without the exporter's graph
    optimisation (which folds a weight's transpose into a new, renamed initializer). Its
    BatchNormalization is the inference form whatever the module's mode (seen with PyTorch
    2.15: a batch-norm model trains on its running statistics), so use it for models without
    batch norm."""
    if not isinstance(args, tuple):
        args = (args,)
    saved = {k: v.detach().clone() for k, v in module.state_dict().items()}
    module.train()
    if dynamo:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            large = sum(t.numel() * t.element_size() for t in module.state_dict().values()) > 1.5e9
            torch.onnx.export(module, args, path, dynamo=True, external_data=large, optimize=False,
                              opset_version=opset, input_names=list(input_names),
                              output_names=list(output_names))
        return _annotate(module, path, saved)
    kwargs = dict(
        export_params=True,
        do_constant_folding=False,
        keep_initializers_as_inputs=False,
        opset_version=opset,
        input_names=list(input_names),
        output_names=list(output_names),
        training=torch.onnx.TrainingMode.TRAINING,
    )
    if dynamic_batch:
        kwargs["dynamic_axes"] = {n: {0: "batch"} for n in list(input_names) + list(output_names)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # The TorchScript exporter: it honours `training` and keeps state_dict names.
            torch.onnx.export(module, args, path, dynamo=False, **kwargs)
        except TypeError:
            # A torch without the `dynamo` argument exports with TorchScript anyway.
            torch.onnx.export(module, args, path, **kwargs)
        except Exception as e:  # noqa: BLE001 - a torch whose TorchScript exporter is gone
            print(f"note: the TorchScript exporter failed ({type(e).__name__}: {e}); "
                  "exporting with torch.export (dynamo=True) from the module in training mode")
            dyn = {k: kwargs[k] for k in ("input_names", "output_names")}
            dyn["opset_version"] = max(opset, 18)
            try:
                large = sum(t.numel() * t.element_size() for t in module.state_dict().values()) > 1.5e9
                torch.onnx.export(module, args, path, dynamo=True, external_data=large,
                                  optimize=False, **dyn)
            except TypeError:
                torch.onnx.export(module, args, path, dynamo=True, **dyn)
    return _annotate(module, path, saved)


def _annotate(module, path, saved):
    """Restores the module's state and writes Ingot's metadata into the exported file."""
    module.load_state_dict(saved)
    # External data (a model over protobuf's 2 GiB, which the exporter writes as files beside
    # the model) stays where the exporter put it: loaded as references and saved as such.
    model = onnx.load(path, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    # A tied tensor has several names (GPT-2's transformer.wte.weight and lm_head.weight): the
    # TorchScript exporter keeps the first, the dynamo exporter may keep another. Each tensor is
    # listed under the name the file has (the state_dict holds every name).
    names = {}
    for n, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), []).append(n)

    def in_file(n, t):
        return next((a for a in names[id(t)] if a in inits), n)

    params = [in_file(n, p) for n, p in module.named_parameters()]
    missing = [n for n in params if n not in inits]
    if missing:
        print(f"warning: {path}: parameters not exported under their names: {missing} "
              "(tied or unused weights, or renamed by the exporter); --init files will not match them")
    frozen = [in_file(n, b) for n, b in module.named_buffers() if b.is_floating_point()]
    frozen = [n for n in frozen if n in inits]
    # What Ingot trains: the module's parameters; every other initializer is a constant.
    entry = model.metadata_props.add()
    entry.key = "ingot.parameters"
    entry.value = ",".join(n for n in params if n in inits)
    if frozen:
        entry = model.metadata_props.add()
        entry.key = "ingot.frozen"
        entry.value = ",".join(frozen)
    # Embeddings' padding rows: PyTorch passes them no gradient from the lookup, which ONNX's
    # Gather cannot say (BERT's word embeddings, tied to its output layer, train differently
    # without it).
    padding = [f"{in_file(name + '.weight', m.weight)}:{m.padding_idx}" for name, m in module.named_modules()
               if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None]
    padding = [p for p in padding if p.rsplit(":", 1)[0] in inits]
    if padding:
        entry = model.metadata_props.add()
        entry.key = "ingot.padding_idx"
        entry.value = ",".join(padding)
    model.producer_name = "scripts/export_onnx.py"
    onnx.save(model, path)
    return [n for n in params if n in inits]


if __name__ == "__main__":
    import argparse
    import importlib

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("factory", help="module:function returning (module, example_input)")
    ap.add_argument("output")
    ap.add_argument("--dynamic-batch", action="store_true")
    ap.add_argument("--dynamo", action="store_true", help="export with torch.export (needs onnxscript)")
    ap.add_argument("--opset", type=int, default=OPSET)
    a = ap.parse_args()
    mod, fn = a.factory.split(":")
    module, x = getattr(importlib.import_module(mod), fn)()
    names = export(module, x, a.output, dynamic_batch=a.dynamic_batch, dynamo=a.dynamo, opset=a.opset)
    print(f"wrote {a.output}: {len(names)} parameters")
