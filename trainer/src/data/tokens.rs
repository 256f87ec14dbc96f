//! Token streams for language models, in the three layouts people already have:
//!
//! - a raw file of little-endian `uint16` token ids, as nanoGPT's `prepare.py` writes
//!   `train.bin` (and as `ingot data bytes` writes);
//! - an llm.c token shard: a header of 256 little-endian `int32` (magic, version, token count,
//!   zeros), then the tokens: magic 20240520 with version 1 holds `uint16` tokens (GPT-2),
//!   magic 20240801 with version 7 holds `uint32` tokens (Llama 3), as llm.c's
//!   `dev/data/data_common.py` writes them;
//! - a 1-D `.npy` array of integers (`uint8`, `uint16`, `uint32`, `int16`, `int32`, `int64`, ...).
//!
//! The layout is recognised from the first bytes, whatever the file is called: the `.npy` magic
//! string, else an llm.c magic number, else raw `uint16`. A raw GPT-2 token file cannot be taken
//! for an llm.c shard: as `uint16` tokens both magic numbers begin with an id above 50256.
//!
//! Nothing is read ahead: [`TokenStream::read`] reads one window by seek + read into a buffer
//! reused from call to call.

use super::array::{Elem, WindowReader};
use super::error::DataError;
use super::npy;
use std::path::{Path, PathBuf};

/// llm.c's magic number of a GPT-2 (`uint16`) token shard.
pub const LLMC_MAGIC_U16: i32 = 20240520;
/// llm.c's magic number of a Llama 3 (`uint32`) token shard.
pub const LLMC_MAGIC_U32: i32 = 20240801;
/// The bytes of an llm.c shard's header: 256 `int32`.
pub const LLMC_HEADER_BYTES: u64 = 256 * 4;

/// How a token file lays out its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenFormat {
    /// Raw little-endian `uint16` (nanoGPT's `train.bin`).
    RawU16,
    /// An llm.c shard with this magic number.
    LlmC { magic: i32 },
    /// A 1-D `.npy` array of this element type.
    Npy(Elem),
}

impl std::fmt::Display for TokenFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenFormat::RawU16 => write!(f, "raw uint16"),
            TokenFormat::LlmC { magic } => write!(f, "llm.c shard (magic {magic})"),
            TokenFormat::Npy(e) => write!(f, ".npy {}", e.name()),
        }
    }
}

/// An open token file: its layout, where its tokens start, and how many it holds.
#[derive(Debug)]
pub struct TokenStream {
    path: PathBuf,
    format: TokenFormat,
    elem: Elem,
    offset: u64,
    len: u64,
    reader: WindowReader,
}

/// A token file's layout, without its details: what [`TokenStream::open_as`] may be told to
/// read a file as, whatever its first bytes look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenLayout {
    Raw,
    LlmC,
    Npy,
}

/// The layout a token file's first bytes announce (see the module docs).
pub fn detect_layout(head: &[u8]) -> TokenLayout {
    let magic = (head.len() >= 4).then(|| i32::from_le_bytes(head[..4].try_into().expect("4")));
    if npy::is_npy(head) {
        TokenLayout::Npy
    } else if matches!(magic, Some(LLMC_MAGIC_U16 | LLMC_MAGIC_U32)) {
        TokenLayout::LlmC
    } else {
        TokenLayout::Raw
    }
}

impl TokenStream {
    /// Opens the token file at `path` and checks its header and length; its layout is the
    /// one its first bytes announce ([`detect_layout`]).
    pub fn open(path: &Path) -> Result<TokenStream, DataError> {
        TokenStream::open_as(path, None)
    }

