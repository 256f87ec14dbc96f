//! Why a run stopped: its error type, a module of its own so that the run's parts (the summary)
//! name it without reaching back into the loop.

use crate::data::DataError;
use crate::session::SessionError;
use ingot_runtime::error::ExecError;
use ingot_runtime::io::IoError;
use std::path::PathBuf;
use thiserror::Error;

/// An observer's failure (the command line's: standard output could not be written).
pub type ObserverError = Box<dyn std::error::Error + Send + Sync>;

/// Why a run stopped. Each message names the file, step or tensor at fault and says what to do.
#[derive(Debug, Error)]
pub enum RunError {
    /// The options do not make a run (exit code 2 on the command line).
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Session(Box<SessionError>),
    #[error(transparent)]
    Exec(Box<ExecError>),
    #[error(transparent)]
    Io(Box<IoError>),
    #[error(transparent)]
    Data(Box<DataError>),
    /// A file given (`--init`, `--data`) that does not fit the session.
    #[error("{}: {source}", .path.display())]
    File {
        path: PathBuf,
        source: Box<SessionError>,
    },
    /// A `state_dict` given as `init` that does not fit the model.
    #[error("{}: {message}", .path.display())]
    StateDict { path: PathBuf, message: String },
    /// A checkpoint that cannot be read, resumed from or written.
    #[error("{0}")]
    Checkpoint(String),
    /// The evaluation step failed.
    #[error("{0}")]
    Eval(String),
    /// The report could not be written.
    #[error("{}: cannot write it: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A loss, gradient norm or updated parameter that is not finite stopped the run (nothing was saved over a
    /// good file), or the parameters after the last step are not finite.
    #[error("{0}")]
    NonFinite(String),
    /// A schedule asked of a step compiled without its learning-rate scale input.
    #[error("this step has no learning-rate scale input for --schedule/--warmup: compile it with `ingot compile ... --lr-scale-input`")]
    NoLrScaleInput,
    /// The observer failed.
    #[error("{0}")]
    Observer(ObserverError),
}

/// The errors a run passes on as they are (boxed: a `Result` of a run stays small).
macro_rules! boxed_from {
    ($($variant:ident($error:ty)),*) => {
        $(impl From<$error> for RunError {
            fn from(e: $error) -> RunError {
                RunError::$variant(Box::new(e))
            }
        })*
    };
}
boxed_from!(
    Session(SessionError),
    Exec(ExecError),
    Io(IoError),
    Data(DataError)
);
