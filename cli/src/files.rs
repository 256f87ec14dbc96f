//! Reading the program's input files and writing its outputs: capped, checked before any work,
//! written atomically, every error naming the file.

use crate::failure::Failure;

/// The longest `--model-file` read (the IR text of gpt2 is well under 1 MiB).
pub const MAX_MODEL_FILE_BYTES: u64 = 64 << 20;

/// The text of the file at `path`, at most `cap` bytes of UTF-8; errors name the file.
pub fn read_text(path: &std::path::Path, cap: u64) -> Result<String, Failure> {
    let bytes = ingot_compiler::files::read_capped(path, cap)
        .map_err(|e| Failure::new(1, format!("{}: cannot read it: {e}", path.display())))?;
    String::from_utf8(bytes).map_err(|e| {
        Failure::new(
            1,
            format!(
                "{}: not UTF-8 text (byte {} is not valid UTF-8)",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Checks, before any work, that each output file given can be written (the directory exists
/// and is writable, the path is not a directory) and that none is the same file as an input or
/// as another output (it would be written over: the data set under `--report`, the model file
/// under `-o`), naming the options and the paths when not.
pub fn check_outputs<'a>(
    outputs: &[(&'a str, Option<&'a std::path::Path>)],
    inputs: &[(&'a str, Option<&'a std::path::Path>)],
) -> Result<(), Failure> {
    let given =
        |list: &[(&'a str, Option<&'a std::path::Path>)]| -> Vec<(&'a str, &'a std::path::Path)> {
            list.iter().filter_map(|&(o, p)| Some((o, p?))).collect()
        };
    let (outputs, inputs) = (given(outputs), given(inputs));
    for (i, &(option, path)) in outputs.iter().enumerate() {
        ingot_compiler::files::check_writable(path).map_err(|e| {
            Failure::new(
                1,
                format!("{option} {}: cannot write there: {e}", path.display()),
            )
        })?;
        let clash = inputs
            .iter()
            .map(|&(o, p)| (o, p, "it would overwrite"))
            .chain(
                outputs[..i]
                    .iter()
                    .map(|&(o, p)| (o, p, "both would write")),
            )
            .find(|&(_, p, _)| ingot_compiler::files::same_file(path, p));
        if let Some((other, p, what)) = clash {
            return Err(Failure::new(
                2,
                format!(
                    "{option} {} is the same file as {other} {}: {what} it; give another path",
                    path.display(),
                    p.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically ([`ingot_compiler::files::write_atomically`]).
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), Failure> {
    ingot_compiler::files::write_atomically(path, bytes)
        .map_err(|e| Failure::new(1, format!("{}: cannot write it: {e}", path.display())))
}
