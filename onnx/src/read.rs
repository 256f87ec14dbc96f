//! Reading an ONNX file, bounded: a cap on the file's size, tensors decoded only when their
//! data agrees with their type, and external data files resolved only inside the model's own
//! folder (no absolute paths, no `..`, no symbolic link out of it), each one's size checked
//! against the tensor's type before it is read.

use crate::error::{OnnxError, Result};
use crate::proto::{tensor_proto, ModelProto, TensorProto};
use crate::value::{Const, Data};
use ingot_compiler::ir::DType;
use prost::Message;
use std::path::{Path, PathBuf};

/// The largest model file read unless [`crate::ImportOptions::max_file_bytes`] says otherwise
/// (protobuf itself cannot hold more than 2 GiB; larger models keep their weights as external
/// data).
pub const MAX_FILE_BYTES: u64 = 2 << 30;

/// The largest single tensor read (external data included).
pub const MAX_TENSOR_BYTES: u64 = 16 << 30;

/// Reads and decodes the model at `path`, refusing files over `max_bytes`.
pub fn read_model(path: &Path, max_bytes: u64) -> Result<ModelProto> {
    let io = |reason: String| OnnxError::Io {
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| io(e.to_string()))?;
    if !meta.is_file() {
        return Err(io("not a file".into()));
    }
    if meta.len() > max_bytes {
        return Err(io(format!(
            "{} bytes is over the limit of {max_bytes} bytes (raise ImportOptions::max_file_bytes)",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| io(e.to_string()))?;
    decode_model(&bytes, &path.display().to_string())
}

/// Decodes `bytes` as a `ModelProto`; `what` names them in errors.
pub fn decode_model(bytes: &[u8], what: &str) -> Result<ModelProto> {
    if bytes.is_empty() {
        return Err(OnnxError::Decode {
            what: what.into(),
            reason: "the file is empty".into(),
        });
    }
    let model = ModelProto::decode(bytes).map_err(|e| OnnxError::Decode {
        what: what.into(),
        reason: format!("{e} (truncated or not an ONNX file?)"),
    })?;
    if model.graph.is_none() {
        return Err(OnnxError::Decode {
            what: what.into(),
            reason: "it has no graph (not an ONNX model file?)".into(),
        });
    }
    Ok(model)
}

/// The Ingot dtype of ONNX element type `t` (with floats traced as `float`), or why not.
pub fn dtype_of(t: i32, float: DType) -> std::result::Result<DType, String> {
    use tensor_proto::DataType as T;
    match T::try_from(t) {
        Ok(T::Float) => Ok(float),
        Ok(T::Double) => Ok(if float == DType::F32 { DType::F64 } else { float }),
        Ok(T::Bfloat16) => Ok(DType::BF16),
        Ok(T::Int64) => Ok(DType::I64),
        Ok(T::Int32) => Ok(DType::I32),
        Ok(T::Bool) => Ok(DType::Bool),
        Ok(other) => Err(format!(
            "element type {} is not one Ingot has (it has float, double, bfloat16, int64, int32, bool)",
            other.as_str_name()
        )),
        Err(_) => Err(format!("element type {t} is not an ONNX type")),
    }
}

/// Where external data may be read from: the model file's folder.
#[derive(Clone, Debug)]
pub struct DataDir(pub Option<PathBuf>);

/// Decodes `t` (an initializer or a `Constant`'s value) into a host constant; floats are
/// traced as `float`. Its data must agree with its dims and type.
pub fn tensor(t: &TensorProto, float: DType, dir: &DataDir) -> Result<Const> {
    let name = if t.name().is_empty() {
        "a constant tensor".to_string()
    } else {
        format!("tensor {:?}", t.name())
    };
    let bad = |reason: String| OnnxError::Graph(format!("{name}: {reason}"));
    let dtype = dtype_of(t.data_type(), float).map_err(bad)?;
    let mut dims = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(bad(format!("dims {:?} has a negative size", t.dims)));
        }
        dims.push(d as usize);
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|n| (*n as u64).saturating_mul(8) <= MAX_TENSOR_BYTES)
        .ok_or_else(|| bad(format!("dims {:?} are too large", t.dims)))?;
    if t.segment.is_some() {
        return Err(bad("segmented tensors are not supported".into()));
    }
    let onnx_type = tensor_proto::DataType::try_from(t.data_type()).unwrap_or_default();
    let width = match onnx_type {
        tensor_proto::DataType::Float | tensor_proto::DataType::Int32 => 4,
        tensor_proto::DataType::Double | tensor_proto::DataType::Int64 => 8,
        tensor_proto::DataType::Bfloat16 => 2,
        _ => 1,
    };
    let external = t.data_location == Some(tensor_proto::DataLocation::External as i32);
    let raw: Option<Vec<u8>> = if external {
        Some(external_data(t, dir, (n * width) as u64).map_err(bad)?)
    } else if t.raw_data.is_some() {
        Some(t.raw_data().to_vec())
    } else {
        None
    };
    let data = match raw {
        Some(raw) => {
            if raw.len() != n * width {
                return Err(bad(format!(
                    "holds {} bytes of data, but {n} elements of its type need {}",
                    raw.len(),
                    n * width
                )));
            }
            from_le(&raw, onnx_type)
        }
        None => {
            let (len, data) = match onnx_type {
                tensor_proto::DataType::Float => (
                    t.float_data.len(),
                    Data::F(t.float_data.iter().map(|&x| x as f64).collect()),
                ),
                tensor_proto::DataType::Double => {
                    (t.double_data.len(), Data::F(t.double_data.clone()))
                }
                tensor_proto::DataType::Int64 => {
                    (t.int64_data.len(), Data::I(t.int64_data.clone()))
                }
                tensor_proto::DataType::Int32 | tensor_proto::DataType::Bool => (
                    t.int32_data.len(),
                    Data::I(t.int32_data.iter().map(|&x| x as i64).collect()),
                ),
                tensor_proto::DataType::Bfloat16 => (
                    t.int32_data.len(),
                    Data::F(
                        t.int32_data
                            .iter()
                            .map(|&x| f32::from_bits((x as u32 & 0xffff) << 16) as f64)
                            .collect(),
                    ),
                ),
                _ => (0, Data::I(vec![])),
            };
            if len != n {
                return Err(bad(format!(
                    "holds {len} elements, but its dims {:?} need {n}",
                    t.dims
                )));
            }
            data
        }
    };
    let data = match (dtype, data) {
        (DType::Bool, Data::I(v)) => Data::I(v.into_iter().map(|x| (x != 0) as i64).collect()),
        (_, d) => d,
    };
    Ok(Const::new(dtype, dims, data))
}

/// A leaf initializer's (a parameter's, a running statistic's) elements as little-endian bytes
/// of the leaf's dtype, its dtype and dims. Raw data whose ONNX encoding is already the leaf
/// dtype's (float as f32, double as f64, bfloat16, int64, int32: every model's weights but a
/// gradient check's, which widens f32 to f64) is kept as its own bytes, never widened to the
/// f64 [`tensor`] folds in: a model's import holds its weights once, at their size. Anything
/// else (typed fields, booleans, a widening) goes through [`tensor`], which also names every
/// error.
pub fn leaf_bytes(
    t: &TensorProto,
    float: DType,
    dir: &DataDir,
) -> Result<(DType, Vec<usize>, Vec<u8>)> {
    let external = t.data_location == Some(tensor_proto::DataLocation::External as i32);
    let dims: Option<Vec<usize>> = t.dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    let n = dims.as_ref().and_then(|d| {
        d.iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x))
            .filter(|n| (*n as u64).saturating_mul(8) <= MAX_TENSOR_BYTES)
    });
    let as_is = same_bytes(t.data_type(), float)
        .filter(|_| t.segment.is_none() && (external || t.raw_data.is_some()));
    if let (Some(dtype), Some(dims), Some(n)) = (as_is, dims, n) {
        let want = n * dtype.size();
        let raw = if external {
            external_data(t, dir, want as u64)
                .map_err(|reason| OnnxError::Graph(format!("tensor {:?}: {reason}", t.name())))?
        } else {
            t.raw_data().to_vec()
        };
        if raw.len() == want {
            return Ok((dtype, dims, raw));
        }
    }
    // Every other case (and every error, which `tensor` names).
    let c = tensor(t, float, dir)?;
    let bytes = c.to_le_bytes(c.dtype);
    Ok((c.dtype, c.dims, bytes))
}

