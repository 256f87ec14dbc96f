//! The header of a safetensors file, read without reading the tensors: an 8-byte little-endian
//! length `N`, then `N` bytes of JSON mapping each tensor name to its `dtype`, `shape` and
//! `data_offsets` (relative to the byte after the header). The `safetensors` crate checks a
//! whole file held in memory; reading a data set's header alone lets its rows be read by seek.
//!
//! See <https://github.com/huggingface/safetensors#format>.

use super::array::{ArrayInfo, Elem, WindowReader};
use super::error::DataError;
use std::path::Path;

/// The longest header accepted (the `safetensors` crate's own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The arrays named in `names` of the safetensors file at `path`, in that order, each checked
/// against the file: its dtype is one Ingot reads and its bytes lie inside the data region.
pub fn read_arrays(
    reader: &mut WindowReader,
    path: &Path,
    names: &[&str],
) -> Result<Vec<ArrayInfo>, DataError> {
    let fmt = |field: &str, reason: String| DataError::format(path, field, reason);
    let file_len = reader.file_len()?;
    if file_len < 8 {
        return Err(fmt(
            "header length (bytes 0..8)",
            format!("the file holds only {file_len} bytes (truncated?)"),
        ));
    }
    let n = u64::from_le_bytes(
        reader.read(0, 8, || "the header length".into())?[..8]
            .try_into()
            .expect("8 bytes"),
    );
    if n > MAX_HEADER_BYTES {
        return Err(fmt(
            "header length (bytes 0..8)",
            format!("{n} bytes is longer than the {MAX_HEADER_BYTES} accepted (not a safetensors file?)"),
        ));
    }
    if 8 + n > file_len {
        return Err(fmt(
            "header",
            format!(
                "it should end at byte {} but the file holds {file_len} bytes (truncated?)",
                8 + n
            ),
        ));
    }
    let text = reader.read(8, n as usize, || "the header".into())?;
    let json: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| fmt("header", format!("not valid JSON: {e}")))?;
    let map = json
        .as_object()
        .ok_or_else(|| fmt("header", "not a JSON object".into()))?;
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let mut out = Vec::new();
    for &name in names {
        let field = |what: &str| format!("tensor {name:?} {what}");
        let entry = map.get(name).ok_or_else(|| {
            let mut have: Vec<&str> = map
                .keys()
                .map(|k| k.as_str())
                .filter(|k| *k != "__metadata__")
                .collect();
            have.sort();
            fmt(
                &format!("tensor {name:?}"),
                format!("not in the file (it holds {have:?})"),
            )
        })?;
        let dtype = entry
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| fmt(&field("dtype"), "missing or not a string".into()))?;
        let elem = match dtype {
            "BOOL" => Elem::Bool,
            "U8" => Elem::U8,
            "I8" => Elem::I8,
            "U16" => Elem::U16,
            "I16" => Elem::I16,
            "U32" => Elem::U32,
            "I32" => Elem::I32,
            "U64" => Elem::U64,
            "I64" => Elem::I64,
            "F32" => Elem::F32,
            "F64" => Elem::F64,
            d => {
                return Err(fmt(
                    &field("dtype"),
                    format!("{d} is not supported (BOOL, U8..U64, I8..I64, F32 and F64 are)"),
                ))
            }
        };
        let shape = entry
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect::<Option<Vec<usize>>>()
            })
            .ok_or_else(|| {
                fmt(
                    &field("shape"),
                    "missing or not a list of non-negative integers".into(),
                )
            })?;
        let offsets = entry
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect::<Option<Vec<u64>>>())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| {
                fmt(
                    &field("data_offsets"),
                    "missing or not two non-negative integers".into(),
                )
            })?;
        let (begin, end) = (offsets[0], offsets[1]);
        let info = ArrayInfo {
            file: path.to_path_buf(),
            name: name.to_string(),
            offset: data_start.saturating_add(begin),
            elem,
            shape,
        };
        let need = info.data_bytes()?;
        if end < begin || end - begin != need {
            return Err(fmt(
                &field("data_offsets"),
                format!(
                    "[{begin}, {end}] does not span the {need} bytes of shape {:?} of {dtype}",
                    info.shape
                ),
            ));
        }
        if end > data_len {
            return Err(fmt(
                &field("data_offsets"),
                format!(
                    "[{begin}, {end}] runs past the {data_len} data bytes of the file (truncated?)"
                ),
            ));
        }
        out.push(info);
    }
    Ok(out)
}
