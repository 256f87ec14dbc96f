//! Pretrained GPT-2 weights under the names the field uses, mapped onto Ingot's GPT
//! ([`ingot_models::gpt`]), so that `--init` reads a checkpoint of transformers'
//! `GPT2LMHeadModel` or of nanoGPT and `--save --names hf|nanogpt` writes one back.
//!
//! The three namings of one GPT block `i` and the tensors around the blocks:
//!
//! | Ingot | Hugging Face (`GPT2LMHeadModel`) | nanoGPT |
//! |---|---|---|
//! | `wte.weight`, `wpe.weight` | `transformer.wte.weight`, `transformer.wpe.weight` | the same |
//! | `blocks.i.ln1.*`, `blocks.i.ln2.*` | `transformer.h.i.ln_1.*`, `transformer.h.i.ln_2.*` | the same |
//! | `blocks.i.qkv.weight` `[3d, d]` | `transformer.h.i.attn.c_attn.weight` `[d, 3d]` (Conv1D) | `[3d, d]` (nn.Linear) |
//! | `blocks.i.proj.weight` | `transformer.h.i.attn.c_proj.weight` (Conv1D) | nn.Linear |
//! | `blocks.i.fc.weight`, `blocks.i.fc2.weight` | `transformer.h.i.mlp.c_fc.weight`, `transformer.h.i.mlp.c_proj.weight` (Conv1D) | nn.Linear |
//! | `lnf.*` | `transformer.ln_f.*` | the same |
//! | `head.weight` | `lm_head.weight`, tied to `transformer.wte.weight` | the same |
//!
//! Biases keep their names' pattern (`c_attn.bias` is `qkv.bias`, ...). transformers' Conv1D
//! stores its weight `[in, out]`, the transpose of nn.Linear's `[out, in]` that Ingot and
//! nanoGPT use; q, k and v are the first, second and third `d` outputs in all three.
//!
//! Reading (`--init`): the naming is detected from the names (a `h.0.attn.c_attn.weight`) and,
//! between transformers and nanoGPT, from that weight's shape (`[d, 3d]` or `[3d, d]`, never
//! equal). The prefix before `h.0.` may be `transformer.` (a whole `GPT2LMHeadModel` or
//! nanoGPT), nothing (transformers' `GPT2Model`, as the hub's `gpt2` files are named) or
//! `_orig_mod.transformer.` (a `torch.compile`d nanoGPT). The head is `lm_head.weight` where
//! the file has it, else the tied `wte` (transformers' `save_pretrained` does not store it).
//! The causal-mask buffers `attn.bias` and `attn.masked_bias` are ignored. A position table
//! longer than the model's `seq` is cut to its first `seq` rows, as nanoGPT's
//! `crop_block_size` does. Anything else the model does not have, or a tensor missing or of
//! another shape, is an error naming it.
//!
//! Writing (`--save --names`): the names and layouts of the naming, prefix `transformer.`.
//! `lm_head.weight` is written for nanoGPT always (its `state_dict` holds both names) and for
//! transformers only when the head is no longer bit-equal to `wte` (Ingot trains the two as
//! separate parameters; transformers' tied config would ignore a differing head).

use indexmap::IndexMap;
use ingot_compiler::ir::TensorType;
use ingot_runtime::tensor::Tensor;

/// A naming of GPT-2's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// transformers' `GPT2LMHeadModel` (Conv1D weights `[in, out]`).
    HuggingFace,
    /// nanoGPT's `GPT` (nn.Linear weights `[out, in]`).
    NanoGpt,
}

impl std::fmt::Display for Naming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Naming::HuggingFace => "Hugging Face's (transformers' GPT2LMHeadModel)",
            Naming::NanoGpt => "nanoGPT's",
        })
    }
}

