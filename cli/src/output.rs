//! Everything the program prints goes through here: standard output through [`out`] (quiet in
//! ranks other than 0, a closed pipe ending the program quietly), and every line made
//! [`printable`]. The macros [`outln!`](crate::outln) and [`errln!`](crate::errln) are
//! exported at the crate's root, and in textual scope in every module declared after this one.

use crate::failure::Failure;

/// Set in the processes of a job other than rank 0 (`--torchrun`): rank 0 prints the run's
/// output (its losses are every rank's mean), the others print only errors.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Silences (or restores) the program's standard output ([`out`]).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Writes one line of the program's output. A closed pipe (`ingot ... | head`) ends the program
/// quietly with code 0 instead of panicking as `println!` would; other write errors are failures.
pub fn out(text: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    use std::io::Write;
    if QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    // Names in the text may hold control characters (terminal escapes): written escaped.
    let text = match text.as_str() {
        Some(s) => printable(s),
        None => std::borrow::Cow::Owned(printable(&text.to_string()).into_owned()),
    };
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(Failure::new(
            1,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// Text safe to print to a terminal ([`ingot_compiler::printable::printable`]): every line
/// the program writes, to standard output ([`out`]) or standard error ([`errln!`](crate::errln)), goes
/// through it, so a name holding an escape sequence is printed escaped wherever it was put.
pub use ingot_compiler::printable::printable;

/// `eprintln!` with the line made [`printable`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::output::printable(&format!($($arg)*)))
    };
}

/// `println!` through [`out`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}
