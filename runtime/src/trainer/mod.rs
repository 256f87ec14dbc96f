//! What a training run over a data set needs besides the step: the data set opened for the
//! model ([`open_dataset`]) and checkpoints to stop and resume ([`checkpoint`]). The `train`
//! command's loop (`cli::train`) drives these with a [`crate::data::Loader`] feeding
//! [`crate::session::Session::step_on`].

pub mod checkpoint;
pub mod eval;
pub mod report;
pub mod schedule;

use crate::data::{
    BatchSource, DataError, Order, SampleBatches, SampleSet, TokenBatches, TokenStream,
};
use ingot_compiler::ir::Graph;
use std::io::Read;
use std::path::Path;

/// Which kind of data set a path holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetKind {
    /// A token stream (raw uint16, an llm.c shard, a 1-D `.npy`): batches of `seq + 1` tokens.
    Tokens,
    /// Samples `x` and `y`: a directory holding `x.npy` and `y.npy`, or one safetensors file.
    Samples,
}

/// Tells a sample set from a token stream by what is on disk: a directory is a pair of `.npy`
/// files; a file that begins as safetensors does (an 8-byte little-endian header length that
/// fits in the file, then `{`) holds `x` and `y`; anything else is a token stream, whose own
/// reader then recognises its layout ([`TokenStream::open`]). A raw uint16 token file cannot
/// pass for safetensors: its first 8 bytes, read as a length, are far larger than the file
/// unless its tokens 1 to 3 are all 0.
pub fn dataset_kind(path: &Path) -> Result<DatasetKind, DataError> {
    if path.is_dir() {
        return Ok(DatasetKind::Samples);
    }
    let io = |e| DataError::io(path, "the first bytes", e);
    let mut f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = [0u8; 9];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]).map_err(io)? {
            0 => break,
            n => got += n,
        }
    }
    if got == head.len() {
        let n = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        if head[8] == b'{' && n.checked_add(8).is_some_and(|end| end <= len) {
            return Ok(DatasetKind::Samples);
        }
    }
    Ok(DatasetKind::Tokens)
}

/// Opens the data set at `path` for `g`'s inputs `x` and `y`, cut in `order` (token rows at
/// random offsets or in order; samples shuffled each epoch or in the file's order) from `seed`.
pub fn open_dataset(
    path: &Path,
    g: &Graph,
    order: Order,
    seed: u64,
) -> Result<Box<dyn BatchSource>, DataError> {
    Ok(match dataset_kind(path)? {
        DatasetKind::Tokens => Box::new(TokenBatches::for_graph(
            TokenStream::open(path)?,
            g,
            order,
            seed,
        )?),
        DatasetKind::Samples => Box::new(SampleBatches::for_graph(
            SampleSet::open(path)?,
            g,
            order == Order::Random,
            seed,
        )?),
    })
}
