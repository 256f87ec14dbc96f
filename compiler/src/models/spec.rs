//! Model names as the command line takes them: `mlp`, `gpt-mini`, `gpt2`, `gpt2-medium`,
//! `gpt-1.3b`, `cnn`, `resnet18`,
//! `gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..`,
//! `cnn:batch=..,classes=..,side=..` and `resnet:depth=..,side=..,batch=..,classes=..,width=..`.
//!
//! Every name is read into one [`Spec`] first; building the model, building it at another
//! batch ([`at_batch`]), the batch a spec names ([`spec_batch`]) and the smallest batch the
//! model takes ([`min_batch`]) are all answered from it.

use super::{
    cnn_of, gpt, mlp, model_err, resnet, resnet18, CnnConfig, GptConfig, Model, ResNetConfig,
};
use crate::error::Result;
use crate::ir::DType;

/// The names [`by_name`] accepts (the `gpt:`, `cnn:` and `resnet:` forms stand for any shape).
pub const KNOWN_MODELS: [&str; 10] = [
    "mlp",
    "gpt-mini",
    "gpt2",
    "gpt2-medium",
    "gpt-1.3b",
    "cnn",
    "resnet18",
    "gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..",
    "cnn:batch=..,classes=..,side=..",
    "resnet:depth=18|34|50|101|152,side=..,batch=..,classes=..,width=..",
];

/// A model name read: which model, at which shape.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spec {
    Mlp,
    /// `gpt-mini`, `gpt2`, `gpt2-medium`, `gpt-1.3b` or a `gpt:` spec.
    Gpt(GptConfig),
    Cnn(CnnConfig),
    /// The reference `resnet18` (its own name).
    ResNet18,
    ResNet(ResNetConfig),
}

/// Reads `spec`; an unknown name or a bad spec is an error naming it.
fn parse_spec(spec: &str) -> Result<Spec> {
    Ok(match spec {
        "mlp" => Spec::Mlp,
        "gpt-mini" => Spec::Gpt(GptConfig::gpt_mini()),
        "gpt2" => Spec::Gpt(GptConfig::gpt2()),
        "gpt2-medium" => Spec::Gpt(GptConfig::gpt2_medium()),
        "gpt-1.3b" => Spec::Gpt(GptConfig::gpt_1_3b()),
        "cnn" => Spec::Cnn(CnnConfig::DEFAULTS),
        "resnet18" => Spec::ResNet18,
        _ => {
            if let Some(rest) = spec.strip_prefix("gpt:") {
                Spec::Gpt(parse_as(spec, rest)?)
            } else if let Some(rest) = spec.strip_prefix("cnn:") {
                Spec::Cnn(parse_cnn_as(spec, rest)?)
            } else if let Some(rest) = spec.strip_prefix("resnet:") {
                Spec::ResNet(parse_resnet_as(spec, rest)?)
            } else {
                return Err(model_err(
                    spec,
                    format!("unknown model; known models: {}", KNOWN_MODELS.join(", ")),
                ));
            }
        }
    })
}

/// The model `spec` names, in f32.
pub fn by_name(spec: &str) -> Result<Model> {
    by_name_with(spec, DType::F32)
}

/// The model `spec` names, in `dtype` (f64 for gradient checks).
pub fn by_name_with(spec: &str, dtype: DType) -> Result<Model> {
    match parse_spec(spec)? {
        Spec::Mlp => mlp(dtype),
        Spec::Gpt(cfg) => {
            let mut m = gpt(&cfg, dtype)?;
            if spec.starts_with("gpt:") {
                m.name = format!("gpt:{cfg}");
            }
            Ok(m)
        }
        Spec::Cnn(cfg) => cnn_of(&cfg, dtype),
        Spec::ResNet18 => resnet18(dtype),
        Spec::ResNet(cfg) => resnet_named(spec, &cfg, dtype),
    }
}

/// The ResNet `cfg` shapes, named by its full `resnet:` spec; an error names `spec` (what the
/// user typed).
fn resnet_named(spec: &str, cfg: &ResNetConfig, dtype: DType) -> Result<Model> {
    cfg.validate(spec)?;
    resnet(cfg, dtype)
}

/// The model `spec` names, at batch `batch` instead of its own (in `dtype`): every named model
/// and every spec. A GPT keeps its other settings and is named by its full `gpt:` spec, a `cnn`
/// by its `cnn:` spec ([`CnnConfig::name`]), a ResNet spec by its `resnet:` spec.
pub fn at_batch(spec: &str, batch: usize, dtype: DType) -> Result<Model> {
    if batch == 0 {
        return Err(model_err(spec, String::from("a batch of 0")));
    }
    match parse_spec(spec)? {
        Spec::Mlp => super::mlp_with(batch, dtype),
        Spec::Gpt(cfg) => {
            let cfg = GptConfig { batch, ..cfg };
            let mut m = gpt(&cfg, dtype)?;
            m.name = format!("gpt:{cfg}");
            Ok(m)
        }
        Spec::Cnn(cfg) => cnn_of(&CnnConfig { batch, ..cfg }, dtype),
        Spec::ResNet18 => super::resnet18_with(batch, dtype),
        Spec::ResNet(cfg) => resnet_named(spec, &ResNetConfig { batch, ..cfg }, dtype),
    }
}

