//! Tensors to and from safetensors files, the format PyTorch, JAX and Hugging Face share.
//!
//! Parameters keep PyTorch's names and layouts unchanged (`fc1.weight` is `[out, in]`), so a
//! `state_dict` saved by PyTorch loads here, and a file saved here loads into PyTorch.
//!
//! Element types: `F32`, `F64`, `I32`, `I64` and `BOOL` (one byte per element, 0 or 1). Other
//! dtypes (`BF16`, `F16`, `U8`, ...) are refused with an error naming the file and the tensor and
//! saying how to convert it. Tensors load in the order of their data in the file.

use crate::tensor::Tensor;
use indexmap::IndexMap;
use ingot_compiler::ir::{DType, Shape, TensorType};
use safetensors::{Dtype, SafeTensors};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// An error reading or writing a safetensors file; each names the file, and the tensor where
/// one is at fault.
#[derive(Debug, Error)]
pub enum IoError {
    /// The file could not be opened, read or written.
    #[error("{}: {action}: {source}", path.display())]
    Os {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    /// The bytes are not a safetensors file (bad header, truncated data, offsets that do not cover
    /// the data).
    #[error("{} is not a valid safetensors file ({reason}); is it truncated or corrupt? Write it again with safetensors' save_file or `ingot train --save`", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// A tensor whose element type Ingot does not read.
    #[error("{}: tensor {name:?} is {dtype}, which Ingot does not read (it reads F32, F64, I32, I64 and BOOL); {hint}", path.display())]
    UnsupportedDtype {
        path: PathBuf,
        name: String,
        dtype: String,
        hint: &'static str,
    },
    /// A tensor whose data does not fit its declared type.
    #[error("{}: tensor {name:?}: {reason}", path.display())]
    Tensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
}

impl IoError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            IoError::Os { path, .. }
            | IoError::Corrupt { path, .. }
            | IoError::UnsupportedDtype { path, .. }
            | IoError::Tensor { path, .. } => path,
        }
    }
}

/// Reads every tensor of the safetensors file at `path`, by name, in the order of their data.
///
/// The file is read as far as its header declares (plus one byte, so that trailing bytes are
/// refused by the parser): a stream without end such as `/dev/zero` is an error, not a read
/// that never stops.
pub fn load(path: impl AsRef<Path>) -> Result<IndexMap<String, Tensor>, IoError> {
    let path = path.as_ref();
    from_bytes(&read_bytes(path)?, path)
}

/// The bytes of the safetensors file at `path`, read as [`load`] reads them (as far as its
/// header declares, plus one byte), for a caller that checks them before parsing (a
/// checkpoint's checksum).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, IoError> {
    read_declared(path).map_err(|source| IoError::Os {
        path: path.to_path_buf(),
        action: "cannot read",
        source,
    })
}

/// The largest header Ingot reads: safetensors' own limit.
const MAX_HEADER: u64 = 100_000_000;

/// Reads the 8-byte header length, the header, and then only as many data bytes as the header's
/// offsets reach (plus one). A header that does not parse leaves the bytes read so far to
/// [`from_bytes`], which names what is wrong.
fn read_declared(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    (&mut f).take(8).read_to_end(&mut bytes)?;
    let Ok(len) = <[u8; 8]>::try_from(bytes.as_slice()) else {
        return Ok(bytes);
    };
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Ok(bytes);
    }
    (&mut f).take(n).read_to_end(&mut bytes)?;
    let data_end = serde_json::from_slice::<serde_json::Value>(&bytes[8..])
        .ok()
        .and_then(|header| {
            header.as_object().map(|tensors| {
                tensors
                    .values()
                    .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
                    .max()
                    .unwrap_or(0)
            })
        });
    if let Some(end) = data_end {
        f.take(end.saturating_add(1)).read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}

/// Writes `tensors` to a safetensors file at `path`, replacing it atomically: a crash leaves
/// the old file or the new one, never a part ([`ingot_compiler::files::write_atomically`]).
pub fn save(path: impl AsRef<Path>, tensors: &IndexMap<String, Tensor>) -> Result<(), IoError> {
    let path = path.as_ref();
    let bytes = to_bytes(tensors, path)?;
    ingot_compiler::files::write_atomically(path, &bytes).map_err(|source| IoError::Os {
        path: path.to_path_buf(),
        action: "cannot write",
        source,
    })
}

/// A safetensors file's tensors, by name, and its metadata strings.
pub type WithMetadata = (
    IndexMap<String, Tensor>,
    std::collections::BTreeMap<String, String>,
);

/// [`load`], and the file's metadata (the header's `__metadata__` strings: PyTorch's
/// `save_model` records there the names of tied tensors it kept once, `{"dropped": "kept"}`).
pub fn load_with_metadata(path: impl AsRef<Path>) -> Result<WithMetadata, IoError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    let tensors = from_bytes(&bytes, path)?;
    let (_, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| IoError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let meta = metadata
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok((tensors, meta))
}

