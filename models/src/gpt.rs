//! The GPT of reference-models.md (nanoGPT's, without dropout): token and learned position
//! embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final LayerNorm and
//! an untied head without bias; mean cross-entropy over every batch × sequence position; AdamW.

use super::check::{check_float, check_size, model_err};
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::error::Result;
use ingot_compiler::ir::{DType, Graph, Init, NodeId};
use ingot_compiler::model::Model;
use ingot_compiler::model::ID_DTYPE;
use ingot_compiler::trace::nn;
use std::fmt;

/// LayerNorm epsilon of every block and of the final norm.
pub const LN_EPS: f64 = 1e-5;

/// A GPT's shape. `seq` is both the context length (rows of `wpe`) and the length of every
/// sequence in a batch: `x` and `y` are `[batch, seq]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GptConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub d_ff: usize,
    pub seq: usize,
    pub batch: usize,
}

impl GptConfig {
    /// The keys of the `key=value` spec form, in order.
    pub const KEYS: [&'static str; 7] = [
        "vocab", "d_model", "layers", "heads", "d_ff", "seq", "batch",
    ];

    /// `gpt-mini`: 21,130,240 parameters.
    pub fn gpt_mini() -> GptConfig {
        GptConfig {
            vocab: 8192,
            d_model: 512,
            layers: 4,
            heads: 8,
            d_ff: 2048,
            seq: 256,
            batch: 16,
        }
    }

    /// `gpt2`: GPT-2 small's shape (vocab padded to 50304), 163,109,376 parameters.
    pub fn gpt2() -> GptConfig {
        GptConfig {
            vocab: 50304,
            d_model: 768,
            layers: 12,
            heads: 12,
            d_ff: 3072,
            seq: 1024,
            batch: 8,
        }
    }

    /// `gpt2-medium`: GPT-2 medium's shape (d_model 1024, 24 layers, 16 heads; vocab padded
    /// to 50304), 406,382,592 parameters (the head untied, as in every GPT here).
    pub fn gpt2_medium() -> GptConfig {
        GptConfig {
            vocab: 50304,
            d_model: 1024,
            layers: 24,
            heads: 16,
            d_ff: 4096,
            seq: 1024,
            batch: 8,
        }
    }

    /// `gpt-1.3b`: the 1.3B GPT of GPT-3's table (d_model 2048, 24 layers, 16 heads of 128;
    /// vocab padded to 50304), 1,416,744,960 parameters with the untied head.
    pub fn gpt_1_3b() -> GptConfig {
        GptConfig {
            vocab: 50304,
            d_model: 2048,
            layers: 24,
            heads: 16,
            d_ff: 8192,
            seq: 1024,
            batch: 8,
        }
    }

    /// The named shapes, with their names: what `name_of` and the model names agree on.
    pub fn named() -> [(&'static str, GptConfig); 4] {
        [
            ("gpt-mini", GptConfig::gpt_mini()),
            ("gpt2", GptConfig::gpt2()),
            ("gpt2-medium", GptConfig::gpt2_medium()),
            ("gpt-1.3b", GptConfig::gpt_1_3b()),
        ]
    }

    /// The values in [`GptConfig::KEYS`] order.
    pub fn values(&self) -> [usize; 7] {
        [
            self.vocab,
            self.d_model,
            self.layers,
            self.heads,
            self.d_ff,
            self.seq,
            self.batch,
        ]
    }

    /// The dimension of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads.max(1)
    }

    /// Checks the shape can be built: every value at least 1, `d_model` divisible by `heads`, and
    /// no tensor so large its byte size overflows. Errors are [`ingot_compiler::IrError::Model`] naming the
    /// key; `spec` is what the error reports as the model.
    #[allow(clippy::manual_is_multiple_of)] // the workspace's rust-version (1.85) predates it
    pub fn validate(&self, spec: &str) -> Result<()> {
        for (k, v) in Self::KEYS.iter().zip(self.values()) {
            if v == 0 {
                return Err(model_err(spec, format!("key {k:?} must be at least 1")));
            }
        }
        if self.d_model % self.heads != 0 {
            return Err(model_err(
                spec,
                format!(
                    "key \"heads\": d_model {} is not divisible by heads {}",
                    self.d_model, self.heads
                ),
            ));
        }
        let (v, d, f, t, b, h) = (
            self.vocab,
            self.d_model,
            self.d_ff,
            self.seq,
            self.batch,
            self.heads,
        );
        check_size(spec, "the logits (batch, seq, vocab)", &[b, t, v])?;
        check_size(
            spec,
            "the attention scores (batch, heads, seq, seq)",
            &[b, h, t, t],
        )?;
        check_size(
            spec,
            "the qkv activations (batch, seq, 3, d_model)",
            &[b, t, 3, d],
        )?;
        check_size(spec, "the MLP activations (batch, seq, d_ff)", &[b, t, f])?;
        check_size(spec, "the embedding (vocab, d_model)", &[v, d])?;
        check_size(spec, "the position embedding (seq, d_model)", &[t, d])?;
        check_size(spec, "the MLP weight (d_ff, d_model)", &[f, d])?;
        check_size(spec, "the qkv weight (3, d_model, d_model)", &[3, d, d])?;
        Ok(())
    }
}

/// The spec form `vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..`, which
/// [`GptConfig::parse`] reads back.
impl fmt::Display for GptConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in Self::KEYS.iter().zip(self.values()).enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// The model's name: `gpt-mini`, `gpt2`, `gpt2-medium` or `gpt-1.3b` for their shapes, else
/// `gpt:` and the spec form.
fn name_of(cfg: &GptConfig) -> String {
    match GptConfig::named().iter().find(|(_, c)| c == cfg) {
        Some((name, _)) => (*name).into(),
        None => format!("gpt:{cfg}"),
    }
}

