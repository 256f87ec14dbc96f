//! Model names as the command line takes them: `mlp`, `gpt-mini`, `gpt2`, `gpt2-medium`,
//! `gpt-1.3b`, `cnn`, `resnet18`,
//! `gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..`,
//! `cnn:batch=..,classes=..,side=..` and `resnet:depth=..,side=..,batch=..,classes=..,width=..`.
//!
//! Every name is read into one [`Spec`] first; building the model, building it at another
//! batch ([`at_batch`]), the batch a spec names ([`spec_batch`]) and the smallest batch the
//! model takes ([`min_batch`]) are all answered from it.

use super::check::model_err;
use super::cnn::{cnn_of, CnnConfig};
use super::gpt::{gpt, GptConfig};
use super::mlp::{mlp, mlp_with};
use super::resnet::{
    resnet, resnet18, resnet18_with, ResNetConfig, RESNET_BATCH, RESNET_CLASSES, RESNET_SIDE,
};
use ingot_compiler::error::Result;
use ingot_compiler::ir::DType;
use ingot_compiler::model::Model;

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
        Spec::Mlp => mlp_with(batch, dtype),
        Spec::Gpt(cfg) => {
            let cfg = GptConfig { batch, ..cfg };
            let mut m = gpt(&cfg, dtype)?;
            m.name = format!("gpt:{cfg}");
            Ok(m)
        }
        Spec::Cnn(cfg) => cnn_of(&CnnConfig { batch, ..cfg }, dtype),
        Spec::ResNet18 => resnet18_with(batch, dtype),
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
            side: RESNET_SIDE,
            batch: RESNET_BATCH,
            classes: RESNET_CLASSES,
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
    /// [`ResNetConfig::validate`] refuses is an [`ingot_compiler::IrError::Model`] naming the key.
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
    /// [`ingot_compiler::IrError::Model`] naming the key.
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
