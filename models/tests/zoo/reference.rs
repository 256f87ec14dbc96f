//! The reference models' parameters, inputs, dtypes and optimizers, as reference-models.md gives them.

use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::error::IrError;
use ingot_compiler::ir::{DType, Graph, LeafKind, Shape, TensorType};
use ingot_compiler::model::parameter_count;
use ingot_compiler::model::ID_DTYPE;
use ingot_models::*;

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
    let m =
        by_name("gpt:vocab=8192,d_model=512,layers=4,heads=8,d_ff=2048,seq=256,batch=16").unwrap();
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
