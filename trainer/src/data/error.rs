//! What goes wrong reading a data set.

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
