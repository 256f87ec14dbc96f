//! `ingot generate`: text from a trained language model ([`ingot_trainer::generate::Generator`]):
//! each prompt's tokens, then `--tokens N` more drawn one at a time, planned before the first
//! token (the planned bytes are printed on standard error before it). A GPT of the built-in
//! family runs its decode step with its KV cache (or, with `--whole-window`, the forward step
//! over the whole context window, the reference); an imported ONNX decoder (`--onnx`) runs its
//! forward graph over the whole window, its logits output found by name or by shape, its data
//! inputs other than the token ids held at a value (`--input-value`, train's parser). Text
//! becomes tokens as bytes, or by a Hugging Face `tokenizer.json` (`--tokenizer`).

use super::eval::{DeviceArgs, Weights, WeightsArgs};
use crate::failure::Failure;
use indexmap::IndexMap;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::precision::Precision;
use ingot_onnx::HeldValue;
use ingot_runtime::tensor::Tensor;
use ingot_trainer::data::tokenizer::TextTokenizer;
use ingot_trainer::generate::{decoder_logits, Generator, Sampling, Tokenizer};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The model (gpt-mini, gpt2, gpt:vocab=..,..); default: the one the --checkpoint's run
    /// trained. Its batch is ignored: generation runs one sequence per prompt.
    #[arg(long, conflicts_with = "onnx")]
    pub model: Option<String>,
    /// An ONNX decoder (a forward pass from token ids to logits, e.g. transformers' GPT-2
    /// exported by scripts/export_onnx.py) instead of --model: its forward graph runs over the
    /// whole context window for each token, with the file's weights unless --init or
    /// --checkpoint (of a run that trained this file) gives them.
    #[arg(long, value_name = "MODEL.onnx")]
    pub onnx: Option<PathBuf>,
    /// The output of --onnx holding the logits; default: the output named logits, else the
    /// only one shaped [batch, seq, vocab] over the input's [batch, seq] token ids.
    #[arg(long, value_name = "NAME", requires = "onnx")]
    pub logits: Option<String>,
    /// The size of a symbolic axis of --onnx's input other than the batch, by its name
    /// (repeatable): `--dim sequence=64` for a decoder exported with a dynamic sequence axis
    /// (Ingot plans static shapes: this is the context window).
    #[arg(long = "dim", value_name = "NAME=SIZE", requires = "onnx", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// Hold a data input of the ONNX decoder other than the token ids at a value
    /// (repeatable), as train's --input-value: `attention_mask=1` (a mask of ones: every
    /// position of the window seen), `position_ids=positions` (0, 1, .. along the window, where
    /// generation places the tokens), `token_type_ids=0`.
    #[arg(long = "input-value", value_name = "NAME=VALUE", value_parser = crate::onnx::parse_input_value)]
    pub input_value: Vec<(String, HeldValue)>,
    /// A checkpoint directory written by `ingot train --checkpoint DIR`: its weights.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present_any = ["init", "onnx"],
        conflicts_with = "init"
    )]
    pub checkpoint: Option<PathBuf>,
    /// Weights as safetensors with PyTorch's names (what `ingot train --save` writes).
    #[arg(long, value_name = "P.safetensors")]
    pub init: Option<PathBuf>,
    /// The text the generated tokens continue (byte-level tokens: each byte one token, unless
    /// --tokenizer). Repeat it to continue several prompts at once: the whole-window step runs
    /// them as the rows of its batch, the decode step one after another; each prompt's tokens
    /// are the ones it gets alone.
    #[arg(long, allow_hyphen_values = true, required = true)]
    pub prompt: Vec<String>,
    /// A Hugging Face tokenizer.json (as `ingot data tokenize --tokenizer` reads): the prompt
    /// is encoded and the tokens decoded with it instead of as bytes. Its vocabulary must not
    /// be larger than the model's.
    #[arg(long, value_name = "tokenizer.json")]
    pub tokenizer: Option<PathBuf>,
    /// How many tokens to generate.
    #[arg(long, value_name = "N", value_parser = crate::numbers::count)]
    pub tokens: u64,
    /// Softmax temperature of the draws; 0 takes the most likely token each time (greedy).
    #[arg(long, value_name = "T", default_value_t = 0.8, value_parser = crate::numbers::non_negative)]
    pub temperature: f64,
    /// Draw only among the K most likely tokens.
    #[arg(long = "top-k", value_name = "K", value_parser = crate::numbers::positive_count)]
    pub top_k: Option<u64>,
    /// The seed of the draws: the same seed, weights and prompt give the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub precision: crate::precision_args::PrecisionArgs,
    /// Run the forward step over the whole context window for each token instead of the
    /// decode step with its KV cache: the reference the cached step is checked against
    /// (the same context, so the same greedy tokens), `seq` times the work per token.
    #[arg(long = "whole-window")]
    pub whole_window: bool,
    /// Print one JSON object per prompt ({"prompt", "prompt_tokens", "text", "tokens", ...})
    /// instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &GenerateArgs) -> Result<(), Failure> {
    if a.model.is_none() && a.onnx.is_none() && a.checkpoint.is_none() {
        return Err(Failure::new(
            2,
            "--init needs --model NAME or --onnx MODEL.onnx (a checkpoint records its model; a weights file does not)",
        ));
    }
    let device = a.device.session_device()?;
    // The tokenizer first: a wrong file fails before a model is compiled.
    let tokenizer = match &a.tokenizer {
        None => Tokenizer::Bytes,
        Some(path) => Tokenizer::File(Box::new(
            TextTokenizer::from_file(path)
                .map_err(|e| Failure::new(1, format!("--tokenizer: {e}")))?,
        )),
    };
    let weights = if a.checkpoint.is_some() || a.init.is_some() {
        let args = WeightsArgs {
            checkpoint: a.checkpoint.clone(),
            init: a.init.clone(),
        };
        Some(args.read()?)
    } else {
        None
    };
    // A checkpoint of `train --onnx M.onnx` records M.onnx: generation imports it again (its
    // training flags, the loss's, do not change the forward pass).
    let recorded_onnx = weights
        .as_ref()
        .and_then(|w| w.model.as_deref())
        .map(Path::new)
        .filter(|p| a.model.is_none() && p.is_file())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"));
    let precision = a.precision.for_device(a.device.device)?;
    let (mut generator, name, precision) = match a.onnx.as_deref().or(recorded_onnx) {
        Some(path) => onnx_generator(a, path, weights.as_ref(), precision, device)?,
        None => named_generator(a, weights.as_ref(), precision, device)?,
    };
    let (_, vocab) = generator.window_and_vocab();
    tokenizer
        .check_model_vocab(vocab)
        .map_err(|e| Failure::new(1, format!("--tokenizer: {e}")))?;
    // The peak, before the first token.
    let human = ingot_compiler::report::human;
    if generator.is_cached() {
        errln!(
            "generate: the decode step of {name} planned in one allocation of {} (KV cache {}), in {precision}",
            human(generator.planned_bytes()),
            human(generator.cache_bytes())
        );
    } else {
        errln!(
            "generate: the whole-window step of {name} planned in one allocation of {}, in {precision}",
            human(generator.planned_bytes())
        );
    }
    let prompts = a
        .prompt
        .iter()
        .map(|p| tokenizer.encode(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::new(1, format!("--prompt: {e}")))?;
    let sampling = Sampling {
        temperature: a.temperature,
        top_k: a.top_k.map(|k| k as usize),
        seed: a.seed,
    };
    let n = a.tokens as usize;
    let mut tokens: Vec<Vec<u32>> = prompts.iter().map(|_| Vec::with_capacity(n)).collect();
    let rows: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let started = std::time::Instant::now();
    generator
        .generate_rows(&rows, n, &sampling, |row, t, _| {
            tokenizer.check_drawn(t, vocab)?;
            tokens[row].push(t);
            Ok(())
        })
        .map_err(|e| Failure::new(1, e))?;
    // The rate on standard error, so the text (and the JSON) stay the same run to run.
    let seconds = started.elapsed().as_secs_f64();
    let drawn: usize = tokens.iter().map(Vec::len).sum();
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let after = match prompts.len() {
        1 => format!("a {prompt_tokens}-token prompt"),
        k => format!("{k} prompts of {prompt_tokens} tokens in all"),
    };
    errln!(
        "generate: {drawn} tokens in {seconds:.3} s ({:.1} tokens/s, after {after})",
        drawn as f64 / seconds.max(1e-9),
    );
    for (i, ((given, encoded), drawn)) in a.prompt.iter().zip(&prompts).zip(&tokens).enumerate() {
        let text = tokenizer
            .decode(drawn)
            .map_err(|e| Failure::new(1, format!("decoding the tokens: {e}")))?;
        if a.json {
            let line = serde_json::json!({
                "prompt": given,
                "prompt_tokens": encoded,
                "text": text,
                "tokens": drawn,
                "cached": generator.is_cached(),
                "planned_bytes": generator.planned_bytes(),
            });
            outln!("{}", json_escaped(&line.to_string()))?;
        } else {
            // Several prompts' texts are told apart by an empty line.
            if i > 0 {
                outln!("")?;
            }
            outln!("{given}{text}")?;
        }
    }
    Ok(())
}

