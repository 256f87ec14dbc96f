//! The decode step of a GPT: one new token per sequence through the model, its keys and values
//! kept in a KV cache that is resident state of the step, so that generating a token costs
//! `O(seq · d)` per layer rather than the whole window's `O(seq² · d)`.
//!
//! Why static shapes and the IR's own ops: the cache is `[batch, heads, seq, head_dim]` per
//! layer, K and V, declared as state leaves ([`LeafKind::State`]) and written in place through
//! [`Graph::updates`], as the optimizer writes its moments. The position `p` the token takes is
//! a step input, so the step never changes shape: the new row lands at `p` by an elementwise
//! `select(iota == p, row, cache)` (the plan writes it over the cache's own bytes), and the
//! attention reads the whole cache with the positions after `p` masked to
//! [`nn::mask_value`] before the softmax, exactly as the causal mask hides them in the
//! whole-window step ([`super::gpt`]). So every pass, the planner and every backend
//! serve this step unchanged: its peak, cache included, is known before the first token, and a
//! token allocates nothing.
//!
//! The masked positions hold zeros or keys of an earlier context (after the generator refills
//! the cache); the mask gives them weight exactly 0, so what they hold never reaches the
//! logits as long as it is finite, which it is: the cache starts at zero and is only ever
//! written from finite activations.
//!
//! The parameters are the GPT's, with the same names, so a trained model's weights load into
//! this step as into the training step. The fused attention recognizer is not run on it (the
//! caller compiles it with `fuse_attention` off): its patterns are the whole window's
//! `[T, T]` causal attention, and this one is a single query over a masked cache.

use super::gpt::GptConfig;
use super::gpt::{blocks_and_final_norm, embeddings};
use ingot_compiler::error::{IrError, Result};
use ingot_compiler::ir::{CmpOp, DType, Graph, Init, LeafKind, NodeId, Shape};
use ingot_compiler::model::ID_DTYPE;
use ingot_compiler::trace::nn;

/// The decode step's input of token ids, `[batch, 1]`: the token each sequence takes next.
pub const TOKEN: &str = "x";
/// The decode step's input of the position the token takes, `[1]` (the same for every
/// sequence of the batch): 0 for a context's first token, at most `seq - 1`.
pub const POSITION: &str = "pos";
/// The name prefix of the cache leaves: `kv_cache.{layer}.k` and `kv_cache.{layer}.v`.
pub const CACHE_PREFIX: &str = "kv_cache.";

/// Whether `name` is a leaf of the KV cache (state the decode step owns, never loaded or
/// saved with a model's weights).
pub fn is_cache(name: &str) -> bool {
    name.starts_with(CACHE_PREFIX)
}

/// The GPT shape a model name stands for (`gpt-mini`, `gpt2`, `gpt2-medium`, `gpt-1.3b` or a
/// `gpt:` spec), or `None` for a model that is not a GPT.
pub fn gpt_config_of(spec: &str) -> Option<GptConfig> {
    if let Some((_, cfg)) = GptConfig::named().into_iter().find(|(n, _)| *n == spec) {
        return Some(cfg);
    }
    GptConfig::parse(spec.strip_prefix("gpt:")?).ok()
}