/// Parses the bytes of a safetensors file; `path` is what errors name.
pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<IndexMap<String, Tensor>, IoError> {
    let corrupt = |e: safetensors::SafeTensorError| IoError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(corrupt)?;
    let file = SafeTensors::deserialize(bytes).map_err(corrupt)?;
    let mut out = IndexMap::with_capacity(file.len());
    for name in metadata.offset_keys() {
        let view = file.tensor(&name).map_err(corrupt)?;
        let dtype = dtype_from(view.dtype()).map_err(|hint| IoError::UnsupportedDtype {
            path: path.to_path_buf(),
            name: name.clone(),
            dtype: view.dtype().to_string(),
            hint,
        })?;
        let ty = TensorType::new(Shape::new(view.shape()), dtype);
        let t = Tensor::from_le_bytes(ty, view.data()).map_err(|e| IoError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            reason: e.to_string(),
        })?;
        out.insert(name, t);
    }
    Ok(out)
}

/// The bytes of a safetensors file holding `tensors`; `path` is what errors name.
pub fn to_bytes(tensors: &IndexMap<String, Tensor>, path: &Path) -> Result<Vec<u8>, IoError> {
    for (name, t) in tensors {
        if t.data.dtype() != t.ty.dtype || t.data.len() != t.ty.shape.numel() {
            return Err(IoError::Tensor {
                path: path.to_path_buf(),
                name: name.clone(),
                reason: format!(
                    "declared {} but holds {} {} elements",
                    t.ty,
                    t.data.len(),
                    t.data.dtype()
                ),
            });
        }
    }
    let views = tensors.iter().map(|(name, t)| {
        (
            name.as_str(),
            Bytes {
                t,
                bytes: t.to_le_bytes(),
            },
        )
    });
    safetensors::serialize(views, None).map_err(|e| IoError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("cannot encode: {e}"),
    })
}

/// A tensor as the safetensors serializer sees it.
struct Bytes<'a> {
    t: &'a Tensor,
    bytes: Vec<u8>,
}

impl safetensors::View for Bytes<'_> {
    fn dtype(&self) -> Dtype {
        dtype_to(self.t.dtype())
    }
    fn shape(&self) -> &[usize] {
        self.t.dims()
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// The safetensors dtype of an Ingot dtype.
pub fn dtype_to(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
        DType::BF16 => Dtype::BF16,
    }
}

