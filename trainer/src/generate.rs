//! Text generation from a trained language model (the GPT family), by one of two steps, each
//! planned before the first token (its peak known, [`Generator::planned_bytes`]) and run once
//! per token with nothing allocated:
//! - [`Generator::cached`] (the default of `ingot generate`): the model's decode step
//!   ([`ingot_compiler::models::gpt_decode`]), one token at a time against a KV cache that is
//!   resident state of the step, `O(seq · d)` per layer and token;
//! - [`Generator::new`], the reference: a forward-only step over the model's whole context window
//!   ([`crate::infer::Inference`] of the model's graph reduced to its logits,
//!   [`ingot_compiler::trace::logits::logits_only`]), whose logits at the last filled position
//!   are sampled (causal attention makes the padding past it invisible), `seq` times the FLOPs.
//!
//! Both see the same context, so greedy decoding gives the same tokens by either: the prompt's
//! last `seq` tokens, then each drawn token; when the window is full, the context keeps its last
//! `seq / 2` tokens (llama.cpp's context shift). The learned position embeddings tie a cached key
//! to its position, so a slide by one token would have to recompute the whole cache each token;
//! halving recomputes it once per `seq / 2` tokens (the cached step refills its cache by feeding
//! the kept tokens from position 0), about one more decode step per generated token.
//! The prompt goes through the decode step token by token too (the decode step is the one step
//! planned; a prompt is at most `seq` tokens of `O(seq · d)` each).
//!
//! Tokens come from a [`Tokenizer`]: the byte-level one ([`Tokenizer::Bytes`], the tokens
//! `ingot data bytes` writes) is the only one now; others plug in as variants.

use crate::infer::Inference;
use crate::session::Device;
use ingot_compiler::ir::{DType, LeafKind, NodeId};
use ingot_compiler::models::gpt_decode::{self, gpt_config_of};
use ingot_compiler::models::{GptConfig, Model};
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How text becomes token ids and back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokenizer {
    /// Each byte of the UTF-8 text is one token (0..256), as `ingot data bytes` writes them.
    Bytes,
}

impl Tokenizer {
    /// The token ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Bytes => text.bytes().map(u32::from).collect(),
        }
    }

    /// The text of `tokens`; bytes that are not valid UTF-8 (a character cut by the sampler,
    /// or ids above 255) become U+FFFD.
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Tokenizer::Bytes => {
                let bytes: Vec<u8> = tokens
                    .iter()
                    .map(|&t| u8::try_from(t).unwrap_or(0xFF))
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }
}

/// How the next token is drawn from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// The logits are divided by it before the softmax; 0 takes the most likely token
    /// (greedy, the first of equal ones).
    pub temperature: f64,
    /// Draw only among the `k` most likely tokens; `None` for all of them.
    pub top_k: Option<usize>,
    /// The seed of the draws: the same seed, model and prompt give the same tokens.
    pub seed: u64,
}

/// How the loaded step sees the context.
enum Engine {
    /// The whole window each token: the window's ids as the input `x` holds them
    /// (`[1, seq]`, little-endian).
    Window { window: Vec<u8> },
    /// The decode step: its token and position inputs, and how many tokens of the context
    /// its KV cache holds (the first `fed`).
    Cached {
        token: NodeId,
        position: NodeId,
        fed: usize,
    },
}

/// A language model's generation step, loaded, with the buffers each token reuses.
pub struct Generator {
    step: Inference,
    engine: Engine,
    seq: usize,
    vocab: usize,
    id_dtype: DType,
    /// The tokens the model sees (at most `seq`; allocated once).
    context: Vec<u32>,
    logits: Vec<f32>,
    /// Token ids ordered for top-k (allocated once).
    order: Vec<u32>,
}

