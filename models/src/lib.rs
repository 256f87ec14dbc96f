//! Ingot's model zoo: the reference models of reference-models.md (an MLP, GPTs, a CNN,
//! torchvision's ResNets), traced into forward graphs with the compiler's tracing API.
//!
//! Each is an [`ingot_compiler::model::Model`]: a forward graph with two step inputs, `x` and
//! `y`, one output, `loss` (a scalar of the model's float dtype), and the optimizer its training
//! step uses; the compiler's pipeline turns it into a training step ([`compile_model`] does it by
//! name). Parameters are named and laid out as PyTorch names them, and are declared in a fixed
//! order (the order of reference-models.md), so two builds give equal graphs. This crate is a
//! front end beside `ingot-onnx` (which imports a `Model` from an ONNX file); nothing in the
//! compiler's library depends on it.
//!
//! Paths inside this crate never start with the keyword `crate`: the compiler's own unit tests
//! compile these files as a module of the compiler (its `lib.rs` says why), where `crate` is the
//! compiler; `ingot_compiler::` and `super::` mean the same in both builds
//! (`tests/zoo/sources.rs` checks it).
//!
//! Integer inputs (class ids, token ids, targets) are [`ingot_compiler::model::ID_DTYPE`], i.e.
//! `i64`: PyTorch's dtype for class and token indices, so a batch saved from PyTorch loads
//! without conversion. (The builder and the layers accept `i32` ids as well.)
//!
//! Models are chosen by name with [`by_name`]: `mlp`, `gpt-mini`, `gpt2`, `gpt2-medium`, `gpt-1.3b`, `cnn`, `resnet18`,
//! `gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..` for any GPT shape,
//! `cnn:batch=..,classes=..,side=..` for the `cnn` at another shape, or
//! `resnet:depth=..,side=..,batch=..,classes=..,width=..` for torchvision's ResNets.

mod check;
mod cnn;
mod gpt;
pub mod gpt_decode;
mod mlp;
mod resnet;
mod spec;

pub use cnn::{cnn, cnn_of, cnn_with, CnnConfig, CNN_BATCH, CNN_CLASSES, CNN_SIDE};
pub use gpt::{gpt, GptConfig, LN_EPS};
pub use mlp::{mlp, mlp_with, MLP_BATCH, MLP_CLASSES, MLP_HIDDEN, MLP_IN};
pub use resnet::{
    resnet, resnet18, resnet18_with, ResNetConfig, RESNET_BATCH, RESNET_CLASSES, RESNET_SIDE,
};
pub use spec::{at_batch, by_name, by_name_with, min_batch, spec_batch, KNOWN_MODELS};

use ingot_compiler::pipeline::{self, CompileError, Compiled, Options};

/// Compiles the reference model named `spec` (`mlp`, `gpt-mini`, `gpt2`,
/// `gpt:KEY=VALUE,...`; see [`by_name`]): [`ingot_compiler::pipeline::compile`] of its model.
pub fn compile_model(spec: &str, opts: &Options) -> std::result::Result<Compiled, CompileError> {
    let model = by_name(spec)?;
    pipeline::compile(&model, opts)
}
