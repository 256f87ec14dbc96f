//! Model names: the spec forms of the GPTs, CNNs and ResNets, their errors and batches.

use ingot_compiler::error::IrError;
use ingot_compiler::ir::DType;
use ingot_models::*;

fn err(s: &str) -> String {
    let e = GptConfig::parse(s).unwrap_err();
    assert!(matches!(e, IrError::Model { .. }), "{e:?}");
    e.to_string()
}

/// Asserts that `refusal` (the error of a GPT or a ResNet spec) of `spec` holds each of `what`.
fn assert_refused_naming(refusal: fn(&str) -> String, spec: &str, what: &[&str]) {
    let e = refusal(spec);
    assert!(what.iter().all(|w| e.contains(w)), "{e}");
}

const MINI: &str = "vocab=8192,d_model=512,layers=4,heads=8,d_ff=2048,seq=256,batch=16";

#[test]
fn the_spec_form_of_a_config_parses_back_to_it() {
    for (_, cfg) in GptConfig::named() {
        assert_eq!(GptConfig::parse(&cfg.to_string()).unwrap(), cfg);
    }
    assert_eq!(cfg_from(MINI), GptConfig::gpt_mini());
}

fn cfg_from(s: &str) -> GptConfig {
    GptConfig::parse(s).unwrap()
}

#[test]
fn keys_may_come_in_any_order_with_spaces() {
    let s = " batch=16, seq=256 ,d_ff=2048,heads=8,layers=4,d_model=512,vocab=8192,";
    assert_eq!(cfg_from(s), GptConfig::gpt_mini());
}

#[test]
fn an_unknown_key_is_named() {
    assert_refused_naming(
        err,
        &format!("{MINI},dropout=1"),
        &["unknown key \"dropout\""],
    );
}

#[test]
fn a_missing_key_is_named() {
    assert_refused_naming(
        err,
        "vocab=8192,d_model=512,layers=4,d_ff=2048,seq=256,batch=16",
        &["missing key \"heads\""],
    );
}

#[test]
fn a_repeated_key_is_named() {
    assert_refused_naming(
        err,
        &format!("{MINI},seq=128"),
        &["key \"seq\" is given twice"],
    );
}

#[test]
fn a_non_integer_value_names_its_key() {
    for bad in ["abc", "-4", "2.5", ""] {
        assert_refused_naming(
            err,
            &MINI.replace("layers=4", &format!("layers={bad}")),
            &["key \"layers\""],
        );
    }
}

#[test]
fn a_zero_value_names_its_key() {
    for k in GptConfig::KEYS {
        let s: Vec<String> = MINI
            .split(',')
            .map(|kv| {
                if kv.split('=').next() == Some(k) {
                    format!("{k}=0")
                } else {
                    kv.to_string()
                }
            })
            .collect();
        assert_refused_naming(
            err,
            &s.join(","),
            &[&format!("key {k:?} must be at least 1")],
        );
    }
}

#[test]
fn d_model_not_divisible_by_heads_names_heads() {
    let e = err(&MINI.replace("heads=8", "heads=7"));
    assert!(
        e.contains("key \"heads\"") && e.contains("512") && e.contains("7"),
        "{e}"
    );
}

#[test]
fn an_item_without_equals_is_refused() {
    assert_refused_naming(err, &format!("{MINI},big"), &["\"big\" is not key=value"]);
}

#[test]
fn sizes_that_overflow_are_refused_not_panicked_on() {
    assert_refused_naming(
        err,
        &MINI.replace("vocab=8192", &format!("vocab={}", usize::MAX)),
        &["too large"],
    );
}