/// One tensor of a block: Ingot's name after `blocks.{i}.`, the field's after `h.{i}.`, and
/// whether transformers stores it transposed (a Conv1D weight).
const BLOCK: [(&str, &str, bool); 12] = [
    ("ln1.weight", "ln_1.weight", false),
    ("ln1.bias", "ln_1.bias", false),
    ("qkv.weight", "attn.c_attn.weight", true),
    ("qkv.bias", "attn.c_attn.bias", false),
    ("proj.weight", "attn.c_proj.weight", true),
    ("proj.bias", "attn.c_proj.bias", false),
    ("ln2.weight", "ln_2.weight", false),
    ("ln2.bias", "ln_2.bias", false),
    ("fc.weight", "mlp.c_fc.weight", true),
    ("fc.bias", "mlp.c_fc.bias", false),
    ("fc2.weight", "mlp.c_proj.weight", true),
    ("fc2.bias", "mlp.c_proj.bias", false),
];

/// The tensors outside the blocks: Ingot's name and the field's after `transformer.`.
const OUTER: [(&str, &str); 4] = [
    ("wte.weight", "wte.weight"),
    ("wpe.weight", "wpe.weight"),
    ("lnf.weight", "ln_f.weight"),
    ("lnf.bias", "ln_f.bias"),
];

/// Buffers of a block that Ingot computes (the causal mask) rather than stores.
const IGNORED: [&str; 2] = ["attn.bias", "attn.masked_bias"];

/// The number of blocks of Ingot's GPT whose parameters are `params`, or `None` when they are
/// not a GPT's: the tensors of the module docs' table, nothing else.
pub fn gpt_layers(params: &IndexMap<String, Tensor>) -> Option<usize> {
    let layers = (0..)
        .take_while(|i| params.contains_key(&format!("blocks.{i}.qkv.weight")))
        .count();
    let expected = layers * BLOCK.len() + OUTER.len() + 1;
    let all = params.len() == expected
        && params.contains_key("head.weight")
        && OUTER.iter().all(|(n, _)| params.contains_key(*n))
        && (0..layers).all(|i| {
            BLOCK
                .iter()
                .all(|(n, _, _)| params.contains_key(&format!("blocks.{i}.{n}")))
        });
    (layers > 0 && all).then_some(layers)
}

/// The naming of `file`'s names, and the prefix before `h.0.`, if it holds GPT-2 blocks under
/// the field's names: `None` for any other file (Ingot's own names among them).
pub fn detect(file: &IndexMap<String, Tensor>) -> Option<(Naming, String)> {
    let (name, t) = file
        .iter()
        .find(|(n, _)| n.ends_with("h.0.attn.c_attn.weight"))?;
    let prefix = name.strip_suffix("h.0.attn.c_attn.weight")?.to_string();
    let naming = match t.dims() {
        [a, b] if *b == 3 * *a => Naming::HuggingFace,
        _ => Naming::NanoGpt,
    };
    Some((naming, prefix))
}

/// The name of the head beside the blocks under `prefix`: `lm_head.weight` next to
/// `transformer.`, under the same outer prefix (`_orig_mod.`).
fn head_name(prefix: &str) -> String {
    format!(
        "{}lm_head.weight",
        prefix.strip_suffix("transformer.").unwrap_or(prefix)
    )
}

