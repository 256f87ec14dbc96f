//! Sample arrays for classifiers: features `x` of shape `[n, ...]` and integer labels `y` of
//! shape `[n]` (or `[n, 1]`), the sample count first in both, from a pair of `.npy` files or
//! one safetensors file holding tensors named `x` and `y`. Samples are read one row at a time
//! by seek + read (the loader thread hides the latency), never the whole array.

use super::array::{ArrayInfo, WindowReader};
use super::error::DataError;
use super::{npy, safetensors_header};
use std::path::{Path, PathBuf};

/// An open sample data set.
#[derive(Debug)]
pub struct SampleSet {
    x: ArrayInfo,
    y: ArrayInfo,
    x_reader: WindowReader,
    y_reader: WindowReader,
}

impl SampleSet {
    /// Opens `path`: a directory holding `x.npy` and `y.npy`, or a safetensors file holding
    /// `x` and `y`.
    pub fn open(path: &Path) -> Result<SampleSet, DataError> {
        if path.is_dir() {
            return SampleSet::open_npy(&path.join("x.npy"), &path.join("y.npy"));
        }
        let mut reader = WindowReader::open(path)?;
        if npy::is_npy(reader.head(6)?) {
            return Err(DataError::format(
                path,
                "format",
                "a single .npy file holds one array; give the directory holding x.npy and y.npy",
            ));
        }
        let arrays = safetensors_header::read_arrays(&mut reader, path, &["x", "y"])?;
        let [x, y]: [ArrayInfo; 2] = arrays.try_into().expect("two names asked for");
        SampleSet::new(x, y, reader, WindowReader::open(path)?)
    }

    /// Opens features `x` and labels `y` from two `.npy` files.
    pub fn open_npy(x_path: &Path, y_path: &Path) -> Result<SampleSet, DataError> {
        let mut x_reader = WindowReader::open(x_path)?;
        let x = npy::read_header(&mut x_reader, x_path, "x")?;
        let mut y_reader = WindowReader::open(y_path)?;
        let y = npy::read_header(&mut y_reader, y_path, "y")?;
        SampleSet::new(x, y, x_reader, y_reader)
    }

    fn new(
        x: ArrayInfo,
        y: ArrayInfo,
        x_reader: WindowReader,
        y_reader: WindowReader,
    ) -> Result<SampleSet, DataError> {
        let fmt = |a: &ArrayInfo, what: &str, reason: String| {
            DataError::format(&a.file, a.field(what), reason)
        };
        if x.shape.is_empty() {
            return Err(fmt(
                &x,
                "shape",
                "a scalar: x needs the sample count as its first dimension".into(),
            ));
        }
        let y_ok = matches!(y.shape[..], [_] | [_, 1]);
        if !y_ok {
            return Err(fmt(
                &y,
                "shape",
                format!(
                    "{:?}: labels must be [n] or [n, 1], one class id per sample",
                    y.shape
                ),
            ));
        }
        if y.elem.is_float() {
            return Err(fmt(
                &y,
                "dtype",
                format!("{}: labels must be integers (class ids)", y.elem.name()),
            ));
        }
        if x.shape[0] != y.shape[0] {
            return Err(DataError::format(
                &y.file,
                y.field("shape"),
                format!(
                    "{} samples in y but {} in x ({}): the first dimensions must agree",
                    y.shape[0],
                    x.shape[0],
                    x.file.display()
                ),
            ));
        }
        Ok(SampleSet {
            x,
            y,
            x_reader,
            y_reader,
        })
    }

    /// The number of samples.
    pub fn len(&self) -> u64 {
        self.x.shape[0] as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn x(&self) -> &ArrayInfo {
        &self.x
    }

    pub fn y(&self) -> &ArrayInfo {
        &self.y
    }

    /// The file of the features (the data set's one file for safetensors).
    pub fn path(&self) -> &PathBuf {
        &self.x.file
    }

    /// Reserves the read buffers, so that reading a sample allocates nothing.
    pub fn reserve(&mut self) {
        self.x_reader
            .reserve(self.x.row_elems() as usize * self.x.elem.size());
        self.y_reader.reserve(self.y.elem.size());
    }

    /// The features of sample `i`, as little-endian elements of [`SampleSet::x`]'s type.
    pub fn features(&mut self, i: u64) -> Result<&[u8], DataError> {
        let row = self.x.row_elems() * self.x.elem.size() as u64;
        self.x_reader
            .read(self.x.offset + i * row, row as usize, || {
                format!("x of sample {i}")
            })
    }

    /// The label of sample `i`, checked to lie in `0..classes` (else an error naming the file
    /// and the sample).
    pub fn label(&mut self, i: u64, classes: u64) -> Result<u64, DataError> {
        let size = self.y.elem.size();
        let b = self
            .y_reader
            .read(self.y.offset + i * size as u64, size, || {
                format!("y of sample {i}")
            })?;
        let v = self.y.elem.int(b).expect("labels are integers");
        if v < 0 || v >= classes as i128 {
            return Err(DataError::OutOfRange {
                file: self.y.file.clone(),
                what: "label",
                position: i,
                value: v,
                bound: classes,
            });
        }
        Ok(v as u64)
    }

    /// Checks every label against `classes`; the first out of range is an error naming it.
    pub fn check_labels(&mut self, classes: u64) -> Result<(), DataError> {
        let size = self.y.elem.size();
        let chunk = (1 << 20) / size;
        let n = self.len();
        let mut start = 0u64;
        while start < n {
            let count = chunk.min((n - start) as usize);
            let bytes =
                self.y_reader
                    .read(self.y.offset + start * size as u64, count * size, || {
                        format!("y of samples {start}..{}", start + count as u64)
                    })?;
            for (j, b) in bytes.chunks_exact(size).enumerate() {
                let v = self.y.elem.int(b).expect("labels are integers");
                if v < 0 || v >= classes as i128 {
                    return Err(DataError::OutOfRange {
                        file: self.y.file.clone(),
                        what: "label",
                        position: start + j as u64,
                        value: v,
                        bound: classes,
                    });
                }
            }
            start += count as u64;
        }
        Ok(())
    }

    /// A line that identifies the data set, for checkpoints.
    pub fn describe(&self) -> String {
        format!(
            "{} x {:?} {} / {} y {:?} {}",
            self.x.file.display(),
            self.x.shape,
            self.x.elem.name(),
            self.y.file.display(),
            self.y.shape,
            self.y.elem.name()
        )
    }
}