#[test]
fn by_name_reports_errors_against_the_whole_spec() {
    let spec = "gpt:vocab=8192,d_model=512";
    match by_name(spec).unwrap_err() {
        IrError::Model { spec: s, reason } => {
            assert_eq!(s, spec);
            assert!(reason.contains("missing key \"layers\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn by_name_names_a_custom_gpt_by_its_spec() {
    let m = by_name("gpt:vocab=16, d_model=8,layers=1,heads=2,d_ff=32,seq=4,batch=2").unwrap();
    assert_eq!(
        m.name,
        "gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=32,seq=4,batch=2"
    );
    m.graph.verify().unwrap();
}

fn resnet_err(spec: &str) -> String {
    match by_name(spec).unwrap_err() {
        IrError::Model { spec: s, reason } => {
            assert_eq!(s, spec);
            reason
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_resnet_spec_fills_defaults_and_is_named_by_its_full_form() {
    let cfg = ResNetConfig::parse("depth=50").unwrap();
    assert_eq!(cfg, ResNetConfig::imagenet(50, 32));
    assert_eq!(ResNetConfig::parse(&cfg.to_string()).unwrap(), cfg);
    let m = by_name("resnet: side=32 ,depth=18,batch=2,width=8,classes=5").unwrap();
    assert_eq!(m.name, "resnet:depth=18,side=32,batch=2,classes=5,width=8");
}

#[test]
fn a_depth_torchvision_does_not_define_is_named() {
    assert_refused_naming(
        resnet_err,
        "resnet:depth=20,side=32,batch=2",
        &["key \"depth\"", "20"],
    );
    assert_refused_naming(
        resnet_err,
        "resnet:side=32,batch=2",
        &["missing key \"depth\""],
    );
}

#[test]
fn a_side_too_small_to_downsample_five_times_is_named() {
    assert_refused_naming(
        resnet_err,
        "resnet:depth=50,side=16,batch=2",
        &["key \"side\"", "at least 32"],
    );
}

#[test]
fn a_zero_or_one_value_batch_is_named() {
    assert_refused_naming(
        resnet_err,
        "resnet:depth=18,side=32,batch=0",
        &["key \"batch\" must be at least 1"],
    );
    // One image at 32x32 leaves layer4 1x1: one value per channel for its batch norms.
    assert_refused_naming(
        resnet_err,
        "resnet:depth=18,side=32,batch=1",
        &["key \"batch\""],
    );
    // At 64x64 layer4 is 2x2, and one image is enough.
    by_name("resnet:depth=18,side=64,batch=1,width=4").unwrap();
    let e = at_batch("resnet:depth=18,side=32,batch=2", 1, DType::F32).unwrap_err();
    assert!(e.to_string().contains("key \"batch\""), "{e}");
}

#[test]
fn resnet_spec_errors_name_the_key_or_item() {
    let too_wide = format!("resnet:depth=18,width={}", usize::MAX / 4);
    for (spec, what) in [
        ("resnet:depth=18,depth=34", "key \"depth\" is given twice"),
        ("resnet:depth=18,heads=2", "unknown key \"heads\""),
        ("resnet:depth=18,width=-1", "key \"width\""),
        (&too_wide, "too large"),
    ] {
        assert_refused_naming(resnet_err, spec, &[what]);
    }
}

#[test]
fn at_batch_changes_only_a_resnet_s_batch() {
    let m = at_batch("resnet:depth=34,side=32,batch=8,width=4", 2, DType::F32).unwrap();
    assert_eq!(
        m.name,
        "resnet:depth=34,side=32,batch=2,classes=1000,width=4"
    );
}

#[test]
fn a_cnn_spec_takes_its_batch_classes_and_side_and_is_named_by_its_full_form() {
    let m = by_name("cnn: side=32,batch=4,classes=3").unwrap();
    assert_eq!(m.name, "cnn:batch=4,classes=3,side=32");
    let ty = |n: &str| m.graph.ty(m.graph.leaf(n).unwrap()).shape.dims().to_vec();
    assert_eq!(ty("x"), [4, 1, 32, 32]);
    assert_eq!(ty("fc1.weight"), [128, 64 * 8 * 8]);
    assert_eq!(ty("fc2.weight"), [3, 128]);
    // The reference shape keeps its plain name, however it is written.
    assert_eq!(by_name("cnn:batch=128").unwrap().name, "cnn");
    // `cnn:batch=64` and the cnn at batch 64 are one model, by one name.
    assert_eq!(
        at_batch("cnn", 64, DType::F32).unwrap(),
        by_name("cnn:batch=64").unwrap()
    );
}

#[test]
fn cnn_spec_errors_name_the_key() {
    assert_refused_naming(
        resnet_err,
        "cnn:batch=4,side=3",
        &["key \"side\"", "at least 4"],
    );
    assert_refused_naming(
        resnet_err,
        "cnn:classes=0",
        &["key \"classes\" must be at least 1"],
    );
    assert_refused_naming(resnet_err, "cnn:depth=3", &["unknown key \"depth\""]);
}

#[test]
fn the_batch_a_spec_writes_is_told_apart_from_its_default() {
    assert_eq!(spec_batch("cnn").unwrap(), None);
    assert_eq!(spec_batch("cnn:side=32").unwrap(), None);
    assert_eq!(spec_batch("cnn:batch=64").unwrap(), Some(64));
    assert_eq!(spec_batch("resnet:depth=18,batch=3").unwrap(), Some(3));
    assert_eq!(spec_batch("resnet:depth=18").unwrap(), None);
    assert_eq!(spec_batch(&format!("gpt:{MINI}")).unwrap(), Some(16));
    assert_eq!(spec_batch("gpt2").unwrap(), None);
    assert!(spec_batch("cnn:batch=x").is_err());
    assert!(spec_batch("vgg").is_err());
}

#[test]
fn the_smallest_batch_is_two_only_where_a_resnets_layer4_is_one_by_one() {
    assert_eq!(min_batch("resnet18").unwrap(), 2);
    assert_eq!(min_batch("resnet:depth=50,side=32").unwrap(), 2);
    assert_eq!(min_batch("resnet:depth=50,side=64").unwrap(), 1);
    assert_eq!(min_batch("cnn").unwrap(), 1);
    assert_eq!(min_batch("mlp").unwrap(), 1);
    // What min_batch says is what the builders take.
    for spec in ["resnet18", "resnet:depth=18,side=32,width=4"] {
        let b = min_batch(spec).unwrap();
        at_batch(spec, b, DType::F32).unwrap();
        assert!(at_batch(spec, b - 1, DType::F32).is_err());
    }
}
