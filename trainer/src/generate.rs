//! Text generation from a trained language model (the GPT family), by one of two steps, each
//! planned before the first token (its peak known, [`Generator::planned_bytes`]) and run once
//! per token with nothing allocated:
//! - [`Generator::cached`] (the default of `ingot generate`): the model's decode step
//!   ([`ingot_models::gpt_decode`]), one token at a time against a KV cache that is
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
//! The whole-window step also serves models that are not Ingot's GPT: any causal forward graph
//! from token ids `[batch, seq]` to logits, such as a decoder imported from ONNX
//! ([`Generator::whole_window`] of the graph [`decoder_logits`] reduces to its logits). Its
//! batch advances several prompts at once ([`Generator::generate_rows`]), each with its own
//! context and its own draws, so each gets the tokens it gets alone.
//!
//! Tokens come from a [`Tokenizer`]: the byte-level one ([`Tokenizer::Bytes`], the tokens
//! `ingot data bytes` writes, the default), or a Hugging Face `tokenizer.json`
//! ([`Tokenizer::File`], the one `ingot data tokenize --tokenizer` encoded the training data
//! with).

use crate::data::tokenizer::TextTokenizer;
use crate::infer::Inference;
use crate::session::Device;
use indexmap::IndexMap;
use ingot_compiler::ir::{DType, Graph, LeafKind, NodeId};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_compiler::trace::logits::LOGITS;
use ingot_models::gpt_decode::{self, gpt_config_of};
use ingot_models::GptConfig;
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How text becomes token ids and back.
#[derive(Debug)]
pub enum Tokenizer {
    /// Each byte of the UTF-8 text is one token (0..256), as `ingot data bytes` writes them.
    Bytes,
    /// A Hugging Face `tokenizer.json` (GPT-2's byte-level BPE, or any the `tokenizers` crate
    /// reads): the same encoding `ingot data tokenize --tokenizer` gives the training data.
    File(Box<TextTokenizer>),
}