/// The GPT of `cfg` in `dtype`: inputs `x` (token ids) and `y` (next-token targets), both
/// `[batch, seq]` i64; output `loss`, the mean cross-entropy over all `batch × seq` positions.
///
/// Parameters, in this order: `wte.weight` `[vocab, d]`, `wpe.weight` `[seq, d]`; per block `i`:
/// `blocks.{i}.ln1.{weight,bias}`, `blocks.{i}.qkv.{weight [3d, d], bias}`,
/// `blocks.{i}.proj.{weight [d, d], bias}`, `blocks.{i}.ln2.{weight,bias}`,
/// `blocks.{i}.fc.{weight [d_ff, d], bias}`, `blocks.{i}.fc2.{weight [d, d_ff], bias}`; then
/// `lnf.{weight,bias}`, `head.weight` `[vocab, d]`.
///
/// Since every sequence is `seq` long, the positions are `0..seq` and the position embedding is
/// `wpe.weight` itself, broadcast over the batch (the same as PyTorch's `wpe(arange(seq))`,
/// and its gradient is a sum over the batch rather than a scatter).
pub fn gpt(cfg: &GptConfig, dtype: DType) -> Result<Model> {
    let name = name_of(cfg);
    check_float(&name, dtype)?;
    cfg.validate(&name)?;
    let (vocab, d, heads, seq, batch) = (cfg.vocab, cfg.d_model, cfg.heads, cfg.seq, cfg.batch);
    let mut g = Graph::new();
    let x = g.input("x", [batch, seq], ID_DTYPE)?;
    let y = g.input("y", [batch, seq], ID_DTYPE)?;
    let (tok, wpe) = embeddings(&mut g, cfg, x, dtype)?; // [B, T, d], [T, d]
    let h = g
        .scoped("wpe", |g| g.add(tok, wpe))
        .map_err(|e| nn::in_layer("wpe", e))?;
    let h = blocks_and_final_norm(&mut g, cfg, h, |g, p, _, a| {
        nn::causal_self_attention(g, p, a, heads)
    })?;
    // The head and the loss work on the B·T positions as rows.
    let n = batch * seq;
    let h = g.scoped("head", |g| g.reshape(h, [n, d]))?;
    let logits = nn::linear(&mut g, "head", h, d, vocab, false)?; // [B·T, vocab]
    let loss = g.scoped("loss", |g| {
        let targets = g.reshape(y, [n])?;
        nn::softmax_cross_entropy(g, logits, targets)
    })?;
    g.set_output("loss", loss)?;
    Ok(Model::new(name, g, Optimizer::adamw(3e-4, 0.01)))
}

/// The token embedding of `x` (`wte`, `[vocab, d]`, rows gathered: `[.., d]`) and the position
/// table `wpe.weight` (`[seq, d]`), in the order both steps create them, so that the training
/// and decode steps have the same parameters in the same order.
pub(super) fn embeddings(
    g: &mut Graph,
    cfg: &GptConfig,
    x: NodeId,
    dtype: DType,
) -> Result<(NodeId, NodeId)> {
    let tok = nn::embedding(g, "wte", x, cfg.vocab, cfg.d_model, dtype)?;
    let wpe = g.parameter(
        "wpe.weight",
        [cfg.seq, cfg.d_model],
        dtype,
        Init::Normal { std: nn::INIT_STD },
    )?;
    Ok((tok, wpe))
}

/// `cfg.layers` pre-LayerNorm blocks on the residual stream `h`, then the final norm `lnf`.
/// Block `i` (named `blocks.{i}`): `ln1`, the attention `attend(g, name, i, x)` computes, its
/// residual add, and [`mlp_residual`]. The training and decode steps differ only in `attend`.
pub(super) fn blocks_and_final_norm(
    g: &mut Graph,
    cfg: &GptConfig,
    mut h: NodeId,
    mut attend: impl FnMut(&mut Graph, &str, usize, NodeId) -> Result<NodeId>,
) -> Result<NodeId> {
    for i in 0..cfg.layers {
        let p = format!("blocks.{i}");
        let a = nn::layer_norm(g, &format!("{p}.ln1"), h, LN_EPS)?;
        let a = attend(g, &p, i, a)?;
        h = residual(g, &p, h, a)?;
        h = mlp_residual(g, &p, h, cfg.d_model, cfg.d_ff)?;
    }
    nn::layer_norm(g, "lnf", h, LN_EPS)
}

/// `h + x` in block `p`'s scope: a block's residual connection (its errors name the block).
fn residual(g: &mut Graph, p: &str, h: NodeId, x: NodeId) -> Result<NodeId> {
    g.scoped(p, |g| g.add(h, x)).map_err(|e| nn::in_layer(p, e))
}

/// Block `p`'s MLP half on the residual stream `h` (`[.., d]`): `ln2`, `fc` (`d -> d_ff`), the
/// tanh GELU, `fc2` (`d_ff -> d`) and the residual add.
fn mlp_residual(g: &mut Graph, p: &str, h: NodeId, d: usize, d_ff: usize) -> Result<NodeId> {
    let m = nn::layer_norm(g, &format!("{p}.ln2"), h, LN_EPS)?;
    let m = nn::linear(g, &format!("{p}.fc"), m, d, d_ff, true)?;
    let m = g
        .scoped(&format!("{p}.gelu"), |g| nn::gelu_tanh(g, m))
        .map_err(|e| nn::in_layer(p, e))?;
    let m = nn::linear(g, &format!("{p}.fc2"), m, d_ff, d, true)?;
    residual(g, p, h, m)
}