/// The leaf dtype of ONNX element type `t` when its raw little-endian bytes are already that
/// dtype's (no widening, no normalising); `None` otherwise. Booleans are not: ONNX allows any
/// nonzero byte for true.
fn same_bytes(t: i32, float: DType) -> Option<DType> {
    use tensor_proto::DataType as T;
    let dtype = dtype_of(t, float).ok()?;
    let source = match T::try_from(t).ok()? {
        T::Float => DType::F32,
        T::Double => DType::F64,
        T::Bfloat16 => DType::BF16,
        T::Int64 => DType::I64,
        T::Int32 => DType::I32,
        _ => return None,
    };
    (source == dtype).then_some(dtype)
}

fn from_le(raw: &[u8], t: tensor_proto::DataType) -> Data {
    use tensor_proto::DataType as T;
    match t {
        T::Float => Data::F(each_le(raw, |b| f32::from_le_bytes(b) as f64)),
        T::Double => Data::F(each_le(raw, f64::from_le_bytes)),
        T::Bfloat16 => Data::F(each_le(raw, |b| {
            f32::from_bits((u16::from_le_bytes(b) as u32) << 16) as f64
        })),
        T::Int64 => Data::I(each_le(raw, i64::from_le_bytes)),
        T::Int32 => Data::I(each_le(raw, |b| i32::from_le_bytes(b) as i64)),
        _ => Data::I(raw.iter().map(|&b| b as i64).collect()),
    }
}

