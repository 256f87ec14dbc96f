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
mod error;
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
pub use error::DataError;
pub use loader::{Loader, Staged, Staging};
pub use samples::SampleSet;
pub use tokens::{TokenFormat, TokenLayout, TokenStream};
