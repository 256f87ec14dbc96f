//! Text as the field tokenizes it: a Hugging Face `tokenizer.json` (GPT-2's byte-level BPE, or
//! any other the `tokenizers` crate reads) encodes a text into token ids for `ingot data
//! tokenize`, and decodes ids back into text (what `ingot generate` prints).
//!
//! The ids are written as nanoGPT and llm.c write them ([`token_file`]), so that the data
//! loader ([`super::TokenStream`]) reads them back: an llm.c shard (a header of 256 `int32`:
//! magic 20240520 with version 1 for `uint16` ids, 20240801 with version 7 for `uint32`; the
//! token count; zeros) or nanoGPT's raw little-endian `uint16`.
//!
//! A large text is encoded in pieces of about [`PIECE_BYTES`], cut only at the start of a line
//! whose first character is not whitespace ([`pieces`]). Byte-level BPE pre-tokenizers (GPT-2's
//! and Llama 3's patterns) never join such a newline to what follows it, so the ids are those
//! of the whole text at once (a test checks it on the fixture), while the crate's per-token
//! bookkeeping stays the size of one piece rather than of the whole file.

use super::error::DataError;
use std::path::{Path, PathBuf};

/// The largest `tokenizer.json` read (GPT-2's is 1.4 MB, Llama 3's 9 MB).
const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

/// The size of the pieces a text is encoded in (see the module docs).
pub const PIECE_BYTES: usize = 1 << 20;

/// A tokenizer read from a `tokenizer.json`.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextTokenizer({})", self.path.display())
    }
}