/// `value` of each `N`-byte element of `raw`, in order (a trailing part of an element is
/// dropped, as the element count was checked before).
fn each_le<const N: usize, T>(raw: &[u8], value: impl Fn([u8; N]) -> T) -> Vec<T> {
    raw.chunks_exact(N)
        .map(|c| value(c.try_into().expect("N bytes")))
        .collect()
}

/// The bytes of an external-data tensor: `location` (relative, inside `dir`), `offset` and
/// `length` from its `external_data` entries; exactly `want` bytes.
fn external_data(
    t: &TensorProto,
    dir: &DataDir,
    want: u64,
) -> std::result::Result<Vec<u8>, String> {
    let Some(dir) = &dir.0 else {
        return Err("its data is in an external file, and the model was given as bytes: import it from its path".into());
    };
    let (mut location, mut offset, mut length) = (None, 0u64, None);
    for e in &t.external_data {
        match e.key() {
            "location" => location = Some(e.value().to_string()),
            "offset" => {
                offset = e
                    .value()
                    .parse()
                    .map_err(|_| format!("offset {:?} is not a number", e.value()))?
            }
            "length" => {
                length = Some(
                    e.value()
                        .parse::<u64>()
                        .map_err(|_| format!("length {:?} is not a number", e.value()))?,
                )
            }
            "checksum" => {}
            k => return Err(format!("external data key {k:?} is not one ONNX defines")),
        }
    }
    let location = location.ok_or("its external data has no location")?;
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!(
            "external data location {location:?} must be a plain path inside the model's folder"
        ));
    }
    let base = dir
        .canonicalize()
        .map_err(|e| format!("the model's folder {}: {e}", dir.display()))?;
    let file = base.join(rel);
    let real = file
        .canonicalize()
        .map_err(|e| format!("external data {}: {e}", file.display()))?;
    if !real.starts_with(&base) {
        return Err(format!(
            "external data {location:?} resolves outside the model's folder (to {})",
            real.display()
        ));
    }
    if let Some(len) = length {
        if len != want {
            return Err(format!(
                "external data length {len} does not match the {want} bytes its type needs"
            ));
        }
    }
    let size = std::fs::metadata(&real)
        .map_err(|e| format!("external data {}: {e}", real.display()))?
        .len();
    if offset.checked_add(want).is_none_or(|end| end > size) {
        return Err(format!(
            "external data {location:?} has {size} bytes; bytes {offset}..{} are needed",
            offset.saturating_add(want)
        ));
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("{}: {e}", real.display()))?;
    let mut buf = vec![0u8; want as usize];
    f.read_exact(&mut buf)
        .map_err(|e| format!("{}: {e}", real.display()))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(dtype: tensor_proto::DataType, dims: &[i64], bytes: Vec<u8>) -> TensorProto {
        TensorProto {
            name: Some("w".into()),
            dims: dims.to_vec(),
            data_type: Some(dtype as i32),
            raw_data: Some(bytes),
            ..Default::default()
        }
    }

    /// What the folding path makes of `t`: the reference [`leaf_bytes`] must agree with.
    fn folded(t: &TensorProto, float: DType) -> (DType, Vec<usize>, Vec<u8>) {
        let c = tensor(t, float, &DataDir(None)).unwrap();
        let bytes = c.to_le_bytes(c.dtype);
        (c.dtype, c.dims, bytes)
    }

    #[test]
    fn a_leaf_whose_bytes_are_its_dtypes_is_imported_as_they_are_and_equals_the_folded_value() {
        use tensor_proto::DataType as T;
        // bf16 with odd bit patterns (a NaN payload, a subnormal) must come through untouched.
        let bf16: Vec<u8> = [0x3f80u16, 0x7fc1, 0x0001, 0xc2f7]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        let f64s: Vec<u8> = [1.0f64 / 3.0, -2.5]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let i64s: Vec<u8> = [i64::MIN, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let i32s: Vec<u8> = [-3i32, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
        let f32s: Vec<u8> = [0.1f32, -7.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let cases = [
            (raw(T::Bfloat16, &[2, 2], bf16.clone()), DType::BF16),
            (raw(T::Double, &[2], f64s.clone()), DType::F64),
            (raw(T::Int64, &[2], i64s.clone()), DType::I64),
            (raw(T::Int32, &[2], i32s.clone()), DType::I32),
            (raw(T::Float, &[2], f32s.clone()), DType::F32),
        ];
        for (t, dtype) in cases {
            let (got_dtype, dims, bytes) = leaf_bytes(&t, DType::F32, &DataDir(None)).unwrap();
            assert_eq!(got_dtype, dtype);
            assert_eq!(
                bytes,
                t.raw_data.clone().unwrap(),
                "{dtype:?} kept as it is"
            );
            if dtype != DType::BF16 {
                // (bf16's NaN payload is normalised by the folding path; the rest agree.)
                assert_eq!((got_dtype, dims, bytes), folded(&t, DType::F32));
            }
        }
        assert_eq!(
            same_bytes(T::Float as i32, DType::F64),
            None,
            "widened for a gradient check"
        );
        assert_eq!(
            same_bytes(T::Bool as i32, DType::F32),
            None,
            "booleans are normalised"
        );
    }

    #[test]
    fn a_leaf_widened_for_a_gradient_check_goes_through_the_folding_path() {
        let f32s: Vec<u8> = [0.1f32, -7.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let t = raw(tensor_proto::DataType::Float, &[2], f32s);
        let (dtype, dims, bytes) = leaf_bytes(&t, DType::F64, &DataDir(None)).unwrap();
        assert_eq!((dtype, dims.clone()), (DType::F64, vec![2]));
        let want: Vec<u8> = [0.1f32 as f64, -7.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_leaf_with_too_few_bytes_is_an_error_naming_it() {
        let t = raw(tensor_proto::DataType::Bfloat16, &[3], vec![0; 4]);
        let e = leaf_bytes(&t, DType::F32, &DataDir(None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"w\"") && e.contains("bytes"), "{e}");
    }
}