/// The Ingot dtype of a safetensors dtype, or a hint saying how to convert the tensor.
fn dtype_from(d: Dtype) -> Result<DType, &'static str> {
    match d {
        Dtype::F32 => Ok(DType::F32),
        Dtype::F64 => Ok(DType::F64),
        Dtype::I32 => Ok(DType::I32),
        Dtype::I64 => Ok(DType::I64),
        Dtype::BOOL => Ok(DType::Bool),
        Dtype::BF16 => Ok(DType::BF16),
        Dtype::F16 => Err("convert the floats to float32 or bfloat16 before saving (in PyTorch: {k: v.float() for k, v in state_dict.items()})"),
        Dtype::U8 | Dtype::I8 | Dtype::I16 | Dtype::U16 | Dtype::U32 | Dtype::U64 => {
            Err("save integer tensors as int64 or int32 (in PyTorch: t.long())")
        }
        _ => Err("convert the tensor to float32 (weights) or int64 (ids) before saving"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_dtype() -> IndexMap<String, Tensor> {
        let mut m = IndexMap::new();
        m.insert(
            "f32".to_string(),
            Tensor::from_f32(
                [2, 3],
                vec![0.1, -0.0, f32::MIN_POSITIVE, f32::NAN, f32::INFINITY, 1e-40],
            ),
        );
        m.insert(
            "f64".to_string(),
            Tensor::from_f64(
                [3],
                vec![
                    std::f64::consts::PI,
                    -1e300,
                    f64::from_bits(0x7ff8_0000_dead_beef),
                ],
            ),
        );
        m.insert(
            "i32".to_string(),
            Tensor::from_i32([2, 2], vec![i32::MIN, -1, 0, i32::MAX]),
        );
        m.insert(
            "i64".to_string(),
            Tensor::from_i64([1, 3], vec![i64::MIN, 42, i64::MAX]),
        );
        m.insert(
            "bool".to_string(),
            Tensor::from_bool([4], vec![true, false, false, true]),
        );
        m.insert(
            "bf16".to_string(),
            Tensor::from_vec(
                [5],
                [0x3f80u16, 0x8000, 0x7fc1, 0xff80, 0x0001]
                    .map(crate::tensor::bf16::from_bits)
                    .to_vec(),
            ),
        );
        m.insert("scalar".to_string(), Tensor::scalar(7.5f64));
        m.insert("empty".to_string(), Tensor::from_f32([0, 4], vec![]));
        m
    }

    fn bits(t: &Tensor) -> (TensorType, Vec<u8>) {
        (t.ty.clone(), t.to_le_bytes())
    }

    #[test]
    fn save_then_load_round_trips_every_dtype_bit_exactly() {
        let p = Path::new("mem.safetensors");
        let m = every_dtype();
        let back = from_bytes(&to_bytes(&m, p).unwrap(), p).unwrap();
        assert_eq!(back.len(), m.len());
        for (name, t) in &m {
            assert_eq!(bits(&back[name]), bits(t), "{name}");
        }
    }

    #[test]
    fn a_truncated_file_is_an_error_naming_the_file() {
        let p = Path::new("weights/model.safetensors");
        let bytes = to_bytes(&every_dtype(), p).unwrap();
        for cut in [0, 5, 8, 20, bytes.len() - 1] {
            let e = from_bytes(&bytes[..cut], p).unwrap_err();
            assert!(matches!(e, IoError::Corrupt { .. }), "cut at {cut}: {e}");
            assert!(e.to_string().contains("weights/model.safetensors"), "{e}");
        }
    }

    #[test]
    fn garbage_bytes_are_an_error_naming_the_file() {
        let p = Path::new("junk.safetensors");
        let mut bytes = 16u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"this is not json");
        let e = from_bytes(&bytes, p).unwrap_err();
        assert!(e.to_string().contains("junk.safetensors"), "{e}");
    }

    #[test]
    fn a_bf16_tensor_from_pytorch_loads_with_its_bits() {
        let p = Path::new("half.safetensors");
        // 1.0 and -2.5 in bf16, little-endian, as torch.save_file writes them.
        let data = [0x80u8, 0x3f, 0x20, 0xc0];
        let view = safetensors::tensor::TensorView::new(Dtype::BF16, vec![2], &data).unwrap();
        let bytes = safetensors::serialize([("wte.weight", view)], None).unwrap();
        let t = &from_bytes(&bytes, p).unwrap()["wte.weight"];
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(t.to_f64_vec(), vec![1.0, -2.5]);
    }

    #[test]
    fn an_f16_tensor_is_refused_naming_it_with_a_conversion_hint() {
        let p = Path::new("half.safetensors");
        let data = [0u8; 4];
        let view = safetensors::tensor::TensorView::new(Dtype::F16, vec![2], &data).unwrap();
        let bytes = safetensors::serialize([("wte.weight", view)], None).unwrap();
        let e = from_bytes(&bytes, p).unwrap_err().to_string();
        for want in ["half.safetensors", "wte.weight", "F16", "float32"] {
            assert!(e.contains(want), "{want} missing from: {e}");
        }
    }

    #[test]
    fn a_bool_byte_other_than_0_or_1_is_an_error_naming_the_tensor() {
        let p = Path::new("mask.safetensors");
        let data = [0u8, 2];
        let view = safetensors::tensor::TensorView::new(Dtype::BOOL, vec![2], &data).unwrap();
        let bytes = safetensors::serialize([("mask", view)], None).unwrap();
        let e = from_bytes(&bytes, p).unwrap_err().to_string();
        assert!(
            e.contains("mask.safetensors") && e.contains("\"mask\""),
            "{e}"
        );
    }

    #[test]
    fn tensors_load_in_the_order_of_their_data() {
        let p = Path::new("order.safetensors");
        let mut m = IndexMap::new();
        for name in ["b", "a", "c"] {
            m.insert(name.to_string(), Tensor::from_f32([1], vec![1.0]));
        }
        let back = from_bytes(&to_bytes(&m, p).unwrap(), p).unwrap();
        // The serializer sorts by name within a dtype.
        assert_eq!(back.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn a_stream_without_end_is_refused_after_its_header_not_read_forever() {
        let e = load("/dev/zero").unwrap_err();
        assert!(matches!(e, IoError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("/dev/zero"), "{e}");
    }

    #[test]
    fn bytes_past_what_the_header_declares_are_refused() {
        let dir = std::env::temp_dir().join(format!("ingot-io-trailing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("w.safetensors");
        save(&p, &every_dtype()).unwrap();
        assert_eq!(load(&p).unwrap().len(), every_dtype().len());
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.extend_from_slice(&[0; 16]);
        std::fs::write(&p, &bytes).unwrap();
        let e = load(&p).unwrap_err();
        assert!(matches!(e, IoError::Corrupt { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = load("/nonexistent/dir/p.safetensors")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/dir/p.safetensors"), "{e}");
    }
}