    /// As [`TokenStream::open`], read as `layout` when given: a raw file whose first tokens
    /// happen to spell a `.npy` magic string or an llm.c magic number is read as raw tokens.
    pub fn open_as(path: &Path, layout: Option<TokenLayout>) -> Result<TokenStream, DataError> {
        let mut reader = WindowReader::open(path)?;
        let file_len = reader.file_len()?;
        let head = reader.head(12)?.to_vec();
        let fmt = |field: &str, reason: String| DataError::format(path, field, reason);
        let magic = (head.len() >= 4).then(|| i32::from_le_bytes(head[..4].try_into().expect("4")));
        let layout = layout.unwrap_or_else(|| detect_layout(&head));
        if layout == TokenLayout::LlmC && !matches!(magic, Some(LLMC_MAGIC_U16 | LLMC_MAGIC_U32)) {
            return Err(fmt(
                "llm.c header",
                format!(
                    "read as an llm.c shard, but the file does not begin with magic {LLMC_MAGIC_U16} or {LLMC_MAGIC_U32}"
                ),
            ));
        }
        let (format, elem, offset, len) = if layout == TokenLayout::Npy {
            let info = npy::read_header(&mut reader, path, "tokens")?;
            if info.shape.len() != 1 {
                return Err(fmt(
                    "tokens shape",
                    format!(
                        "{:?} is not 1-D: a token stream is one row of ids",
                        info.shape
                    ),
                ));
            }
            if info.elem.is_float() || info.elem == Elem::Bool {
                return Err(fmt(
                    "tokens descr",
                    format!(
                        "{} is not an integer type: token ids are integers",
                        info.elem.name()
                    ),
                ));
            }
            (
                TokenFormat::Npy(info.elem),
                info.elem,
                info.offset,
                info.shape[0] as u64,
            )
        } else if let (TokenLayout::LlmC, Some(magic @ (LLMC_MAGIC_U16 | LLMC_MAGIC_U32))) =
            (layout, magic)
        {
            let (version, elem) = if magic == LLMC_MAGIC_U16 {
                (1, Elem::U16)
            } else {
                (7, Elem::U32)
            };
            if file_len < LLMC_HEADER_BYTES {
                return Err(fmt(
                    "llm.c header",
                    format!(
                        "the file begins with llm.c's magic {magic} but holds {file_len} bytes, \
                         fewer than the {LLMC_HEADER_BYTES} of the header (truncated?)"
                    ),
                ));
            }
            if head.len() < 12 {
                return Err(fmt(
                    "llm.c header",
                    "the file ends inside the header".into(),
                ));
            }
            let word = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().expect("4"));
            if word(1) != version {
                return Err(fmt(
                    "llm.c header version (int32 1)",
                    format!("{} where magic {magic} requires version {version}", word(1)),
                ));
            }
            let count = word(2);
            if count < 0 {
                return Err(fmt(
                    "llm.c header token count (int32 2)",
                    format!("{count} is negative"),
                ));
            }
            let have = file_len - LLMC_HEADER_BYTES;
            let need = count as u64 * elem.size() as u64;
            if have != need {
                return Err(fmt(
                    "llm.c header token count (int32 2)",
                    format!(
                        "{count} tokens of {} ({need} bytes), but the file holds {have} bytes after the header{}",
                        elem.name(),
                        if have < need { " (truncated?)" } else { "" }
                    ),
                ));
            }
            (
                TokenFormat::LlmC { magic },
                elem,
                LLMC_HEADER_BYTES,
                count as u64,
            )
        } else {
            if file_len % 2 != 0 {
                return Err(fmt(
                    "length",
                    format!(
                        "{file_len} bytes is odd: a raw token file holds 2 bytes (uint16) per token (truncated?)"
                    ),
                ));
            }
            (TokenFormat::RawU16, Elem::U16, 0, file_len / 2)
        };
        Ok(TokenStream {
            path: path.to_path_buf(),
            format,
            elem,
            offset,
            len,
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> TokenFormat {
        self.format
    }

    /// The number of tokens.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reserves the read buffer for windows of `tokens` tokens, so reads of at most that many
    /// allocate nothing.
    pub fn reserve(&mut self, tokens: usize) {
        self.reader.reserve(tokens * self.elem.size());
    }

    /// Reads tokens `start..start + count`, checks each is below `vocab`, and gives each to
    /// `each(i, id)` (`i` counted from `start`). An id at or above `vocab`, or negative, is an
    /// error naming the file and the token's position in the stream.
    pub fn read(
        &mut self,
        start: u64,
        count: usize,
        vocab: u64,
        mut each: impl FnMut(usize, u64),
    ) -> Result<(), DataError> {
        let end = start.checked_add(count as u64).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(DataError::format(
                &self.path,
                "tokens",
                format!(
                    "tokens {start}..{} asked for, but the file holds {}",
                    start.saturating_add(count as u64),
                    self.len
                ),
            ));
        }
        let size = self.elem.size();
        let elem = self.elem;
        let bytes = self
            .reader
            .read(self.offset + start * size as u64, count * size, || {
                format!("tokens {start}..{}", start + count as u64)
            })?;
        for (i, b) in bytes.chunks_exact(size).enumerate() {
            let id = elem.int(b).expect("token types are integers");
            if id < 0 || id >= vocab as i128 {
                return Err(DataError::OutOfRange {
                    file: self.path.clone(),
                    what: "token id",
                    position: start + i as u64,
                    value: id,
                    bound: vocab,
                });
            }
            each(i, id as u64);
        }
        Ok(())
    }

    /// Checks every token of the file against `vocab`, reading 1 MiB at a time; the first one
    /// out of range is an error naming its position.
    pub fn check_ids(&mut self, vocab: u64) -> Result<(), DataError> {
        let chunk = (1 << 20) / self.elem.size();
        let mut start = 0;
        while start < self.len {
            let n = chunk.min((self.len - start) as usize);
            self.read(start, n, vocab, |_, _| {})?;
            start += n as u64;
        }
        Ok(())
    }

    /// A line that identifies the data set (path, layout, token count), for checkpoints.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}, {} tokens)",
            self.path.display(),
            self.format,
            self.len
        )
    }
}
