//! `ingot generate`: text from a trained language model of the GPT family
//! ([`ingot_trainer::generate::Generator`]): the prompt's tokens, then `--tokens N` more drawn
//! one at a time by the model's decode step with its KV cache (or, with `--whole-window`, the
//! forward step over the whole context window, the reference), planned before the first token;
//! the planned bytes are printed on standard error before it.

use super::eval::{DeviceArgs, WeightsArgs};
use super::Failure;
use ingot_trainer::generate::{Generator, Sampling, Tokenizer};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The model (gpt-mini, gpt2, gpt:vocab=..,..); default: the one the --checkpoint's run
    /// trained. Its batch is ignored: generation runs one sequence.
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub weights: WeightsArgs,
    /// The text the generated tokens continue (byte-level tokens: each byte one token).
    #[arg(long, allow_hyphen_values = true)]
    pub prompt: String,
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
    pub precision: super::PrecisionArgs,
    /// Run the forward step over the whole context window for each token instead of the
    /// decode step with its KV cache: the reference the cached step is checked against
    /// (the same context, so the same greedy tokens), `seq` times the work per token.
    #[arg(long = "whole-window")]
    pub whole_window: bool,
    /// Print one JSON object ({"prompt", "text", "tokens"}) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &GenerateArgs) -> Result<(), Failure> {
    if a.model.is_none() && a.weights.checkpoint.is_none() {
        return Err(Failure::new(
            2,
            "--init needs --model NAME (a checkpoint records its model; a weights file does not)",
        ));
    }
    let device = a.device.session_device()?;
    let weights = a.weights.read()?;
    let name = a.model.clone().or(weights.model.clone()).ok_or_else(|| {
        Failure::new(
            2,
            "--init needs --model NAME (a weights file does not record its model)",
        )
    })?;
    let model = ingot_compiler::models::at_batch(&name, 1, ingot_compiler::ir::DType::F32)?;
    let precision = a
        .precision
        .for_device(a.device.device)?
        .unwrap_or(model.precision);
    let mut opts = device.options();
    opts.precision = Some(precision);
    // The decode step is the GPT family's; another language model runs the whole window.
    let cached =
        !a.whole_window && ingot_compiler::models::gpt_decode::gpt_config_of(&model.name).is_some();
    let mut generator = if cached {
        Generator::cached(&model, precision, &opts, device)
    } else {
        Generator::new(&model, precision, &opts, device)
    }
    .map_err(|e| Failure::new(1, e))?;
    weights.load_into(generator.step_mut(), &model.name)?;
    // The peak, before the first token.
    let human = ingot_compiler::report::human;
    if generator.is_cached() {
        crate::errln!(
            "generate: the decode step of {} planned in one allocation of {} (KV cache {}), in {precision}",
            model.name,
            human(generator.planned_bytes()),
            human(generator.cache_bytes())
        );
    } else {
        crate::errln!(
            "generate: the whole-window step of {} planned in one allocation of {}, in {precision}",
            model.name,
            human(generator.planned_bytes())
        );
    }
    let tokenizer = Tokenizer::Bytes;
    let prompt = tokenizer.encode(&a.prompt);
    let sampling = Sampling {
        temperature: a.temperature,
        top_k: a.top_k.map(|k| k as usize),
        seed: a.seed,
    };
    let mut tokens = Vec::with_capacity(a.tokens as usize);
    let started = std::time::Instant::now();
    generator
        .generate(&prompt, a.tokens as usize, &sampling, |t| {
            tokens.push(t);
            Ok(())
        })
        .map_err(|e| Failure::new(1, e))?;
    // The rate on standard error, so the text (and the JSON) stay the same run to run.
    let seconds = started.elapsed().as_secs_f64();
    crate::errln!(
        "generate: {} tokens in {seconds:.3} s ({:.1} tokens/s, after a {}-token prompt)",
        tokens.len(),
        tokens.len() as f64 / seconds.max(1e-9),
        prompt.len()
    );
    let text = tokenizer.decode(&tokens);
    if a.json {
        let line = serde_json::json!({
            "prompt": a.prompt,
            "text": text,
            "tokens": tokens,
            "cached": generator.is_cached(),
            "planned_bytes": generator.planned_bytes(),
        });
        return crate::outln!("{line}");
    }
    crate::outln!("{}{text}", a.prompt)
}
