//! An n-dimensional array stored in a file at a known byte offset (a `.npy` body, or one tensor
//! of a safetensors file), and a reader of its rows by seek + read.

use super::error::DataError;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The element types the readers accept, all little-endian in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F32,
    F64,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::Bool | Elem::U8 | Elem::I8 => 1,
            Elem::U16 | Elem::I16 => 2,
            Elem::U32 | Elem::I32 | Elem::F32 => 4,
            Elem::U64 | Elem::I64 | Elem::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64)
    }

    /// NumPy's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Elem::Bool => "bool",
            Elem::U8 => "uint8",
            Elem::I8 => "int8",
            Elem::U16 => "uint16",
            Elem::I16 => "int16",
            Elem::U32 => "uint32",
            Elem::I32 => "int32",
            Elem::U64 => "uint64",
            Elem::I64 => "int64",
            Elem::F32 => "float32",
            Elem::F64 => "float64",
        }
    }

    /// The integer in the first [`Elem::size`] bytes of `b` (little-endian); `None` for floats.
    #[inline]
    pub fn int(self, b: &[u8]) -> Option<i128> {
        Some(match self {
            Elem::Bool | Elem::U8 => b[0] as i128,
            Elem::I8 => b[0] as i8 as i128,
            Elem::U16 => u16::from_le_bytes([b[0], b[1]]) as i128,
            Elem::I16 => i16::from_le_bytes([b[0], b[1]]) as i128,
            Elem::U32 => u32::from_le_bytes(b[..4].try_into().ok()?) as i128,
            Elem::I32 => i32::from_le_bytes(b[..4].try_into().ok()?) as i128,
            Elem::U64 => u64::from_le_bytes(b[..8].try_into().ok()?) as i128,
            Elem::I64 => i64::from_le_bytes(b[..8].try_into().ok()?) as i128,
            Elem::F32 | Elem::F64 => return None,
        })
    }

    /// The element in the first [`Elem::size`] bytes of `b` as an `f64`.
    #[inline]
    pub fn float(self, b: &[u8]) -> f64 {
        match self {
            Elem::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Elem::F64 => f64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            e => e.int(b).expect("an integer type") as f64,
        }
    }
}

/// Where an array lies in its file, and its element type and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayInfo {
    pub file: PathBuf,
    /// What the array is called in error messages (`x`, `y`, `tokens`).
    pub name: String,
    /// The byte offset of its first element.
    pub offset: u64,
    pub elem: Elem,
    pub shape: Vec<usize>,
}

impl ArrayInfo {
    /// The number of elements, or an error if it overflows.
    pub fn numel(&self) -> Result<u64, DataError> {
        self.shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
            .ok_or_else(|| {
                DataError::format(
                    &self.file,
                    self.field("shape"),
                    "the element count overflows",
                )
            })
    }

    /// The number of data bytes the header declares.
    pub fn data_bytes(&self) -> Result<u64, DataError> {
        self.numel()?
            .checked_mul(self.elem.size() as u64)
            .ok_or_else(|| {
                DataError::format(&self.file, self.field("shape"), "the byte count overflows")
            })
    }

    /// Elements per row: the product of the dimensions after the first (1 for a 1-D array),
    /// saturating (only an array of 0 rows can have rows too long to count).
    pub fn row_elems(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d as u64))
    }

    /// `"{name}: {what}"`, for error fields.
    pub(crate) fn field(&self, what: &str) -> String {
        format!("{} {what}", self.name)
    }
}

/// An open array file read by windows into one buffer that grows only when a larger window is
/// asked for (so a reader used with fixed window sizes allocates only on its first reads).
#[derive(Debug)]
pub struct WindowReader {
    file: std::fs::File,
    path: PathBuf,
    buffer: Vec<u8>,
}

impl WindowReader {
    pub fn open(path: &Path) -> Result<WindowReader, DataError> {
        let file = std::fs::File::open(path).map_err(|e| DataError::io(path, "the file", e))?;
        Ok(WindowReader {
            file,
            path: path.to_path_buf(),
            buffer: Vec::new(),
        })
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> Result<u64, DataError> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| DataError::io(&self.path, "its length", e))
    }

    /// Reserves room for windows of `bytes` bytes, so later reads of that size do not allocate.
    pub fn reserve(&mut self, bytes: usize) {
        self.buffer.reserve(bytes.saturating_sub(self.buffer.len()));
    }

    /// The `len` bytes at byte `offset` of the file; `what` names them in an error.
    pub fn read(
        &mut self,
        offset: u64,
        len: usize,
        what: impl FnOnce() -> String,
    ) -> Result<&[u8], DataError> {
        self.buffer.resize(len, 0);
        let result = self
            .file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| self.file.read_exact(&mut self.buffer));
        match result {
            Ok(()) => Ok(&self.buffer),
            Err(e) => Err(DataError::io(
                &self.path,
                format!("{} (bytes {offset}..{})", what(), offset + len as u64),
                e,
            )),
        }
    }

    /// At most `len` bytes from the start of the file (fewer if it is shorter): for headers.
    pub fn head(&mut self, len: usize) -> Result<&[u8], DataError> {
        self.buffer.clear();
        let result = self.file.seek(SeekFrom::Start(0)).and_then(|_| {
            (&mut self.file)
                .take(len as u64)
                .read_to_end(&mut self.buffer)
        });
        match result {
            Ok(_) => Ok(&self.buffer),
            Err(e) => Err(DataError::io(&self.path, "the header", e)),
        }
    }
}