/// `file` under Ingot's names, for the GPT whose parameters are `model` (their shapes are the
/// expected ones), read as `naming` with `prefix` ([`detect`]); also the notes to tell the user
/// (ignored buffers, a cut position table). Errors name the file's tensor, its expected and
/// found shape, or list the names the model does not have.
pub fn to_ingot(
    file: &IndexMap<String, Tensor>,
    model: &IndexMap<String, Tensor>,
    naming: Naming,
    prefix: &str,
) -> Result<(IndexMap<String, Tensor>, Vec<String>), String> {
    let layers = gpt_layers(model).ok_or("the model is not Ingot's GPT")?;
    let mut out = IndexMap::new();
    let mut used = std::collections::HashSet::new();
    let mut notes = Vec::new();
    let expected = |name: &str| &model[name].ty;
    let mut take = |ours: &str, theirs: String, transposed: bool| -> Result<(), String> {
        let want = expected(ours);
        let t = file.get(&theirs).ok_or_else(|| {
            format!(
                "{theirs}: missing (it holds Ingot's {ours} {want}; the file's naming is {naming})"
            )
        })?;
        used.insert(theirs.clone());
        let (t, stored) = if transposed {
            (transpose(t), transposed_type(want).to_string())
        } else {
            (t.clone(), want.to_string())
        };
        let t = if ours == "wpe.weight" {
            crop_rows(t, want, &theirs, &mut notes)
        } else {
            t
        };
        if t.dims() != want.shape.dims() {
            return Err(format!(
                "{theirs}: expected shape {stored}{}, found {} (it holds Ingot's {ours})",
                if transposed {
                    " (Conv1D's [in, out])"
                } else {
                    ""
                },
                file[&theirs].ty,
            ));
        }
        out.insert(ours.to_string(), t);
        Ok(())
    };
    let conv1d = naming == Naming::HuggingFace;
    for (ours, theirs) in OUTER {
        take(ours, format!("{prefix}{theirs}"), false)?;
    }
    for i in 0..layers {
        for (ours, theirs, conv) in BLOCK {
            take(
                &format!("blocks.{i}.{ours}"),
                format!("{prefix}h.{i}.{theirs}"),
                conv && conv1d,
            )?;
        }
    }
    let head = head_name(prefix);
    if file.contains_key(&head) {
        take("head.weight", head, false)?;
    } else {
        notes.push(format!(
            "head.weight is the tied {prefix}wte.weight (the file has no {head})"
        ));
        out.insert("head.weight".into(), out["wte.weight"].clone());
    }
    let mut ignored = Vec::new();
    let mut unknown = Vec::new();
    for name in file.keys().filter(|n| !used.contains(*n)) {
        let buffer = name
            .strip_prefix(&format!("{prefix}h."))
            .and_then(|rest| rest.split_once('.'))
            .is_some_and(|(_, field)| IGNORED.contains(&field));
        if buffer {
            ignored.push(name.clone());
        } else {
            unknown.push(name.clone());
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "names that Ingot's GPT of {layers} layer(s) does not have under {naming} naming: {unknown:?}"
        ));
    }
    if !ignored.is_empty() {
        notes.push(format!(
            "ignored {} causal-mask buffer(s) the model computes ({})",
            ignored.len(),
            ignored.join(", ")
        ));
    }
    Ok((out, notes))
}

/// Ingot's GPT parameters `params` under `naming`'s names and layouts, prefix `transformer.`
/// (see the module docs for when `lm_head.weight` is written). Errors when `params` are not a
/// GPT's.
pub fn from_ingot(
    params: &IndexMap<String, Tensor>,
    naming: Naming,
) -> Result<IndexMap<String, Tensor>, String> {
    let layers = gpt_layers(params).ok_or_else(|| {
        format!(
            "--names writes a GPT's weights under {naming} names, but the model's parameters are not Ingot's GPT's ({:?}...)",
            params.keys().take(3).collect::<Vec<_>>()
        )
    })?;
    let mut out = IndexMap::new();
    for (ours, theirs) in OUTER {
        out.insert(format!("transformer.{theirs}"), params[ours].clone());
    }
    for i in 0..layers {
        for (ours, theirs, conv) in BLOCK {
            let t = &params[&format!("blocks.{i}.{ours}")];
            let t = if conv && naming == Naming::HuggingFace {
                transpose(t)
            } else {
                t.clone()
            };
            out.insert(format!("transformer.h.{i}.{theirs}"), t);
        }
    }
    let head = &params["head.weight"];
    let tied = head.to_le_bytes() == params["wte.weight"].to_le_bytes();
    if naming == Naming::NanoGpt || !tied {
        out.insert("lm_head.weight".into(), head.clone());
    }
    Ok(out)
}

