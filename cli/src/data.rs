//! `ingot data`: prepare data sets. `ingot data bytes INPUT OUT.bin` writes any file as
//! byte-level tokens (vocabulary 256), raw little-endian uint16, ready for `--dataset`;
//! `ingot data tokenize --tokenizer tokenizer.json IN.txt OUT.bin` encodes a text with a Hugging
//! Face tokenizer into an llm.c shard (or nanoGPT's raw uint16 with `--raw`).

use crate::failure::Failure;
use ingot_trainer::data::bytes::{byte_tokens, BYTE_VOCAB};
use ingot_trainer::data::tokenizer::{token_file, TextTokenizer, TokenDtype, TokenFileLayout};
use std::path::{Path, PathBuf};

/// The longest input read: the output (two bytes a token) is built in memory, then written to
/// a temporary name and renamed.
const MAX_INPUT_BYTES: u64 = 1 << 30;

#[derive(clap::Args, Debug)]
pub struct DataArgs {
    #[command(subcommand)]
    pub command: DataCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Write any file (text or not) as byte-level tokens, vocabulary 256, as raw uint16.
    Bytes {
        /// The file to read (at most 1 GiB).
        input: PathBuf,
        /// The token file to write (nanoGPT's train.bin layout).
        output: PathBuf,
    },
    /// Encode a UTF-8 text with a Hugging Face tokenizer.json (GPT-2's byte-level BPE, or any
    /// other the tokenizers library reads) and write the ids as an llm.c token shard (header
    /// of 256 int32, magic 20240520 for uint16, 20240801 for uint32), or as nanoGPT's raw
    /// uint16 with --raw; --dataset reads either.
    Tokenize {
        /// The tokenizer (a Hugging Face tokenizer.json).
        #[arg(long, value_name = "tokenizer.json")]
        tokenizer: PathBuf,
        /// The text to encode (UTF-8, at most 1 GiB).
        input: PathBuf,
        /// The token file to write.
        output: PathBuf,
        /// The type of the stored ids: u16 holds ids up to 65535 (GPT-2's 50257), u32 any
        /// (Llama 3's 128256).
        #[arg(long, value_enum, default_value_t = DtypeArg::U16)]
        dtype: DtypeArg,
        /// Write nanoGPT's raw uint16 (no header) instead of an llm.c shard.
        #[arg(long)]
        raw: bool,
    },
}

/// `--dtype` of `ingot data tokenize`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DtypeArg {
    U16,
    U32,
}

pub fn run(a: &DataArgs) -> Result<(), Failure> {
    match &a.command {
        DataCommand::Bytes { input, output } => {
            crate::files::check_outputs(
                &[("OUTPUT", Some(output.as_path()))],
                &[("INPUT", Some(input.as_path()))],
            )?;
            let bytes =
                ingot_compiler::files::read_capped(input, MAX_INPUT_BYTES).map_err(|e| {
                    Failure::new(1, format!("{}: cannot read it: {e}", input.display()))
                })?;
            crate::files::write_file(output, &byte_tokens(&bytes))?;
            outln!(
                "{}: {} tokens (vocabulary {BYTE_VOCAB}, raw uint16) from {}",
                output.display(),
                bytes.len(),
                input.display()
            )
        }
        DataCommand::Tokenize {
            tokenizer,
            input,
            output,
            dtype,
            raw,
        } => tokenize(tokenizer, input, output, *dtype, *raw),
    }
}

/// `ingot data tokenize`: reads the tokenizer and the text, encodes, writes the token file.
fn tokenize(
    tokenizer: &Path,
    input: &Path,
    output: &Path,
    dtype: DtypeArg,
    raw: bool,
) -> Result<(), Failure> {
    crate::files::check_outputs(
        &[("OUTPUT", Some(output))],
        &[("INPUT", Some(input)), ("--tokenizer", Some(tokenizer))],
    )?;
    let (dtype, layout) =
        match (dtype, raw) {
            (DtypeArg::U32, true) => return Err(Failure::new(
                2,
                "--raw writes nanoGPT's uint16 ids; uint32 ids go in an llm.c shard (drop --raw)",
            )),
            (DtypeArg::U16, true) => (TokenDtype::U16, TokenFileLayout::Raw),
            (DtypeArg::U16, false) => (TokenDtype::U16, TokenFileLayout::LlmC),
            (DtypeArg::U32, false) => (TokenDtype::U32, TokenFileLayout::LlmC),
        };
    let data_err = |e: ingot_trainer::data::DataError| Failure::new(1, e.to_string());
    let tok = TextTokenizer::from_file(tokenizer).map_err(data_err)?;
    let bytes = ingot_compiler::files::read_capped(input, MAX_INPUT_BYTES)
        .map_err(|e| Failure::new(1, format!("{}: cannot read it: {e}", input.display())))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        Failure::new(
            1,
            format!(
                "{}: not UTF-8 text (an invalid byte at offset {}): tokenize reads text; `ingot data bytes` takes any file",
                input.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    let ids = tok.encode(&text).map_err(data_err)?;
    crate::files::write_file(
        output,
        &token_file(&ids, dtype, layout, output).map_err(data_err)?,
    )?;
    outln!(
        "{}: {} tokens (vocabulary {}, {}) from {} ({} bytes)",
        output.display(),
        ids.len(),
        tok.vocab_size(),
        match layout {
            TokenFileLayout::Raw => "raw uint16".to_string(),
            TokenFileLayout::LlmC => format!(
                "llm.c shard, {}",
                if dtype == TokenDtype::U16 {
                    "uint16"
                } else {
                    "uint32"
                }
            ),
        },
        input.display(),
        text.len()
    )
}