impl Generator {
    /// Compiles and loads the whole-window generation step of `model` (a language model at
    /// batch 1: input `x` of `[1, seq]` ids, a softmax cross-entropy over `[seq, vocab]`
    /// logits) on `device`: the reference [`Generator::cached`] is checked against, and the
    /// step for language models that are not of the GPT family.
    pub fn new(
        model: &Model,
        precision: Precision,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Generator, String> {
        let graph = ingot_compiler::trace::logits::logits_only(&model.graph)
            .map_err(|e| format!("{}: {e}", model.name))?;
        let x = graph
            .leaf("x")
            .filter(|id| graph.leaves(LeafKind::Input).contains(id))
            .ok_or_else(|| format!("{}: the model has no input x of token ids", model.name))?;
        let xty = graph.ty(x).clone();
        let (seq, id_dtype) = match xty.shape.dims() {
            [1, seq] if !xty.dtype.is_float() => (*seq, xty.dtype),
            _ => {
                return Err(format!(
                    "{}: generation takes a language model at batch 1 whose input x is [1, seq] token ids, not {xty}",
                    model.name
                ))
            }
        };
        let step = Inference::new(&model.name, &graph, precision, opts, device)?;
        let (rows, vocab) = step
            .logits_shape()
            .ok_or_else(|| format!("{}: the generation step has no logits", model.name))?;
        if rows != seq {
            return Err(format!(
                "{}: the logits have {rows} rows, not one per position of the {seq}-token window",
                model.name
            ));
        }
        let window = vec![0; seq * id_dtype.size()];
        Ok(Generator::with(
            step,
            Engine::Window { window },
            seq,
            vocab,
            id_dtype,
        ))
    }

    /// Compiles and loads the decode step of `model`, a GPT (its name a `gpt:` spec or one of
    /// the named GPTs; its batch is ignored: one sequence), with its KV cache (bf16 under
    /// [`Precision::Bf16`], else f32) in the step's one allocation, on `device`. A model that
    /// is not a GPT is an error saying so.
    pub fn cached(
        model: &Model,
        precision: Precision,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Generator, String> {
        let cfg = gpt_config_of(&model.name).ok_or_else(|| {
            format!(
                "{}: the cached decode step is built for the GPT family only; this model needs the whole-window step",
                model.name
            )
        })?;
        let cfg = GptConfig { batch: 1, ..cfg };
        let cache = match precision {
            Precision::Bf16 => DType::BF16,
            _ => DType::F32,
        };
        let name = format!("{} (decode)", model.name);
        let graph =
            gpt_decode::gpt_decode(&cfg, DType::F32, cache).map_err(|e| format!("{name}: {e}"))?;
        // The attention recognizer knows the whole window's causal attention, not one query
        // over a masked cache: the decode step's attention stays plain math.
        let opts = pipeline::Options {
            fuse_attention: false,
            ..opts.clone()
        };
        let step = Inference::new(&name, &graph, precision, &opts, device)?;
        let slot = |input: &str| {
            step.input(input)
                .map(|(id, _)| id)
                .ok_or_else(|| format!("{name} has no input {input}"))
        };
        let (token, position) = (slot(gpt_decode::TOKEN)?, slot(gpt_decode::POSITION)?);
        let id_dtype = step.graph().ty(token).dtype;
        let engine = Engine::Cached {
            token,
            position,
            fed: 0,
        };
        Ok(Generator::with(step, engine, cfg.seq, cfg.vocab, id_dtype))
    }

    fn with(step: Inference, engine: Engine, seq: usize, vocab: usize, id_dtype: DType) -> Self {
        Generator {
            step,
            engine,
            seq,
            vocab,
            id_dtype,
            context: Vec::with_capacity(seq),
            logits: vec![0.0; vocab],
            order: (0..vocab as u32).collect(),
        }
    }

    /// The loaded step (to load weights into, or to read its plan).
    pub fn step_mut(&mut self) -> &mut Inference {
        &mut self.step
    }

    /// The loaded step.
    pub fn step(&self) -> &Inference {
        &self.step
    }

    /// Whether this is the cached decode step (else the whole window's).
    pub fn is_cached(&self) -> bool {
        matches!(self.engine, Engine::Cached { .. })
    }

    /// The bytes of the step's one allocation (weights, KV cache, activations): the peak,
    /// known before the first token.
    pub fn planned_bytes(&self) -> usize {
        self.step.planned_bytes()
    }

    /// The bytes of the KV cache within [`Generator::planned_bytes`] (0 for the whole window).
    pub fn cache_bytes(&self) -> usize {
        self.step.state_bytes(gpt_decode::is_cache)
    }

    /// The model's context window and vocabulary.
    pub fn window_and_vocab(&self) -> (usize, usize) {
        (self.seq, self.vocab)
    }

    /// Generates `n` tokens after `prompt`, handing each to `emit` as it is drawn
    /// ([`Generator::generate_observed`] without the logits).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(u32) -> Result<(), String>,
    ) -> Result<(), String> {
        self.generate_observed(prompt, n, sampling, |t, _| emit(t))
    }

    /// Generates `n` tokens after `prompt`, handing each to `emit` as it is drawn, with the
    /// logits it was drawn from. The step runs once per token (the cached step also once per
    /// prompt token, and per kept token after a slide); nothing is allocated per token here
    /// (the caller's `emit` decides what it keeps). An empty prompt, or a token outside the
    /// vocabulary, is an error naming it.
    pub fn generate_observed(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(u32, &[f32]) -> Result<(), String>,
    ) -> Result<(), String> {
        if prompt.is_empty() {
            return Err("the prompt holds no token: give at least one character".into());
        }
        if let Some(i) = prompt.iter().position(|&t| t as usize >= self.vocab) {
            return Err(format!(
                "prompt token {i} is {}, outside the model's vocabulary of {}",
                prompt[i], self.vocab
            ));
        }
        if sampling.top_k == Some(0) || sampling.temperature.is_nan() || sampling.temperature < 0.0
        {
            return Err("top-k must be at least 1 and the temperature 0 or more".into());
        }
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        // The context: the prompt's last `seq` tokens, then each drawn token.
        let start = prompt.len().saturating_sub(self.seq);
        self.context.clear();
        self.context.extend_from_slice(&prompt[start..]);
        self.forget_cache();
        for _ in 0..n {
            self.forward()?;
            let token = sample(&self.logits, &mut self.order, sampling, &mut rng);
            emit(token, &self.logits)?;
            if self.context.len() == self.seq {
                // Keep the last half; the cache holds positions no longer theirs.
                let keep = self.seq / 2;
                self.context.copy_within(self.seq - keep.., 0);
                self.context.truncate(keep);
                self.forget_cache();
            }
            self.context.push(token);
        }
        Ok(())
    }

    /// Marks the KV cache as holding none of the context.
    fn forget_cache(&mut self) {
        if let Engine::Cached { fed, .. } = &mut self.engine {
            *fed = 0;
        }
    }

    /// Runs the step on the context and reads the next token's logits into `self.logits`.
    fn forward(&mut self) -> Result<(), String> {
        let size = self.id_dtype.size();
        let last = self.context.len() - 1;
        match &mut self.engine {
            Engine::Window { window } => {
                for (i, &t) in self.context.iter().enumerate() {
                    put(&mut window[i * size..(i + 1) * size], self.id_dtype, t);
                }
                self.step.run(window, None)?;
                self.step.logits_row(last, &mut self.logits)
            }
            Engine::Cached {
                token,
                position,
                fed,
            } => {
                let (mut t, mut p) = ([0u8; 8], [0u8; 8]);
                while *fed < self.context.len() {
                    put(&mut t[..size], self.id_dtype, self.context[*fed]);
                    put(&mut p[..size], self.id_dtype, *fed as u32);
                    self.step
                        .run_inputs(&[(*token, &t[..size]), (*position, &p[..size])])?;
                    *fed += 1;
                }
                self.step.logits_row(0, &mut self.logits)
            }
        }
    }
}

/// Writes id `t` into `at` in the id type `dtype` (i32, else i64 cut to `at`'s length).
fn put(at: &mut [u8], dtype: DType, t: u32) {
    match dtype {
        DType::I32 => at.copy_from_slice(&(t as i32).to_le_bytes()),
        _ => at.copy_from_slice(&(t as i64).to_le_bytes()[..at.len()]),
    }
}

/// The index `logits` give by `sampling`: the first largest at temperature 0; else a draw from
/// the softmax of `logits / temperature` over the `top_k` largest (ties at the k-th kept in
/// id order), computed in f64. `order` is a scratch permutation of `0..logits.len()`. Allocates
/// nothing.
pub fn sample(logits: &[f32], order: &mut [u32], sampling: &Sampling, rng: &mut ChaCha8Rng) -> u32 {
    let argmax = || {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    };
    if sampling.temperature == 0.0 {
        return argmax();
    }
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    // Most likely first, equal logits in id order: a total order, so the draw is reproducible.
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = sampling.top_k.unwrap_or(order.len()).min(order.len());
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logit);
    }
    let kept = &mut order[..k];
    kept.sort_unstable_by(by_logit);
    let top = logits[kept[0] as usize] as f64;
    let weight = |id: u32| ((logits[id as usize] as f64 - top) / sampling.temperature).exp();
    let total: f64 = kept.iter().map(|&id| weight(id)).sum();
    // A uniform draw in [0, 1) from the top 53 bits.
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut acc = 0.0;
    for &id in kept.iter() {
        acc += weight(id);
        if u < acc {
            return id;
        }
    }
    kept[k - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng() -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(7)
    }

    #[test]
    fn temperature_zero_takes_the_first_largest_logit() {
        let s = Sampling {
            temperature: 0.0,
            top_k: None,
            seed: 0,
        };
        let mut order = vec![0; 4];
        assert_eq!(
            sample(&[0.1, 3.0, -1.0, 3.0], &mut order, &s, &mut rng()),
            1
        );
    }

    #[test]
    fn top_one_is_greedy_at_any_temperature() {
        let s = Sampling {
            temperature: 5.0,
            top_k: Some(1),
            seed: 0,
        };
        let mut order = vec![0; 5];
        let mut r = rng();
        for _ in 0..50 {
            assert_eq!(
                sample(&[0.0, 1.0, 2.5, 2.0, -3.0], &mut order, &s, &mut r),
                2
            );
        }
    }

    #[test]
    fn draws_follow_the_softmax_and_stay_within_top_k() {
        // logits ln 1, ln 2, ln 3, ln 100 at temperature 1, top-3: ids 3, 2, 1 with
        // probabilities 100/105, 3/105, 2/105; id 0 never.
        let logits = [0.0f32, 2f32.ln(), 3f32.ln(), 100f32.ln()];
        let s = Sampling {
            temperature: 1.0,
            top_k: Some(3),
            seed: 0,
        };
        let mut order = vec![0; 4];
        let mut r = rng();
        let mut counts = [0usize; 4];
        let n = 20_000;
        for _ in 0..n {
            counts[sample(&logits, &mut order, &s, &mut r) as usize] += 1;
        }
        assert_eq!(counts[0], 0);
        let p = |i: usize| counts[i] as f64 / n as f64;
        assert!((p(3) - 100.0 / 105.0).abs() < 0.01, "{counts:?}");
        assert!((p(2) - 3.0 / 105.0).abs() < 0.006, "{counts:?}");
    }

    #[test]
    fn bytes_round_trip_through_the_byte_tokenizer() {
        let t = Tokenizer::Bytes;
        let ids = t.encode("héllo\n");
        assert_eq!(ids.len(), 7);
        assert_eq!(t.decode(&ids), "héllo\n");
    }
}
