//! `ingot data`: prepare data sets. `ingot data bytes INPUT OUT.bin` writes any file as
//! byte-level tokens (vocabulary 256), raw little-endian uint16, ready for `--dataset`.

use super::Failure;
use ingot_trainer::data::bytes::{byte_tokens, BYTE_VOCAB};
use std::path::PathBuf;

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
}

pub fn run(a: &DataArgs) -> Result<(), Failure> {
    match &a.command {
        DataCommand::Bytes { input, output } => {
            super::check_outputs(
                &[("OUTPUT", Some(output.as_path()))],
                &[("INPUT", Some(input.as_path()))],
            )?;
            let bytes =
                ingot_compiler::files::read_capped(input, MAX_INPUT_BYTES).map_err(|e| {
                    Failure::new(1, format!("{}: cannot read it: {e}", input.display()))
                })?;
            super::write_file(output, &byte_tokens(&bytes))?;
            crate::outln!(
                "{}: {} tokens (vocabulary {BYTE_VOCAB}, raw uint16) from {}",
                output.display(),
                bytes.len(),
                input.display()
            )
        }
    }
}
