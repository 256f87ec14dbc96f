//! Data sets read from disk, batch by batch, for training runs over epochs (issue 18).
//!
//! - [`tokens`]: token streams for language models: raw little-endian `uint16` (nanoGPT's
//!   `train.bin`), llm.c's token shards (recognised by their header) and 1-D `.npy` arrays.
//! - [`samples`]: sample arrays for classifiers: a pair of `.npy` files or one safetensors file
//!   holding `x` and `y`, the sample count first in each shape.
//! - [`batches`]: batches cut from either, in the layout of the model's inputs, and the
//!   [`batches::Epochs`] cursor that knows (epoch, batch) and can be restored from it for resume.
//! - [`loader`]: a thread that fills the next batch into one of two caller-supplied buffers
//!   while the current step runs, allocating nothing per batch.
//! - [`bytes`]: any file as byte-level tokens (vocabulary 256), for `ingot data bytes`.
//! - [`tokenizer`]: text through a Hugging Face `tokenizer.json` (GPT-2's BPE and the rest),
//!   for `ingot data tokenize`, and ids decoded back into text.
//! - [`images`]: image folders (one folder of JPEG/PNG images per class, torchvision's
//!   `ImageFolder`), decoded and augmented on CPU threads into image batches.
//! - [`shard`]: batches as the ranks of a data-parallel step read them, each rank its shard.
//!
//! Files are never read whole: readers parse the header, keep the file open, and read each
//! window they need with seek + read into a buffer allocated once, so a multi-GB `train.bin`
//! costs no more memory than a small one. Every malformed or truncated file is a
//! [`DataError`] naming the file and the field or position at fault, never a panic.

pub mod array;
pub mod batches;
pub mod bytes;
pub mod images;
pub mod loader;
pub mod npy;
pub mod safetensors_header;
pub mod samples;
pub mod shard;
pub mod tokenizer;
pub mod tokens;

pub use batches::{
    BatchInfo, BatchSource, Cut, Dropped, Epochs, InputSlot, Order, Position, SampleBatches,
    TokenBatches,
};
pub use loader::{Loader, Staged, Staging};
pub use samples::SampleSet;
pub use tokens::{TokenFormat, TokenLayout, TokenStream};

use std::path::{Path, PathBuf};
use thiserror::Error;

/// What went wrong with a data set; each names the file and where in it.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DataError {
    /// The file could not be opened or read (`at` says what was being read).
    #[error("{}: cannot read {at}: {reason}", file.display())]
    Io {
        file: PathBuf,
        at: String,
        reason: String,
    },
    /// The file's header or layout is not what its format requires (`field` names the part).
    #[error("{}: {field}: {reason}", file.display())]
    Format {
        file: PathBuf,
        field: String,
        reason: String,
    },
    /// A token id or class label outside `0..bound`.
    #[error("{}: {what} {value} at position {position} is outside 0..{bound}", file.display())]
    OutOfRange {
        file: PathBuf,
        what: &'static str,
        position: u64,
        value: i128,
        bound: u64,
    },
    /// The data set holds too little for one batch.
    #[error("{}: {reason}", file.display())]
    TooSmall { file: PathBuf, reason: String },
    /// The data set does not fit the model's inputs (or the batch settings).
    #[error("{}: {reason}", file.display())]
    Model { file: PathBuf, reason: String },
    /// The loader thread could not start, or stopped, or was given buffers too small.
    #[error("data loader: {0}")]
    Stopped(String),
    /// A data set whose format was detected from its first bytes failed to read as that
    /// format: the error, what the file was taken for, and how to read it otherwise.
    #[error("{source} ({} was taken for {took} by its first bytes; {force})", file.display())]
    Detected {
        file: PathBuf,
        took: String,
        force: String,
        source: Box<DataError>,
    },
}

impl DataError {
    pub(crate) fn io(file: &Path, at: impl Into<String>, e: std::io::Error) -> DataError {
        let reason = if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "the file ends before it (truncated?)".to_string()
        } else {
            e.to_string()
        };
        DataError::Io {
            file: file.to_path_buf(),
            at: at.into(),
            reason,
        }
    }
    pub(crate) fn format(
        file: &Path,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> DataError {
        DataError::Format {
            file: file.to_path_buf(),
            field: field.into(),
            reason: reason.into(),
        }
    }
    pub(crate) fn model(file: &Path, reason: impl Into<String>) -> DataError {
        DataError::Model {
            file: file.to_path_buf(),
            reason: reason.into(),
        }
    }
}
