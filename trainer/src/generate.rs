//! Text generation from a trained language model (the GPT family): a forward-only step over
//! the model's whole context window ([`crate::infer::Inference`] of the model's graph reduced
//! to its logits, [`ingot_compiler::trace::logits::logits_only`]), planned before the first
//! token, run once per token; the logits at the last filled position are sampled, and when
//! the window is full it slides by one token (nanoGPT's `idx[:, -block_size:]`).
//!
//! Why the whole window each token rather than a KV cache: a cache needs the step to write one
//! position of a resident buffer chosen at run time (a dynamic update slice) and attention to
//! read a growing prefix, which the IR does not express yet. The whole window costs `seq` times
//! the FLOPs of one cached position, but it is exact (causal attention makes the padding past
//! the last filled position invisible to it), and it keeps the plan's promise: one allocation,
//! nothing allocated per token.
//!
//! Tokens come from a [`Tokenizer`]: the byte-level one ([`Tokenizer::Bytes`], the tokens
//! `ingot data bytes` writes) is the only one now; others plug in as variants.

use crate::infer::Inference;
use crate::session::Device;
use ingot_compiler::ir::{DType, LeafKind};
use ingot_compiler::models::Model;
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

/// A language model's generation step, loaded, with the buffers each token reuses.
pub struct Generator {
    step: Inference,
    seq: usize,
    vocab: usize,
    /// The window's ids as the input `x` holds them (`[1, seq]`, little-endian).
    window: Vec<u8>,
    id_dtype: DType,
    logits: Vec<f32>,
    /// Token ids ordered for top-k (allocated once).
    order: Vec<u32>,
}

impl Generator {
    /// Compiles and loads the generation step of `model` (a language model at batch 1: input
    /// `x` of `[1, seq]` ids, a softmax cross-entropy over `[seq, vocab]` logits) on `device`.
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
        Ok(Generator {
            step,
            seq,
            vocab,
            window: vec![0; seq * id_dtype.size()],
            id_dtype,
            logits: vec![0.0; vocab],
            order: (0..vocab as u32).collect(),
        })
    }

    /// The loaded step (to load weights into, or to read its plan).
    pub fn step_mut(&mut self) -> &mut Inference {
        &mut self.step
    }

    /// The loaded step.
    pub fn step(&self) -> &Inference {
        &self.step
    }

    /// The model's context window and vocabulary.
    pub fn window_and_vocab(&self) -> (usize, usize) {
        (self.seq, self.vocab)
    }

    /// Generates `n` tokens after `prompt`, handing each to `emit` as it is drawn. The step
    /// runs once per token on the last `seq` tokens so far; nothing is allocated per token
    /// here (the caller's `emit` decides what it keeps). An empty prompt, or a token outside
    /// the vocabulary, is an error naming it.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(u32) -> Result<(), String>,
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
        // The window: the prompt's last `seq` tokens, then each drawn token.
        let start = prompt.len().saturating_sub(self.seq);
        let mut filled = 0;
        for &t in &prompt[start..] {
            self.put(filled, t);
            filled += 1;
        }
        for _ in 0..n {
            self.step.run(&self.window, None)?;
            self.step.logits_row(filled - 1, &mut self.logits)?;
            let token = self.draw(sampling, &mut rng);
            emit(token)?;
            if filled == self.seq {
                // Slide by one token: drop the oldest id.
                let size = self.id_dtype.size();
                self.window.copy_within(size.., 0);
                filled -= 1;
            }
            self.put(filled, token);
            filled += 1;
        }
        Ok(())
    }

    /// Writes token `t` at position `i` of the window, in the input's id type.
    fn put(&mut self, i: usize, t: u32) {
        let size = self.id_dtype.size();
        let at = &mut self.window[i * size..(i + 1) * size];
        match self.id_dtype {
            DType::I32 => at.copy_from_slice(&(t as i32).to_le_bytes()),
            _ => at.copy_from_slice(&(t as i64).to_le_bytes()[..size]),
        }
    }

    /// The next token from `self.logits` as `sampling` says.
    fn draw(&mut self, sampling: &Sampling, rng: &mut ChaCha8Rng) -> u32 {
        sample(&self.logits, &mut self.order, sampling, rng)
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
