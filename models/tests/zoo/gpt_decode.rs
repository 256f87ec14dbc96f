//! The GPT decode step: its parameters, caches and model names.

use ingot_compiler::ir::{DType, Graph, LeafKind};
use ingot_models::gpt_decode::*;
use ingot_models::GptConfig;

fn cfg() -> GptConfig {
    GptConfig::parse("vocab=16,d_model=8,layers=2,heads=2,d_ff=16,seq=4,batch=1").unwrap()
}

#[test]
fn the_decode_step_reads_the_training_steps_parameters_by_the_same_names() {
    let g = gpt_decode(&cfg(), DType::F32, DType::F32).unwrap();
    let m = ingot_models::gpt(&cfg(), DType::F32).unwrap();
    let names = |g: &Graph| -> Vec<(String, String)> {
        g.leaves(LeafKind::Parameter)
            .into_iter()
            .map(|id| (g.leaf_name(id).unwrap().to_string(), g.ty(id).to_string()))
            .collect()
    };
    assert_eq!(names(&g), names(&m.graph));
}

#[test]
fn each_layer_keeps_a_key_and_a_value_cache_updated_in_place() {
    let g = gpt_decode(&cfg(), DType::F32, DType::BF16).unwrap();
    let caches = cache_leaves(&g);
    let names: Vec<_> = caches.iter().map(|&id| g.leaf_name(id).unwrap()).collect();
    assert_eq!(
        names,
        [
            "kv_cache.0.k",
            "kv_cache.0.v",
            "kv_cache.1.k",
            "kv_cache.1.v"
        ]
    );
    for &c in &caches {
        assert_eq!(g.ty(c).to_string(), "bf16[1,2,4,4]");
        assert!(
            g.updates.iter().any(|u| u.target == c),
            "{c} is not updated"
        );
    }
    assert_eq!(g.ty(g.outputs["logits"]).shape.dims(), &[1, 16]);
    g.verify().unwrap();
}

#[test]
fn model_names_of_the_gpt_family_give_their_shapes_and_others_none() {
    assert_eq!(gpt_config_of("gpt-mini"), Some(GptConfig::gpt_mini()));
    assert_eq!(
        gpt_config_of("gpt:vocab=16,d_model=8,layers=2,heads=2,d_ff=16,seq=4,batch=1"),
        Some(cfg())
    );
    assert_eq!(gpt_config_of("mlp"), None);
    assert_eq!(gpt_config_of("gpt:vocab=16"), None);
}