/// The batch `spec` itself gives (`batch=..` written in a `gpt:`, `cnn:` or `resnet:` spec),
/// or `None` for a plain name or a spec that leaves it to its default: what a `--batch` flag
/// beside it must agree with.
pub fn spec_batch(spec: &str) -> Result<Option<usize>> {
    parse_spec(spec)?;
    let given = |body: &str, keys: &[&str]| -> Result<Option<usize>> {
        let i = keys.iter().position(|&k| k == "batch").unwrap_or(0);
        Ok(parse_keys(spec, body, keys)?[i])
    };
    if let Some(rest) = spec.strip_prefix("gpt:") {
        given(rest, &GptConfig::KEYS)
    } else if let Some(rest) = spec.strip_prefix("cnn:") {
        given(rest, &CnnConfig::KEYS)
    } else if let Some(rest) = spec.strip_prefix("resnet:") {
        given(rest, &ResNetConfig::KEYS)
    } else {
        Ok(None)
    }
}

/// The smallest batch the model `spec` names can be built at: 1, or for a ResNet whose
/// `layer4` is 1×1 (side under 64), 2 (its batch norms need two values per channel,
/// [`ResNetConfig::validate`]). The batch searches (`--max-batch`, accumulation's
/// micro-batches) start here.
pub fn min_batch(spec: &str) -> Result<usize> {
    let cfg = match parse_spec(spec)? {
        Spec::ResNet(cfg) => cfg,
        Spec::ResNet18 => ResNetConfig {
            depth: 18,
            side: super::RESNET_SIDE,
            batch: super::RESNET_BATCH,
            classes: super::RESNET_CLASSES,
            width: 64,
        },
        _ => return Ok(1),
    };
    Ok(cfg.min_batch())
}

/// Parses a `cnn:` spec's `body` (any keys of [`CnnConfig::KEYS`], the rest
/// [`CnnConfig::DEFAULTS`]), reporting errors against `spec`.
fn parse_cnn_as(spec: &str, body: &str) -> Result<CnnConfig> {
    let vals = parse_keys(spec, body, &CnnConfig::KEYS)?;
    let d = CnnConfig::DEFAULTS;
    let cfg = CnnConfig {
        batch: vals[0].unwrap_or(d.batch),
        classes: vals[1].unwrap_or(d.classes),
        side: vals[2].unwrap_or(d.side),
    };
    cfg.validate(spec)?;
    Ok(cfg)
}

impl ResNetConfig {
    /// Reads `depth=..,side=..,batch=..,classes=..,width=..` (any order, spaces allowed):
    /// `depth` is required, the other keys default to [`ResNetConfig::DEFAULTS`]. An unknown
    /// or repeated key, a value that is not a positive integer, or a shape
    /// [`ResNetConfig::validate`] refuses is an [`crate::IrError::Model`] naming the key.
    pub fn parse(s: &str) -> Result<ResNetConfig> {
        parse_resnet_as(s, s)
    }
}

/// Parses a ResNet spec's `body`, reporting errors against `spec`.
fn parse_resnet_as(spec: &str, body: &str) -> Result<ResNetConfig> {
    let keys = ResNetConfig::KEYS;
    let vals = parse_keys(spec, body, &keys)?;
    let d = ResNetConfig::DEFAULTS;
    let Some(depth) = vals[0] else {
        return Err(model_err(
            spec,
            "missing key \"depth\" (18, 34, 50, 101 or 152; side, batch, classes and width have defaults)",
        ));
    };
    let cfg = ResNetConfig {
        depth,
        side: vals[1].unwrap_or(d.side),
        batch: vals[2].unwrap_or(d.batch),
        classes: vals[3].unwrap_or(d.classes),
        width: vals[4].unwrap_or(d.width),
    };
    cfg.validate(spec)?;
    Ok(cfg)
}

/// Reads `key=value` items separated by commas (spaces around them allowed), each key one of
/// `keys` at most once, each value a non-negative integer; returns the values in `keys`'
/// order. Errors name the item or key, against `spec`.
fn parse_keys(spec: &str, body: &str, keys: &[&str]) -> Result<Vec<Option<usize>>> {
    let mut vals: Vec<Option<usize>> = vec![None; keys.len()];
    for item in body.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(model_err(
                spec,
                format!("{item:?} is not key=value (keys: {})", keys.join(", ")),
            ));
        };
        let (k, v) = (k.trim(), v.trim());
        let Some(i) = keys.iter().position(|&known| known == k) else {
            return Err(model_err(
                spec,
                format!("unknown key {k:?} (keys: {})", keys.join(", ")),
            ));
        };
        if vals[i].is_some() {
            return Err(model_err(spec, format!("key {k:?} is given twice")));
        }
        let n: usize = v
            .parse()
            .map_err(|_| model_err(spec, format!("key {k:?}: {v:?} is not a positive integer")))?;
        vals[i] = Some(n);
    }
    Ok(vals)
}