/// The generator of a named model (`--model`, or the model a checkpoint records) with its
/// weights, and the model's name: the decode step of a GPT, else (or with `--whole-window`)
/// the whole window at a batch of one row per prompt.
fn named_generator(
    a: &GenerateArgs,
    weights: Option<&Weights>,
    precision: Option<Precision>,
    device: ingot_trainer::session::Device,
) -> Result<(Generator, String, Precision), Failure> {
    let name = a
        .model
        .clone()
        .or(weights.and_then(|w| w.model.clone()))
        .ok_or_else(|| {
            Failure::new(
                2,
                "--init needs --model NAME (a weights file does not record its model)",
            )
        })?;
    let weights =
        weights.ok_or_else(|| Failure::new(2, "give --checkpoint DIR or --init P.safetensors"))?;
    if !a.input_value.is_empty() {
        return Err(Failure::new(
            2,
            format!("--input-value applies to an ONNX decoder (--onnx MODEL.onnx); {name} reads the token ids alone"),
        ));
    }
    // The decode step is the GPT family's; another language model runs the whole window.
    let cached = !a.whole_window && ingot_models::gpt_decode::gpt_config_of(&name).is_some();
    let batch = if cached { 1 } else { a.prompt.len() };
    let model = ingot_models::at_batch(&name, batch, ingot_compiler::ir::DType::F32)?;
    let precision = precision.unwrap_or(model.precision);
    let mut opts = device.options();
    opts.precision = Some(precision);
    let mut generator = if cached {
        Generator::cached(&model, precision, &opts, device)
    } else {
        Generator::new(&model, precision, &opts, device)
    }
    .map_err(|e| Failure::new(1, e))?;
    weights.load_into(generator.step_mut(), &model.name)?;
    Ok((generator, model.name, precision))
}