impl Tokenizer {
    /// The number of ids the tokenizer knows (256 bytes, or the file's vocabulary with its
    /// added tokens).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::File(t) => t.vocab_size(),
        }
    }

    /// Checks that the tokenizer can serve a model of `model_vocab` tokens: a file's
    /// vocabulary larger than the model's is an error naming both sizes (its ids would reach
    /// past the model's embedding table). A smaller one is fine: a model's vocabulary is often
    /// padded (nanoGPT's 50304 for GPT-2's 50257), and an id drawn beyond the tokenizer's is
    /// caught as it is drawn ([`Tokenizer::check_drawn`]). The byte tokenizer is checked per
    /// prompt byte instead, as it always was (a model of fewer than 256 tokens reads the
    /// bytes below its vocabulary).
    pub fn check_model_vocab(&self, model_vocab: usize) -> Result<(), String> {
        match self {
            Tokenizer::File(t) if t.vocab_size() > model_vocab => Err(format!(
                "{} has a vocabulary of {} tokens, larger than the model's {model_vocab}: the model was not trained on this tokenizer's ids",
                t.path().display(),
                t.vocab_size()
            )),
            _ => Ok(()),
        }
    }

    /// Checks a token the model drew: an id at or beyond a file's vocabulary (a model whose
    /// vocabulary is larger than the tokenizer's) is an error naming both sizes, raised as it
    /// is drawn rather than after the whole text. Byte ids above 255 decode as U+FFFD.
    pub fn check_drawn(&self, token: u32, model_vocab: usize) -> Result<(), String> {
        match self {
            Tokenizer::File(t) if token as usize >= t.vocab_size() => Err(format!(
                "the model drew token {token}, at or beyond the vocabulary of {} tokens of {} (the model's vocabulary is {model_vocab}): decode with the tokenizer the model was trained with",
                t.vocab_size(),
                t.path().display()
            )),
            _ => Ok(()),
        }
    }

    /// The token ids of `text`; a file's encoding error names the file.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::File(t) => t.encode(text).map_err(|e| e.to_string()),
        }
    }

    /// The text of `tokens`. Bytes that are not valid UTF-8 (a character cut by the sampler,
    /// or ids above 255) become U+FFFD; a file's id outside its vocabulary is an error naming
    /// it.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, String> {
        match self {
            Tokenizer::Bytes => {
                let bytes: Vec<u8> = tokens
                    .iter()
                    .map(|&t| u8::try_from(t).unwrap_or(0xFF))
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Tokenizer::File(t) => t.decode(tokens).map_err(|e| e.to_string()),
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
    /// The whole window each token, for each row of the step's batch: the rows' windows' ids
    /// as the input `x` holds them (`[rows, seq]`, little-endian).
    Window { window: Vec<u8> },
    /// The decode step (one row): its token and position inputs, and how many tokens of the
    /// context its KV cache holds (the first `fed`).
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
    /// The sequences one run of the step advances: the whole window's batch, 1 for the
    /// decode step.
    rows: usize,
    seq: usize,
    vocab: usize,
    id_dtype: DType,
    /// The tokens each row's model sees (at most `seq` each; allocated once).
    contexts: Vec<Vec<u32>>,
    logits: Vec<f32>,
    /// Token ids ordered for top-k (allocated once).
    order: Vec<u32>,
}

impl Generator {
    /// Compiles and loads the whole-window generation step of `model` (a language model: input
    /// `x` of `[batch, seq]` ids, a softmax cross-entropy over `[batch · seq, vocab]` logits) on
    /// `device`: the reference [`Generator::cached`] is checked against, and the step for
    /// language models that are not of the GPT family. Its batch is the number of sequences
    /// one run advances ([`Generator::generate_rows`]).
    pub fn new(
        model: &Model,
        precision: Precision,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Generator, String> {
        let graph = ingot_compiler::trace::logits::logits_only(&model.graph)
            .map_err(|e| format!("{}: {e}", model.name))?;
        Generator::whole_window(&model.name, &graph, precision, opts, device)
    }

    /// The whole-window generation step of `graph`, a forward pass whose only data input is
    /// `x`, `[batch, seq]` token ids, and whose output [`LOGITS`] holds one row of logits per
    /// position, `[batch, seq, vocab]` or `[batch · seq, vocab]` (what [`decoder_logits`] or
    /// [`ingot_compiler::trace::logits::logits_only`] make); `name` names the model in errors.
    /// The model must be causal (a decoder: position `p`'s logits read no later position), as
    /// the positions past a row's context hold stale ids.
    pub fn whole_window(
        name: &str,
        graph: &Graph,
        precision: Precision,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Generator, String> {
        let inputs: Vec<&str> = graph
            .leaves(LeafKind::Input)
            .into_iter()
            .filter_map(|id| graph.leaf_name(id))
            .collect();
        if inputs != ["x"] {
            return Err(format!(
                "{name}: generation feeds one input x of token ids; the model reads {inputs:?}"
            ));
        }
        let x = graph.leaf("x").expect("listed");
        let xty = graph.ty(x).clone();
        let (rows, seq, id_dtype) = match xty.shape.dims() {
            [rows, seq] if !xty.dtype.is_float() => (*rows, *seq, xty.dtype),
            _ => {
                return Err(format!(
                    "{name}: generation takes a language model whose input x is [batch, seq] token ids, not {xty}"
                ))
            }
        };
        let step = Inference::new(name, graph, precision, opts, device)?;
        let (logit_rows, vocab) = step
            .logits_shape()
            .ok_or_else(|| format!("{name}: the generation step has no logits"))?;
        if logit_rows != rows * seq {
            return Err(format!(
                "{name}: the logits have {logit_rows} rows, not one per position of the {rows} × {seq}-token windows"
            ));
        }
        let window = vec![0; rows * seq * id_dtype.size()];
        Ok(Generator::with(
            step,
            Engine::Window { window },
            rows,
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
        Ok(Generator::with(
            step, engine, 1, cfg.seq, cfg.vocab, id_dtype,
        ))
    }

    fn with(
        step: Inference,
        engine: Engine,
        rows: usize,
        seq: usize,
        vocab: usize,
        id_dtype: DType,
    ) -> Self {
        Generator {
            step,
            engine,
            rows,
            seq,
            vocab,
            id_dtype,
            contexts: (0..rows).map(|_| Vec::with_capacity(seq)).collect(),
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

    /// The sequences one run of the step advances (the whole window's batch; 1 for the
    /// decode step, which [`Generator::generate_rows`] runs once per prompt).
    pub fn rows(&self) -> usize {
        self.rows
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
    /// logits it was drawn from ([`Generator::generate_rows`] of one prompt).
    pub fn generate_observed(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(u32, &[f32]) -> Result<(), String>,
    ) -> Result<(), String> {
        self.generate_rows(&[prompt], n, sampling, |_, t, l| emit(t, l))
    }

    /// Generates `n` tokens after each of `prompts`, handing each to `emit` as it is drawn
    /// with its prompt's index and the logits it was drawn from. Each prompt's tokens are the
    /// ones it gets alone: its own context and its own draws from `sampling.seed`. The whole
    /// window runs the prompts as rows of its batch, one run per token for all of them (rows
    /// past the last prompt repeat it, their draws unused); the decode step, one sequence,
    /// runs them one after another. The step runs once per token (the cached step also once
    /// per prompt token, and per kept token after a slide); nothing is allocated per token
    /// here (the caller's `emit` decides what it keeps). An empty prompt, a token outside the
    /// vocabulary, or more prompts than the whole window's batch is an error naming it.
    pub fn generate_rows(
        &mut self,
        prompts: &[&[u32]],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(usize, u32, &[f32]) -> Result<(), String>,
    ) -> Result<(), String> {
        let which = |i: usize| {
            if prompts.len() > 1 {
                format!("prompt {i}")
            } else {
                "the prompt".to_string()
            }
        };
        for (i, prompt) in prompts.iter().enumerate() {
            if prompt.is_empty() {
                return Err(format!(
                    "{} holds no token: give at least one character",
                    which(i)
                ));
            }
            if let Some(j) = prompt.iter().position(|&t| t as usize >= self.vocab) {
                return Err(format!(
                    "{} token {j} is {}, outside the model's vocabulary of {}",
                    which(i),
                    prompt[j],
                    self.vocab
                ));
            }
        }
        if sampling.top_k == Some(0) || sampling.temperature.is_nan() || sampling.temperature < 0.0
        {
            return Err("top-k must be at least 1 and the temperature 0 or more".into());
        }
        if prompts.is_empty() {
            return Ok(());
        }
        if self.is_cached() {
            for (i, prompt) in prompts.iter().enumerate() {
                self.generate_one(prompt, n, sampling, |t, l| emit(i, t, l))?;
            }
            return Ok(());
        }
        if prompts.len() > self.rows {
            return Err(format!(
                "{} prompts, but the whole-window step runs a batch of {}: give at most {} prompts at once",
                prompts.len(),
                self.rows,
                self.rows,
            ));
        }
        self.generate_batch(prompts, n, sampling, emit)
    }

    /// [`Generator::generate_rows`] of one prompt by the decode step.
    fn generate_one(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(u32, &[f32]) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        start_context(&mut self.contexts[0], prompt, self.seq);
        self.forget_cache();
        for _ in 0..n {
            self.forward_cached()?;
            let token = sample(&self.logits, &mut self.order, sampling, &mut rng);
            emit(token, &self.logits)?;
            if push_token(&mut self.contexts[0], token, self.seq) {
                self.forget_cache();
            }
        }
        Ok(())
    }

    /// [`Generator::generate_rows`] of the whole window: every row advanced by one run per
    /// token.
    fn generate_batch(
        &mut self,
        prompts: &[&[u32]],
        n: usize,
        sampling: &Sampling,
        mut emit: impl FnMut(usize, u32, &[f32]) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut rngs: Vec<ChaCha8Rng> = prompts
            .iter()
            .map(|_| ChaCha8Rng::seed_from_u64(sampling.seed))
            .collect();
        for (r, context) in self.contexts.iter_mut().enumerate() {
            start_context(context, prompts[r.min(prompts.len() - 1)], self.seq);
        }
        let Engine::Window { window } = &mut self.engine else {
            return Err("the decode step runs one prompt at a time".into());
        };
        let size = self.id_dtype.size();
        for _ in 0..n {
            for (r, context) in self.contexts.iter().enumerate() {
                let row = &mut window[r * self.seq * size..(r + 1) * self.seq * size];
                for (i, &t) in context.iter().enumerate() {
                    put(&mut row[i * size..(i + 1) * size], self.id_dtype, t);
                }
            }
            self.step.run(window, None)?;
            for (r, rng) in rngs.iter_mut().enumerate() {
                let last = r * self.seq + self.contexts[r].len() - 1;
                self.step.logits_row(last, &mut self.logits)?;
                let token = sample(&self.logits, &mut self.order, sampling, rng);
                emit(r, token, &self.logits)?;
                push_token(&mut self.contexts[r], token, self.seq);
            }
        }
        Ok(())
    }

    /// Marks the KV cache as holding none of the context.
    fn forget_cache(&mut self) {
        if let Engine::Cached { fed, .. } = &mut self.engine {
            *fed = 0;
        }
    }

    /// Feeds the decode step the context's tokens its KV cache does not hold yet and reads
    /// the next token's logits into `self.logits`.
    fn forward_cached(&mut self) -> Result<(), String> {
        let size = self.id_dtype.size();
        let context = &self.contexts[0];
        let Engine::Cached {
            token,
            position,
            fed,
        } = &mut self.engine
        else {
            return Err("the whole-window step runs its rows together".into());
        };
        let (mut t, mut p) = ([0u8; 8], [0u8; 8]);
        while *fed < context.len() {
            put(&mut t[..size], self.id_dtype, context[*fed]);
            put(&mut p[..size], self.id_dtype, *fed as u32);
            self.step
                .run_inputs(&[(*token, &t[..size]), (*position, &p[..size])])?;
            *fed += 1;
        }
        self.step.logits_row(0, &mut self.logits)
    }
}

/// Sets `context` to the prompt's last `seq` tokens.
fn start_context(context: &mut Vec<u32>, prompt: &[u32], seq: usize) {
    context.clear();
    context.extend_from_slice(&prompt[prompt.len().saturating_sub(seq)..]);
}

/// Appends a drawn token to `context`, first keeping only its last `seq / 2` tokens when the
/// window is full (llama.cpp's context shift); returns whether it slid (a KV cache then holds
/// positions no longer theirs).
fn push_token(context: &mut Vec<u32>, token: u32, seq: usize) -> bool {
    let slid = context.len() == seq;
    if slid {
        let keep = seq / 2;
        context.copy_within(seq - keep.., 0);
        context.truncate(keep);
    }
    context.push(token);
    slid
}

/// `graph` (an imported forward pass whose outputs are `outputs`, by name) reduced to a
/// decoder's logits, the one output [`LOGITS`], for [`Generator::whole_window`]: the output
/// `wanted`, else the one named `logits`, else the only output shaped `[batch, seq, vocab]`
/// over the input `x`'s `[batch, seq]`. No such output (a classifier's `[batch, classes]`),
/// several without a name to choose, or a `wanted` that is not one, is an error listing the
/// outputs with their types.
pub fn decoder_logits(
    graph: &Graph,
    outputs: &IndexMap<String, NodeId>,
    wanted: Option<&str>,
) -> Result<Graph, String> {
    let x = graph
        .leaf("x")
        .filter(|id| graph.leaves(LeafKind::Input).contains(id))
        .ok_or("the model has no data input of token ids")?;
    let xty = graph.ty(x);
    let listed = || {
        outputs
            .iter()
            .map(|(n, &id)| format!("{n} {}", graph.ty(id)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let fits = |id: NodeId| {
        let ty = graph.ty(id);
        let dims = ty.shape.dims();
        ty.dtype.is_float() && dims.len() == 3 && dims[..2] == *xty.shape.dims()
    };
    let want = format!(
        "logits [batch, seq, vocab] over the input's {} tokens",
        xty.shape
    );
    let chosen = match wanted {
        Some(name) => {
            let &id = outputs.get(name).ok_or_else(|| {
                format!(
                    "the model has no output {name:?}; its outputs: {}",
                    listed()
                )
            })?;
            if !fits(id) {
                return Err(format!("output {name} is {}, not {want}", graph.ty(id)));
            }
            id
        }
        None => {
            let candidates: Vec<(&String, NodeId)> = outputs
                .iter()
                .filter(|(_, &id)| fits(id))
                .map(|(n, &id)| (n, id))
                .collect();
            match candidates.iter().find(|(n, _)| n.as_str() == LOGITS) {
                Some(&(_, id)) => id,
                None => match candidates.as_slice() {
                    [(_, id)] => *id,
                    [] => {
                        return Err(format!(
                            "no output of the model holds {want} (its outputs: {}): generation needs a decoder's logits, one row per position, not a classifier's",
                            listed()
                        ))
                    }
                    several => {
                        let names: Vec<&str> = several.iter().map(|(n, _)| n.as_str()).collect();
                        return Err(format!(
                            "the outputs {names:?} all hold {want}: name the logits (--logits NAME)"
                        ));
                    }
                },
            }
        }
    };
    let mut out = graph.clone();
    out.outputs.clear();
    out.set_output(LOGITS, chosen).map_err(|e| e.to_string())?;
    Ok(out.without_dead_code().0)
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
        let ids = t.encode("héllo\n").unwrap();
        assert_eq!(ids.len(), 7);
        assert_eq!(t.decode(&ids).unwrap(), "héllo\n");
    }

    #[test]
    fn decoder_logits_are_found_by_name_or_by_shape_and_a_classifier_has_none() {
        use ingot_compiler::ir::{Init, Shape};
        let mut g = Graph::new();
        g.input("x", [2, 4], DType::I64).unwrap();
        let mut leaf = |name: &str, dims: &[usize]| {
            g.parameter(name, Shape::new(dims), DType::F32, Init::Zeros)
                .unwrap()
        };
        let (scores, hidden, pooled) = (
            leaf("scores", &[2, 4, 5]),
            leaf("hidden", &[2, 4, 8]),
            leaf("pooled", &[2, 5]),
        );
        let outs = |named: &[(&str, NodeId)]| -> IndexMap<String, NodeId> {
            named.iter().map(|(n, id)| (n.to_string(), *id)).collect()
        };
        let vocab = |g: &Graph| g.ty(g.outputs[LOGITS]).shape.dims().to_vec();
        // The only [batch, seq, vocab] output, beside a pooled one.
        let one = decoder_logits(&g, &outs(&[("scores", scores), ("pooled", pooled)]), None);
        assert_eq!(vocab(&one.unwrap()), [2, 4, 5]);
        // Two of that shape: the one named logits, else the one asked for, else an error.
        let two = outs(&[("scores", scores), ("hidden", hidden)]);
        let e = decoder_logits(&g, &two, None).unwrap_err();
        assert!(
            e.contains("--logits") && e.contains("scores") && e.contains("hidden"),
            "{e}"
        );
        assert_eq!(
            vocab(&decoder_logits(&g, &two, Some("hidden")).unwrap()),
            [2, 4, 8]
        );
        let named = outs(&[("scores", scores), ("logits", hidden)]);
        assert_eq!(vocab(&decoder_logits(&g, &named, None).unwrap()), [2, 4, 8]);
        // A classifier's [batch, classes], found or asked for by name.
        let classifier = outs(&[("pooled", pooled)]);
        let e = decoder_logits(&g, &classifier, None).unwrap_err();
        assert!(e.contains("classifier") && e.contains("pooled"), "{e}");
        let e = decoder_logits(&g, &classifier, Some("pooled")).unwrap_err();
        assert!(
            e.contains("pooled") && e.contains("[batch, seq, vocab]"),
            "{e}"
        );
        let e = decoder_logits(&g, &classifier, Some("nope")).unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("pooled"), "{e}");
    }
}