impl GptConfig {
    /// Reads `vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..` (every key exactly
    /// once, any order, spaces around items allowed). An unknown, repeated or missing key, a value
    /// that is not a positive integer, or `d_model` not divisible by `heads` is an
    /// [`crate::IrError::Model`] naming the key.
    pub fn parse(s: &str) -> Result<GptConfig> {
        parse_as(s, s)
    }
}

/// Parses `body`, reporting errors against `spec` (the whole name the user typed).
fn parse_as(spec: &str, body: &str) -> Result<GptConfig> {
    let keys = GptConfig::KEYS;
    let vals = parse_keys(spec, body, &keys)?;
    let mut got = [0usize; 7];
    for (i, v) in vals.iter().enumerate() {
        got[i] = v.ok_or_else(|| {
            model_err(
                spec,
                format!(
                    "missing key {:?} (a GPT spec needs all of: {})",
                    keys[i],
                    keys.join(", ")
                ),
            )
        })?;
    }
    let [vocab, d_model, layers, heads, d_ff, seq, batch] = got;
    let cfg = GptConfig {
        vocab,
        d_model,
        layers,
        heads,
        d_ff,
        seq,
        batch,
    };
    cfg.validate(spec)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::IrError;

    fn err(s: &str) -> String {
        let e = GptConfig::parse(s).unwrap_err();
        assert!(matches!(e, IrError::Model { .. }), "{e:?}");
        e.to_string()
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
        let e = err(&format!("{MINI},dropout=1"));
        assert!(e.contains("unknown key \"dropout\""), "{e}");
    }

    #[test]
    fn a_missing_key_is_named() {
        let e = err("vocab=8192,d_model=512,layers=4,d_ff=2048,seq=256,batch=16");
        assert!(e.contains("missing key \"heads\""), "{e}");
    }

    #[test]
    fn a_repeated_key_is_named() {
        let e = err(&format!("{MINI},seq=128"));
        assert!(e.contains("key \"seq\" is given twice"), "{e}");
    }

    #[test]
    fn a_non_integer_value_names_its_key() {
        for bad in ["abc", "-4", "2.5", ""] {
            let e = err(&MINI.replace("layers=4", &format!("layers={bad}")));
            assert!(e.contains("key \"layers\""), "{e}");
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
            let e = err(&s.join(","));
            assert!(e.contains(&format!("key {k:?} must be at least 1")), "{e}");
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
        let e = err(&format!("{MINI},big"));
        assert!(e.contains("\"big\" is not key=value"), "{e}");
    }

    #[test]
    fn sizes_that_overflow_are_refused_not_panicked_on() {
        let e = err(&MINI.replace("vocab=8192", &format!("vocab={}", usize::MAX)));
        assert!(e.contains("too large"), "{e}");
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
        let e = resnet_err("resnet:depth=20,side=32,batch=2");
        assert!(e.contains("key \"depth\"") && e.contains("20"), "{e}");
        let e = resnet_err("resnet:side=32,batch=2");
        assert!(e.contains("missing key \"depth\""), "{e}");
    }

    #[test]
    fn a_side_too_small_to_downsample_five_times_is_named() {
        let e = resnet_err("resnet:depth=50,side=16,batch=2");
        assert!(
            e.contains("key \"side\"") && e.contains("at least 32"),
            "{e}"
        );
    }

    #[test]
    fn a_zero_or_one_value_batch_is_named() {
        let e = resnet_err("resnet:depth=18,side=32,batch=0");
        assert!(e.contains("key \"batch\" must be at least 1"), "{e}");
        // One image at 32x32 leaves layer4 1x1: one value per channel for its batch norms.
        let e = resnet_err("resnet:depth=18,side=32,batch=1");
        assert!(e.contains("key \"batch\""), "{e}");
        // At 64x64 layer4 is 2x2, and one image is enough.
        by_name("resnet:depth=18,side=64,batch=1,width=4").unwrap();
        let e = at_batch("resnet:depth=18,side=32,batch=2", 1, DType::F32).unwrap_err();
        assert!(e.to_string().contains("key \"batch\""), "{e}");
    }

    #[test]
    fn resnet_spec_errors_name_the_key_or_item() {
        let e = resnet_err("resnet:depth=18,depth=34");
        assert!(e.contains("key \"depth\" is given twice"), "{e}");
        let e = resnet_err("resnet:depth=18,heads=2");
        assert!(e.contains("unknown key \"heads\""), "{e}");
        let e = resnet_err("resnet:depth=18,width=-1");
        assert!(e.contains("key \"width\""), "{e}");
        let e = resnet_err(&format!("resnet:depth=18,width={}", usize::MAX / 4));
        assert!(e.contains("too large"), "{e}");
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
        let e = resnet_err("cnn:batch=4,side=3");
        assert!(
            e.contains("key \"side\"") && e.contains("at least 4"),
            "{e}"
        );
        let e = resnet_err("cnn:classes=0");
        assert!(e.contains("key \"classes\" must be at least 1"), "{e}");
        let e = resnet_err("cnn:depth=3");
        assert!(e.contains("unknown key \"depth\""), "{e}");
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
}
