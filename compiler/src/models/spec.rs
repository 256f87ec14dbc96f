//! Model names as the command line takes them: `mlp`, `gpt-mini`, `gpt2`, `cnn`, `resnet18`, and
//! `gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..`.

use super::{cnn, gpt, mlp, model_err, resnet18, GptConfig, Model};
use crate::error::Result;
use crate::ir::DType;

/// The names [`by_name`] accepts (the last stands for any GPT shape).
pub const KNOWN_MODELS: [&str; 6] = [
    "mlp",
    "gpt-mini",
    "gpt2",
    "cnn",
    "resnet18",
    "gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..",
];

/// The model `spec` names, in f32.
pub fn by_name(spec: &str) -> Result<Model> {
    by_name_with(spec, DType::F32)
}

/// The model `spec` names, in `dtype` (f64 for gradient checks).
pub fn by_name_with(spec: &str, dtype: DType) -> Result<Model> {
    match spec {
        "mlp" => mlp(dtype),
        "gpt-mini" => gpt(&GptConfig::gpt_mini(), dtype),
        "gpt2" => gpt(&GptConfig::gpt2(), dtype),
        "cnn" => cnn(dtype),
        "resnet18" => resnet18(dtype),
        _ => match spec.strip_prefix("gpt:") {
            Some(rest) => {
                let cfg = parse_as(spec, rest)?;
                let mut m = gpt(&cfg, dtype)?;
                m.name = format!("gpt:{cfg}");
                Ok(m)
            }
            None => Err(model_err(
                spec,
                format!("unknown model; known models: {}", KNOWN_MODELS.join(", ")),
            )),
        },
    }
}

/// The model `spec` names, at batch `batch` instead of its own (in `dtype`): every named model
/// and every `gpt:` spec. A GPT keeps its other settings and is named by its full `gpt:` spec.
pub fn at_batch(spec: &str, batch: usize, dtype: DType) -> Result<Model> {
    if batch == 0 {
        return Err(model_err(spec, String::from("a batch of 0")));
    }
    let gpt_at = |mut cfg: GptConfig| -> Result<Model> {
        cfg.batch = batch;
        let mut m = gpt(&cfg, dtype)?;
        m.name = format!("gpt:{cfg}");
        Ok(m)
    };
    match spec {
        "mlp" => super::mlp_with(batch, dtype),
        "cnn" => super::cnn_with(batch, dtype),
        "resnet18" => super::resnet18_with(batch, dtype),
        "gpt-mini" => gpt_at(GptConfig::gpt_mini()),
        "gpt2" => gpt_at(GptConfig::gpt2()),
        _ => match spec.strip_prefix("gpt:") {
            Some(rest) => gpt_at(parse_as(spec, rest)?),
            None => Err(model_err(
                spec,
                format!("unknown model; known models: {}", KNOWN_MODELS.join(", ")),
            )),
        },
    }
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
    let mut vals: [Option<usize>; 7] = [None; 7];
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
        for cfg in [GptConfig::gpt_mini(), GptConfig::gpt2()] {
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
}