/// The whole-window generator of the ONNX decoder at `path`, with the file's weights or, where
/// given, a trained run's (every parameter of the file's among them), and the model's name
/// (its path). A batch axis the file fixes is the step's (prompts fill its first rows); a
/// symbolic one takes one row per prompt.
fn onnx_generator(
    a: &GenerateArgs,
    path: &Path,
    weights: Option<&Weights>,
    precision: Option<Precision>,
    device: ingot_trainer::session::Device,
) -> Result<(Generator, String, Precision), Failure> {
    use ingot_onnx::{import, ImportOptions, Loss, OnnxError};
    let name = path.display().to_string();
    let fail = |e: String| Failure::new(1, format!("{name}: {e}"));
    let options = |batch| ImportOptions {
        loss: Loss::Forward,
        batch,
        dims: a.dims.iter().cloned().collect(),
        fixed_inputs: a.input_value.iter().cloned().collect(),
        ..Default::default()
    };
    // One row per prompt where the batch axis is symbolic; where the file fixes it (the
    // importer says so), the file's batch.
    let imported = match import(path, &options(Some(a.prompt.len()))) {
        Err(OnnxError::FixedBatch { .. }) => import(path, &options(None)),
        other => other,
    }
    .map_err(|e| match e {
        // More inputs than even training feeds: all but the token ids need a value.
        OnnxError::DataInputs { names, .. } => unfed(&name, &names),
        e => fail(e.to_string()),
    })?;
    // The forward pass as evaluation traces it (dropout the identity).
    let (graph, outputs) = if imported.eval_outputs.is_empty() {
        (&imported.model.graph, &imported.outputs)
    } else {
        (imported.model.eval_graph(), &imported.eval_outputs)
    };
    let graph = decoder_logits(graph, outputs, a.logits.as_deref()).map_err(fail)?;
    let fed: Vec<&str> = imported
        .inputs
        .iter()
        .filter(|(_, ours)| graph.leaf(ours).is_some())
        .map(|(theirs, _)| theirs.as_str())
        .collect();
    if fed.len() > 1 {
        let names: Vec<String> = fed.iter().map(|n| n.to_string()).collect();
        return Err(unfed(&name, &names));
    }
    let precision = precision.unwrap_or(imported.model.precision);
    let mut opts = device.options();
    opts.precision = Some(precision);
    let mut generator = Generator::whole_window(&name, &graph, precision, &opts, device)
        .map_err(|e| Failure::new(1, e))?;
    let mut params = IndexMap::new();
    let mut state = IndexMap::new();
    for (n, w) in &imported.weights {
        let t = Tensor::from_le_bytes(w.ty.clone(), &w.bytes).map_err(|e| fail(e.to_string()))?;
        match w.kind {
            LeafKind::Parameter => params.insert(n.clone(), t),
            _ => state.insert(n.clone(), t),
        };
    }
    drop(imported);
    if let Some(w) = weights {
        let missing: Vec<&str> = params
            .keys()
            .filter(|n| !w.parameters.contains_key(*n))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(Failure::new(
                1,
                format!(
                    "{} does not hold the weights of {name}: it lacks {} of its {} parameters, {:?}{} (a run of `ingot train --onnx {name}` saves them)",
                    w.source,
                    missing.len(),
                    params.len(),
                    &missing[..missing.len().min(4)],
                    if missing.len() > 4 { " and more" } else { "" }
                ),
            ));
        }
        params.extend(w.parameters.iter().map(|(k, v)| (k.clone(), v.clone())));
        state.extend(w.state.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let source = weights.map_or_else(|| name.clone(), |w| w.source.clone());
    generator
        .step_mut()
        .load_weights(&params, &state)
        .map_err(|e| Failure::new(1, format!("{source}: the weights of {name}: {e}")))?;
    Ok((generator, name, precision))
}

/// The error of an ONNX decoder whose data inputs besides the token ids (`inputs[0]`, the
/// first, as the importer feeds it) were given no value: it names each and shows the flag
/// with a value that suits its name (a mask of ones, the positions, else 0).
fn unfed(model: &str, inputs: &[String]) -> Failure {
    let (tokens, others) = inputs
        .split_first()
        .map_or(("", inputs), |(t, o)| (t.as_str(), o));
    let suggested: Vec<String> = others
        .iter()
        .map(|n| {
            let value = if n.contains("mask") {
                "1"
            } else if n.contains("position") {
                crate::onnx::POSITIONS
            } else {
                "0"
            };
            format!("--input-value {n}={value}")
        })
        .collect();
    Failure::new(
        2,
        format!(
            "{model}: generation feeds the token ids ({tokens}) alone, but the model also reads {others:?}: hold each at a value, e.g. {} (a number fills the input; {} holds 0, 1, .. along the window)",
            suggested.join(" "),
            crate::onnx::POSITIONS
        ),
    )
}

/// `json` (serde_json's text) with DEL and the C1 controls written as JSON escapes
/// (`\u007f`): serde_json escapes only the C0 controls, and standard output writes every
/// control a terminal may act on in Rust's escaped form ([`crate::output::printable`]), `\u{7f}`,
/// which is not JSON. Generated text holds any byte a model draws, so a line of
/// `generate --json` held such escapes and did not parse. The value is the same; the line
/// passes through standard output unchanged.
fn json_escaped(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_control() && c as u32 >= 0x7f {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `NAME=SIZE` of `--dim`: an axis name and a positive size.
fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (name, size) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=SIZE"))?;
    match size.trim().parse::<usize>() {
        Ok(n) if n > 0 && !name.is_empty() => Ok((name.to_string(), n)),
        _ => Err(format!("{s:?} needs an axis name and a positive size")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_text_with_del_and_c1_controls_prints_as_json_that_parses_back() {
        let text = "a\u{7f}b\u{85}c\u{9f}\u{1b}d\u{a0}é";
        let line = serde_json::json!({ "text": text }).to_string();
        let escaped = super::json_escaped(&line);
        assert_eq!(
            escaped,
            "{\"text\":\"a\\u007fb\\u0085c\\u009f\\u001bd\u{a0}é\"}"
        );
        // Unchanged by standard output's escaping, and the same value when parsed.
        assert_eq!(crate::output::printable(&escaped), escaped.as_str());
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back["text"], text);
        // What standard output made of serde_json's own line: not JSON.
        assert!(
            serde_json::from_str::<serde_json::Value>(&crate::output::printable(&line)).is_err()
        );
    }
}