impl TextTokenizer {
    /// Reads the tokenizer at `path`. A missing or unreadable file, and one that is not a
    /// tokenizer the crate can read, are errors naming the file.
    pub fn from_file(path: &Path) -> Result<TextTokenizer, DataError> {
        let bytes = ingot_compiler::files::read_capped(path, MAX_TOKENIZER_BYTES).map_err(|e| {
            DataError::Io {
                file: path.to_path_buf(),
                at: "the tokenizer".into(),
                reason: e.to_string(),
            }
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            DataError::format(
                path,
                "tokenizer.json",
                format!("not a tokenizer Hugging Face's tokenizers library reads: {e}"),
            )
        })?;
        Ok(TextTokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of ids, added (special) tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text`, as the Python library's `Tokenizer.encode(text).ids` gives them (a
    /// post-processor's special tokens included), encoded piece by piece (module docs).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        self.encode_in_pieces(text, PIECE_BYTES)
    }

    /// [`TextTokenizer::encode`] with pieces of about `piece` bytes.
    pub fn encode_in_pieces(&self, text: &str, piece: usize) -> Result<Vec<u32>, DataError> {
        let mut ids = Vec::new();
        for (start, p) in pieces(text, piece) {
            let enc = self.inner.encode_fast(p, true).map_err(|e| {
                DataError::format(
                    &self.path,
                    "encoding",
                    format!("the text from byte {start} could not be encoded: {e}"),
                )
            })?;
            ids.extend_from_slice(enc.get_ids());
        }
        Ok(ids)
    }

    /// The text of `ids`, special tokens included (so that decoding what [`encode`] gave
    /// returns the text). An id outside the vocabulary is an error naming it.
    ///
    /// [`encode`]: TextTokenizer::encode
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        let vocab = self.vocab_size();
        if let Some((i, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| self.inner.id_to_token(id).is_none())
        {
            return Err(DataError::OutOfRange {
                file: self.path.clone(),
                what: "token id to decode",
                position: i as u64,
                value: id as i128,
                bound: vocab as u64,
            });
        }
        self.inner.decode(ids, false).map_err(|e| {
            DataError::format(&self.path, "decoding", format!("{} ids: {e}", ids.len()))
        })
    }
}

/// `text` cut into pieces of at least `size` bytes (the last may be shorter), each but the
/// first beginning a line whose first character is not whitespace; with each piece, its
/// byte offset. A text without such line starts is one piece.
pub fn pieces(text: &str, size: usize) -> impl Iterator<Item = (usize, &str)> {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let mut end = (start + size.max(1)).min(bytes.len());
        loop {
            if end >= bytes.len() {
                end = bytes.len();
                break;
            }
            // A cut at `end`: the byte before is a newline, the one at it no whitespace.
            if bytes[end - 1] == b'\n' && !text[end..].starts_with(char::is_whitespace) {
                break;
            }
            end += 1;
        }
        let piece = (start, &text[start..end]);
        start = end;
        Some(piece)
    })
}

/// How token ids are stored in a token file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenDtype {
    U16,
    U32,
}

/// The layout of a token file [`token_file`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenFileLayout {
    /// An llm.c shard: the 256-`int32` header, then the ids.
    LlmC,
    /// nanoGPT's raw little-endian `uint16` (no header; `uint16` only).
    Raw,
}

/// The bytes of a token file holding `ids` as `dtype` in `layout`. An id above 65535 for
/// `uint16` is an error naming it and its position; so is raw `uint32` (a raw file is read as
/// `uint16`), and an llm.c shard of more than `i32::MAX` tokens (its count is an `int32`).
/// `path` names the file in errors.
pub fn token_file(
    ids: &[u32],
    dtype: TokenDtype,
    layout: TokenFileLayout,
    path: &Path,
) -> Result<Vec<u8>, DataError> {
    use super::tokens::{LLMC_HEADER_BYTES, LLMC_MAGIC_U16, LLMC_MAGIC_U32};
    if dtype == TokenDtype::U16 {
        if let Some((i, &id)) = ids.iter().enumerate().find(|(_, &id)| id > u16::MAX as u32) {
            return Err(DataError::OutOfRange {
                file: path.to_path_buf(),
                what: "token id (uint16 holds at most 65535; write --dtype u32)",
                position: i as u64,
                value: id as i128,
                bound: 1 << 16,
            });
        }
    }
    let mut out = Vec::new();
    match layout {
        TokenFileLayout::Raw if dtype == TokenDtype::U32 => {
            return Err(DataError::format(
                path,
                "layout",
                "a raw token file is uint16 (nanoGPT's); uint32 ids go in an llm.c shard",
            ))
        }
        TokenFileLayout::Raw => {}
        TokenFileLayout::LlmC => {
            let count = i32::try_from(ids.len()).map_err(|_| {
                DataError::format(
                    path,
                    "llm.c header token count",
                    format!(
                        "{} tokens do not fit the header's int32 count: cut the text into shards",
                        ids.len()
                    ),
                )
            })?;
            let (magic, version) = match dtype {
                TokenDtype::U16 => (LLMC_MAGIC_U16, 1),
                TokenDtype::U32 => (LLMC_MAGIC_U32, 7),
            };
            let mut header = vec![0i32; (LLMC_HEADER_BYTES / 4) as usize];
            header[..3].copy_from_slice(&[magic, version, count]);
            out.reserve(LLMC_HEADER_BYTES as usize + ids.len() * 4);
            out.extend(header.iter().flat_map(|w| w.to_le_bytes()));
        }
    }
    match dtype {
        TokenDtype::U16 => out.extend(ids.iter().flat_map(|&id| (id as u16).to_le_bytes())),
        TokenDtype::U32 => out.extend(ids.iter().flat_map(|&id| id.to_le_bytes())),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cut_only_before_a_line_that_starts_with_no_whitespace_and_cover_the_text() {
        let text = "ab\n  cd\nef\n\ngh\n";
        let got: Vec<(usize, &str)> = pieces(text, 1).collect();
        assert_eq!(got, [(0, "ab\n  cd\n"), (8, "ef\n\n"), (12, "gh\n")]);
        assert_eq!(pieces(text, 100).count(), 1);
        assert_eq!(pieces("", 4).count(), 0);
    }

    #[test]
    fn a_u16_file_refuses_an_id_above_65535_naming_it_and_its_position() {
        let p = Path::new("out.bin");
        let e = token_file(&[1, 65535, 65536], TokenDtype::U16, TokenFileLayout::Raw, p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("65536 at position 2") && e.contains("out.bin"),
            "{e}"
        );
        let raw = token_file(&[1, 65535], TokenDtype::U16, TokenFileLayout::Raw, p).unwrap();
        assert_eq!(raw, [1, 0, 255, 255]);
        assert!(token_file(&[1], TokenDtype::U32, TokenFileLayout::Raw, p).is_err());
    }

    #[test]
    fn an_llmc_shard_has_the_magic_version_and_count_of_its_dtype_then_the_ids() {
        let p = Path::new("out.bin");
        for (dtype, magic, version, size) in [
            (TokenDtype::U16, 20240520, 1, 2),
            (TokenDtype::U32, 20240801, 7, 4),
        ] {
            let f = token_file(&[7, 70000 % 65536, 3], dtype, TokenFileLayout::LlmC, p).unwrap();
            let word = |i: usize| i32::from_le_bytes(f[4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!((word(0), word(1), word(2)), (magic, version, 3));
            assert!((3..256).all(|i| word(i) == 0));
            assert_eq!(f.len(), 1024 + 3 * size);
            assert_eq!(f[1024], 7);
        }
    }
}
