//! The ResNet family (`resnet:depth=..`) against torchvision: every tensor named as
//! torchvision's `state_dict` names it, every depth planned, a narrow resnet50 trained on the
//! CPU to PyTorch's losses, its `--save` file a `state_dict` that torchvision loads strictly
//! and whose evaluation loss is PyTorch's, and top-1/top-5 counted beside the loss.
//!
//! The fixtures in `cli/tests/torch/` are written by `scripts/resnet_torch_fixtures.py` on a
//! machine with torch and torchvision; the tests here need neither.

#[path = "support/cli.rs"]
mod cli;

use cli::{ingot, ok, scratch};
use indexmap::IndexMap;
use ingot_compiler::ir::{DType, Graph, LeafKind};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline;
use ingot_compiler::trace::{accuracy, nn};
use ingot_models::ResNetConfig;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::io;
use ingot_runtime::Tensor;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/torch")
}

fn json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/resnet_torch_fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

/// (name, shape, dtype) of every tensor a PyTorch `state_dict` of `g` holds, in graph order:
/// parameters and running statistics, and each batch norm's `num_batches_tracked` (int64)
/// after its `running_var`, where torchvision registers it.
fn state_dict_of(g: &Graph) -> Vec<(String, Vec<usize>, String)> {
    let mut out = Vec::new();
    let resident: Vec<_> = g
        .leaves(LeafKind::Parameter)
        .into_iter()
        .chain(g.leaves(LeafKind::State))
        .collect();
    for id in g.ids().filter(|id| resident.contains(id)) {
        let name = g.leaf_name(id).unwrap().to_string();
        let dims = g.ty(id).shape.dims().to_vec();
        out.push((name.clone(), dims, "float32".to_string()));
        if let Some(m) = name.strip_suffix("running_var") {
            out.push((format!("{m}num_batches_tracked"), vec![], "int64".into()));
        }
    }
    out
}

