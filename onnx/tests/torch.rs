//! Models exported from PyTorch train in Ingot as they train in PyTorch: for each fixture
//! folder `onnx/tests/torch/<name>/` (written by `scripts/onnx_torch_fixtures.py` on a machine
//! with PyTorch), the imported model, loaded with PyTorch's initial state_dict (every
//! parameter found under its PyTorch name) and trained 5 SGD steps on the CPU on the saved
//! batch, gives PyTorch's losses within 1e-4 relative, and a transformer's attention layers
//! (transformers' GPT-2 and BERT included, as PyTorch's SDPA export writes them) become
//! Ingot's fused attention. The fixtures are committed, so a missing folder fails the test,
//! saying which and how to make it (a test that passed with every folder gone checked nothing).

mod support;

use indexmap::IndexMap;
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::ir::LeafKind;
use ingot_onnx::{import, ClassAxis, ImportOptions, Loss};
use ingot_runtime::io;
use ingot_runtime::tensor::Tensor;
use ingot_trainer::session::Session;
use std::path::PathBuf;
use support::*;

// hf_gpt2_mask_once: transformers 5.17's GPT-2, whose causal mask is built once for the model (a
// folded constant `[batch, 1, T, T]`) where later versions build it in every layer.
// pad: F.pad in constant (value 0.5, uneven), reflect, replicate (edge) modes and crops.
// dynamo_*: exported with `dynamo=True` (PyTorch 2.15, onnxscript 0.7.2): the MLP and the
// padding model at opset 28 (the newest onnx 1.23 writes), the GPT at 18 (onnx's converter
// has no Gelu adapter), whose `split` is SplitToSequence and SequenceAt, every Reshape
// `allowzero=1`.
// dynamo_hf_*: transformers' two under dynamo (their SDPA ONNX's Attention, opset 23; BERT's
// token types a GatherND of constants; GPT-2's tied embedding named lm_head.weight).
const MODELS: [&str; 12] = [
    "mlp",
    "cnn",
    "gpt",
    "hf_gpt2",
    "hf_bert",
    "hf_gpt2_mask_once",
    "pad",
    "dynamo_mlp",
    "dynamo_pad",
    "dynamo_gpt",
    "dynamo_hf_gpt2",
    "dynamo_hf_bert",
];

fn train_like_pytorch(name: &str) -> Option<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/torch")
        .join(name);
    if !dir.join("losses.json").exists() {
        eprintln!(
            "the PyTorch fixture {name}: {} is missing (run `python3 scripts/onnx_torch_fixtures.py onnx/tests/torch` where PyTorch is installed)",
            dir.display()
        );
        return None;
    }
    let doc = json(&dir.join("losses.json"));
    let lr = doc["lr"].as_f64().unwrap();
    let opts = ImportOptions {
        loss: Loss::CrossEntropy {
            logits: doc["logits"].as_str().map(String::from),
        },
        class_axis: ClassAxis::Last,
        optimizer: Optimizer::Sgd { lr },
        ..Default::default()
    };
    let imp = import(&dir.join("model.onnx"), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    // A transformer's attention, however its exporter wrote it, is Ingot's fused attention.
    if let Some(want) = doc["attentions"].as_u64() {
        let (_, fused) = ingot_compiler::recognize::attention(&imp.model.graph).unwrap();
        assert_eq!(fused as u64, want, "{name}: attentions fused");
    }
    let init = io::load(dir.join("init.safetensors")).unwrap();
    let file = weights(&imp);
    let mut params = IndexMap::new();
    let mut state: IndexMap<String, Tensor> = IndexMap::new();
    for (k, w) in &imp.weights {
        match w.kind {
            LeafKind::Parameter => {
                let t = init.get(k).unwrap_or_else(|| {
                    panic!(
                        "{name}: parameter {k} is not in PyTorch's state_dict ({:?})",
                        init.keys().collect::<Vec<_>>()
                    )
                });
                params.insert(k.clone(), t.clone());
            }
            _ => {
                state.insert(k.clone(), init.get(k).unwrap_or(&file[k]).clone());
            }
        }
    }
    let mut s = Session::new(&imp.model, 0).unwrap();
    s.load_parameters(&params)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    s.load_optimizer_state(&state)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let batch = io::load(dir.join("batch.safetensors")).unwrap();
    s.set_batch(&batch["x"], &batch["y"])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (i, want) in doc["losses"].as_array().unwrap().iter().enumerate() {
        let want = want.as_f64().unwrap();
        let got = s.step().unwrap().loss;
        assert!(
            close(got, want, 1e-4),
            "{name}: step {i}: Ingot's loss {got}, PyTorch's {want}"
        );
    }
    Some(())
}

#[test]
fn models_exported_from_pytorch_train_with_pytorchs_losses() {
    let ran: Vec<&str> = MODELS
        .into_iter()
        .filter(|m| train_like_pytorch(m).is_some())
        .collect();
    assert_eq!(
        ran, MODELS,
        "every committed PyTorch fixture trains (the missing ones are named above)"
    );
}