/// The type of the transpose of a matrix of type `ty`.
fn transposed_type(ty: &TensorType) -> TensorType {
    let mut dims = ty.shape.dims().to_vec();
    dims.reverse();
    TensorType::new(&dims[..], ty.dtype)
}

/// The transpose of a matrix (any dtype; moved as bytes). Another rank is returned as it is,
/// for the shape check to refuse.
fn transpose(t: &Tensor) -> Tensor {
    let [rows, cols] = *t.dims() else {
        return t.clone();
    };
    let size = t.dtype().size();
    let src = t.to_le_bytes();
    let mut dst = vec![0u8; src.len()];
    for r in 0..rows {
        for c in 0..cols {
            let from = (r * cols + c) * size;
            let to = (c * rows + r) * size;
            dst[to..to + size].copy_from_slice(&src[from..from + size]);
        }
    }
    Tensor::from_le_bytes(transposed_type(&t.ty), &dst).expect("the same bytes, transposed")
}

/// The position table `t` cut to the `want` rows of the model when it has more of the same
/// width (the model's sequences are shorter than the file's context), with a note; else `t`.
fn crop_rows(t: Tensor, want: &TensorType, name: &str, notes: &mut Vec<String>) -> Tensor {
    let (dims, wdims) = (t.dims().to_vec(), want.shape.dims());
    if dims.len() != 2 || wdims.len() != 2 || dims[1] != wdims[1] || dims[0] <= wdims[0] {
        return t;
    }
    let bytes = t.to_le_bytes();
    let keep = wdims[0] * wdims[1] * t.dtype().size();
    notes.push(format!(
        "{name}: the first {} of its {} positions kept (the model's seq)",
        wdims[0], dims[0]
    ));
    let ty = TensorType::new(wdims, t.dtype());
    Tensor::from_le_bytes(ty, &bytes[..keep]).expect("a prefix of whole rows")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize) -> Tensor {
        Tensor::from_f32([rows, cols], (0..rows * cols).map(|v| v as f32).collect())
    }

    #[test]
    fn a_transpose_moves_element_r_c_to_c_r_and_twice_is_the_identity() {
        let m = matrix(2, 3);
        let t = transpose(&m);
        assert_eq!(t.dims(), [3, 2]);
        assert_eq!(t.as_f32().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(transpose(&t), m);
    }

    #[test]
    fn the_naming_is_read_off_c_attn_s_shape_and_the_prefix_off_its_name() {
        let file = |name: &str, t: Tensor| [(name.to_string(), t)].into_iter().collect();
        assert_eq!(
            detect(&file("transformer.h.0.attn.c_attn.weight", matrix(4, 12))),
            Some((Naming::HuggingFace, "transformer.".into()))
        );
        assert_eq!(
            detect(&file("h.0.attn.c_attn.weight", matrix(4, 12))),
            Some((Naming::HuggingFace, String::new()))
        );
        assert_eq!(
            detect(&file(
                "_orig_mod.transformer.h.0.attn.c_attn.weight",
                matrix(12, 4)
            )),
            Some((Naming::NanoGpt, "_orig_mod.transformer.".into()))
        );
        assert_eq!(detect(&file("blocks.0.qkv.weight", matrix(12, 4))), None);
        assert_eq!(
            head_name("_orig_mod.transformer."),
            "_orig_mod.lm_head.weight"
        );
        assert_eq!(head_name(""), "lm_head.weight");
    }

    #[test]
    fn a_longer_position_table_keeps_its_first_rows_and_a_narrower_one_is_left_for_the_check() {
        let mut notes = Vec::new();
        let want = TensorType::new([2, 3], ingot_compiler::ir::DType::F32);
        let cut = crop_rows(matrix(4, 3), &want, "wpe", &mut notes);
        assert_eq!(cut.as_f32().unwrap(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(notes.len(), 1);
        assert_eq!(
            crop_rows(matrix(4, 2), &want, "wpe", &mut notes).dims(),
            [4, 2]
        );
    }
}