/// The decode step of the GPT `cfg` (at `cfg.batch` sequences) in `dtype` (its parameters'
/// and activations' type, f32 or f64), with a KV cache of `cache_dtype` (`dtype`, or bf16 for
/// a step compiled under bf16 autocast, whose keys and values are bf16 anyway).
///
/// Inputs [`TOKEN`] `[batch, 1]` and [`POSITION`] `[1]` (both i64 ids); output `logits`
/// `[batch, vocab]`, the next token's logits of each sequence; updates: each cache leaf
/// with the token's key or value written at the position. Given the tokens of a context fed
/// at positions `0, 1, ..., p` in turn, the logits at `p` are the whole-window step's row `p`.
pub fn gpt_decode(cfg: &GptConfig, dtype: DType, cache_dtype: DType) -> Result<Graph> {
    let name = format!("gpt:{cfg}");
    cfg.validate(&name)?;
    if !dtype.is_float() || !cache_dtype.is_float() {
        return Err(IrError::Invalid(format!(
            "the decode step of {name} needs float parameters and cache, not {dtype} and {cache_dtype}"
        )));
    }
    let (vocab, d, heads, seq, batch) = (cfg.vocab, cfg.d_model, cfg.heads, cfg.seq, cfg.batch);
    let hd = d / heads;
    let mut g = Graph::new();
    let x = g.ids_input(TOKEN, [batch, 1], ID_DTYPE, vocab as u64)?;
    let pos = g.ids_input(POSITION, [1], ID_DTYPE, seq as u64)?;
    let (tok, wpe) = embeddings(&mut g, cfg, x, dtype)?; // [B, 1, d], [seq, d]
    let h = g
        .scoped("wpe", |g| {
            let row = g.gather(wpe, pos)?; // [1, d]
            g.add(tok, row)
        })
        .map_err(|e| nn::in_layer("wpe", e))?;
    // Masks shared by the layers: the cache row the token fills, and the positions after it.
    let (fill, future) = g.scoped("kv_cache", |g| {
        let rows = g.iota([seq, 1], 0, ID_DTYPE)?;
        let fill = g.compare(CmpOp::Eq, rows, pos)?; // [seq, 1]
        let cols = g.iota([seq], 0, ID_DTYPE)?;
        let future = g.compare(CmpOp::Gt, cols, pos)?; // [seq]
        Ok::<_, IrError>((fill, future))
    })?;
    let h = blocks_and_final_norm(&mut g, cfg, h, |g, p, i, a| {
        let shape = [batch, heads, seq, hd];
        cached_attention(g, p, i, a, shape, cache_dtype, fill, future)
    })?;
    let h = g.scoped("head", |g| g.reshape(h, [batch, d]))?;
    let logits = nn::linear(&mut g, "head", h, d, vocab, false)?; // [B, vocab]
    g.set_output(ingot_compiler::trace::logits::LOGITS, logits)?;
    Ok(g)
}

/// Layer `layer`'s causal self-attention (named `name`, parameters as
/// [`nn::causal_self_attention`]'s) for one token `x [B, 1, d]` over its KV cache of `shape`
/// `[B, H, seq, hd]`: the token's key and value written into the cache at the `fill` row, its
/// query against every row, the `future` ones masked.
#[allow(clippy::too_many_arguments)]
fn cached_attention(
    g: &mut Graph,
    name: &str,
    layer: usize,
    x: NodeId,
    shape: [usize; 4],
    cache_dtype: DType,
    fill: NodeId,
    future: NodeId,
) -> Result<NodeId> {
    let [b, heads, _, hd] = shape;
    let d = heads * hd;
    let dtype = g.ty(x).dtype;
    let qkv = nn::linear(g, &format!("{name}.qkv"), x, d, 3 * d, true)?; // [B, 1, 3d]
    let y = g
        .scoped(&format!("{name}.attn"), |g| {
            let part = |g: &mut Graph, i: usize| -> Result<NodeId> {
                let s = g.slice(qkv, 2, i * d, (i + 1) * d)?;
                let s = g.reshape(s, [b, 1, heads, hd])?;
                g.transpose(s, &[0, 2, 1, 3]) // [B, H, 1, hd]
            };
            let q = part(g, 0)?;
            let k = part(g, 1)?;
            let v = part(g, 2)?;
            let cached = |g: &mut Graph, kv: &str, row: NodeId| -> Result<NodeId> {
                let leaf = g.state(
                    &format!("{CACHE_PREFIX}{layer}.{kv}"),
                    Shape::new(&shape),
                    cache_dtype,
                    Init::Zeros,
                )?;
                let row = g.convert(row, cache_dtype)?;
                let new = g.select(fill, row, leaf)?; // [B, H, seq, hd]
                g.set_update(leaf, new)?;
                g.convert(new, dtype)
            };
            let k = cached(g, "k", k)?;
            let v = cached(g, "v", v)?;
            let kt = g.transpose(k, &[0, 1, 3, 2])?; // [B, H, hd, seq]
            let scores = g.matmul(q, kt)?; // [B, H, 1, seq]
            let scores = g.mul_scalar(scores, 1.0 / (hd as f64).sqrt())?;
            let masked = g.full(nn::mask_value(dtype), Shape::scalar(), dtype)?;
            let scores = g.select(future, masked, scores)?;
            let att = nn::softmax(g, scores)?;
            let y = g.matmul(att, v)?; // [B, H, 1, hd]
            let y = g.transpose(y, &[0, 2, 1, 3])?; // [B, 1, H, hd]
            g.reshape(y, [b, 1, d])
        })
        .map_err(|e| nn::in_layer(name, e))?;
    nn::linear(g, &format!("{name}.proj"), y, d, d, true)
}

/// The cache leaves of a decode step, in the order the step declares them.
pub fn cache_leaves(g: &Graph) -> Vec<NodeId> {
    g.leaves(LeafKind::State)
        .into_iter()
        .filter(|&id| g.leaf_name(id).is_some_and(is_cache))
        .collect()
}