fn listed(v: &serde_json::Value) -> Vec<(String, Vec<usize>, String)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect(),
                e["dtype"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn resnet18_and_resnet50_name_every_tensor_as_torchvision_s_state_dict_in_its_order() {
    let doc = json(&fixtures().join("torchvision_resnet_keys.json"));
    for (depth, key, params) in [(18, "resnet18", 11_689_512), (50, "resnet50", 25_557_032)] {
        let m = ingot_models::resnet(&ResNetConfig::imagenet(depth, 2), DType::F32).unwrap();
        assert_eq!(
            m.name,
            format!("resnet:depth={depth},side=224,batch=2,classes=1000,width=64")
        );
        assert_eq!(state_dict_of(&m.graph), listed(&doc[key]), "{key}");
        assert_eq!(
            ingot_compiler::model::parameter_count(&m.graph),
            params,
            "{key}"
        );
    }
}

#[test]
fn the_resnet18_spec_at_cifar_shape_traces_the_reference_resnet18() {
    let spec =
        ingot_models::by_name("resnet:depth=18,side=32,batch=128,classes=10,width=64").unwrap();
    let reference = ingot_models::by_name("resnet18").unwrap();
    assert_eq!(spec.graph, reference.graph);
    assert_eq!(spec.eval_graph, reference.eval_graph);
}

#[test]
fn every_resnet_depth_plans_on_the_cpu() {
    for depth in ResNetConfig::DEPTHS {
        let spec = format!("resnet:depth={depth},side=32,batch=2,classes=10,width=2");
        let m = ingot_models::by_name(&spec).unwrap();
        let blocks = [18, 34, 50, 101, 152]
            .iter()
            .position(|&d| d == depth)
            .unwrap();
        let last = [
            "layer4.1.",
            "layer4.2.",
            "layer4.2.",
            "layer4.2.",
            "layer4.2.",
        ][blocks];
        assert!(
            m.graph.leaf(&format!("{last}bn2.running_var")).is_some(),
            "{spec}: no {last}"
        );
        let c = pipeline::compile(&m, &pipeline::Options::for_target(Target::Cpu))
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        c.executable(Target::Cpu).unwrap();
    }
}

#[test]
fn a_bad_resnet_spec_is_refused_naming_the_field() {
    for (spec, field) in [
        ("resnet:depth=20,side=224,batch=8", "depth"),
        ("resnet:depth=50,side=16,batch=8", "side"),
        ("resnet:depth=50,side=224,batch=0", "batch"),
        ("resnet:depth=50,side=224,batch=8,width=x", "width"),
    ] {
        let out = ingot(&["plan", "--model", spec]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{spec} was accepted");
        assert!(
            err.contains(&format!("key \"{field}\"")) && err.contains(spec),
            "{spec}: {err}"
        );
    }
}

#[test]
fn a_cuda_bf16_resnet_is_planned_channels_last_by_default_on_any_machine_and_a_misspelt_conv_path_is_refused(
) {
    // The layout is the options' choice, not the compiling machine's: this machine (and CI)
    // has no cuDNN, the GPU machine has, and both must plan the step the GPU runs.
    let spec = "resnet:depth=18,side=32,batch=2,classes=10,width=8";
    let plan = |conv: &str| {
        let out = ingot(&[
            "--conv",
            conv,
            "plan",
            "--model",
            spec,
            "--device",
            "cuda",
            "--precision",
            "bf16",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
        v
    };
    let (auto, nchw) = (plan("auto"), plan("im2col"));
    assert_ne!(
        auto["ops"], nchw["ops"],
        "the default planned NCHW, as under --conv im2col (no transposes placed)"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["plan", "--model", spec, "--device", "cuda"])
        .env("INGOT_CONV", "cudn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("INGOT_CONV") && err.contains("im2col"),
        "{err}"
    );
}

/// A head of given logits: `loss = softmax_cross_entropy(x, y)`, with the top-k counts.
fn counted_head(n: usize, c: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input("x", [n, c], DType::F32).unwrap();
    let y = g.input("y", [n], DType::I64).unwrap();
    let loss = nn::softmax_cross_entropy(&mut g, x, y).unwrap();
    g.set_output("loss", loss).unwrap();
    accuracy::with_top_k_counts(&g).unwrap().unwrap()
}

#[test]
fn top_1_and_top_5_count_the_rows_whose_label_ranks_first_or_within_five() {
    // 7 classes; the label's rank (classes strictly above it) per row: 0, 2, 4, 5, 6, and a
    // tie for first (ranked first: no class is strictly above it).
    let rows: [([f32; 7], i64); 6] = [
        ([0.1, 3.0, 0.2, 0.3, 0.4, 0.5, 0.6], 1),
        ([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0], 2),
        ([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0], 4),
        ([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0], 5),
        ([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0], 6),
        ([1.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0], 2),
    ];
    let g = counted_head(rows.len(), 7);
    let mut values: IndexMap<String, Tensor> = IndexMap::new();
    values.insert(
        "x".into(),
        Tensor::from_f32([6, 7], rows.iter().flat_map(|r| r.0).collect()),
    );
    values.insert(
        "y".into(),
        Tensor::from_i64([6], rows.iter().map(|r| r.1).collect()),
    );
    let out = run_graph(&g, &values).unwrap().outputs;
    let count = |k: &str| out[k].to_f64_vec()[0];
    assert_eq!(count(accuracy::TOP1), 2.0, "rows 0 and 5");
    assert_eq!(count(accuracy::TOP5), 4.0, "rows 0, 1, 2 and 5");
}

#[test]
fn with_fewer_than_five_classes_every_row_is_within_the_top_five() {
    let g = counted_head(2, 3);
    let mut values: IndexMap<String, Tensor> = IndexMap::new();
    values.insert(
        "x".into(),
        Tensor::from_f32([2, 3], vec![0.0, 1.0, 2.0, 2.0, 1.0, 0.0]),
    );
    values.insert("y".into(), Tensor::from_i64([2], vec![0, 0]));
    let out = run_graph(&g, &values).unwrap().outputs;
    assert_eq!(out[accuracy::TOP1].to_f64_vec()[0], 1.0);
    assert_eq!(out[accuracy::TOP5].to_f64_vec()[0], 2.0);
}

/// The narrow resnet50 of `scripts/resnet_torch_fixtures.py` (width 4, 64×64, batch 2):
/// `--init` reads torchvision's whole `state_dict` (running statistics, warmed by 20 forward
/// passes, and `num_batches_tracked` included), 5 steps of SGD (momentum 0.9, weight decay 5e-4,
/// lr 0.001) give PyTorch's losses within 1e-4 relative, the evaluation after them (batch
/// norm by the running statistics, as `model.eval()`) gives PyTorch's loss within 1e-5 and
/// its top-1/top-5 hits, and `--save` writes exactly the trained model's `state_dict` keys,
/// shapes and dtypes (num_batches_tracked an int64 scalar holding 20 + 5), so that torchvision's
/// `load_state_dict(strict=True)` takes it (the script checks that with torch).
#[test]
fn a_narrow_resnet50_trains_to_pytorch_s_losses_and_saves_a_state_dict_torchvision_loads() {
    let dir = fixtures().join("resnet50");
    let doc = json(&dir.join("torch.json"));
    let tmp = scratch("resnet", "narrow_resnet50");
    let saved = tmp.join("trained.safetensors");
    let (init, batch) = (dir.join("init.safetensors"), dir.join("batch.safetensors"));
    let steps = doc["steps"].as_u64().unwrap().to_string();
    let lr = doc["lr"].as_f64().unwrap().to_string();
    let out = ok(&ingot(&[
        "train",
        "--model",
        doc["spec"].as_str().unwrap(),
        "--init",
        init.to_str().unwrap(),
        "--data",
        batch.to_str().unwrap(),
        "--val",
        batch.to_str().unwrap(),
        "--eval-batches",
        "1",
        "--steps",
        &steps,
        "--lr",
        &lr,
        "--save",
        saved.to_str().unwrap(),
        "--json",
    ]));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let losses: Vec<f64> = lines
        .iter()
        .filter(|l| l.get("step").is_some() && l.get("loss").is_some())
        .map(|l| l["loss"].as_f64().unwrap())
        .collect();
    let want: Vec<f64> = doc["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), want.len(), "{out}");
    for (i, (got, want)) in losses.iter().zip(&want).enumerate() {
        let rel = (got - want).abs() / want.abs();
        assert!(
            rel <= 1e-4,
            "step {}: Ingot {got}, PyTorch {want} (rel {rel:.2e})",
            i + 1
        );
    }
    let eval = lines
        .iter()
        .rev()
        .find(|l| l.get("val_loss").is_some())
        .unwrap_or_else(|| panic!("no evaluation line: {out}"));
    let (got, want) = (
        eval["val_loss"].as_f64().unwrap(),
        doc["eval_loss"].as_f64().unwrap(),
    );
    let rel = (got - want).abs() / want.abs();
    assert!(
        rel <= 1e-5,
        "eval: Ingot {got}, PyTorch {want} (rel {rel:.2e})"
    );
    let rows = 2.0;
    for (key, torch_key) in [("val_top1", "eval_top1"), ("val_top5", "eval_top5")] {
        assert_eq!(
            eval[key].as_f64().unwrap(),
            doc[torch_key].as_f64().unwrap() / rows,
            "{key}"
        );
    }
    let file = io::load(&saved).unwrap();
    let got: Vec<(String, Vec<usize>, String)> = file
        .iter()
        .map(|(k, t)| {
            let dtype = match t.dtype() {
                DType::F32 => "float32",
                DType::I64 => "int64",
                other => panic!("{k}: {other}"),
            };
            (k.clone(), t.dims().to_vec(), dtype.to_string())
        })
        .collect();
    let mut want = listed(&doc["state_dict"]);
    let mut got_sorted = got.clone();
    want.sort();
    got_sorted.sort();
    assert_eq!(got_sorted, want, "the saved file's keys, shapes and dtypes");
    // The count --init read, advanced by the steps trained.
    let warm = doc["warm"].as_f64().unwrap();
    let tracked = &file["layer3.5.bn3.num_batches_tracked"];
    assert_eq!(tracked.to_f64_vec(), vec![warm + 5.0]);
}
