//! The header of NumPy's `.npy` format (versions 1, 2 and 3), parsed here: the magic string,
//! the version, the header length, and a Python dict literal with `descr`, `fortran_order` and
//! `shape`. Only little-endian (or one-byte) numeric types in C order are accepted; anything
//! else is an error naming the field.
//!
//! See <https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html>.

use super::array::{ArrayInfo, Elem, WindowReader};
use super::error::DataError;
use std::path::Path;

/// `\x93NUMPY`.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The longest header accepted (NumPy's own limit for reading is 10000 bytes by default).
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// Whether `bytes` begins with the `.npy` magic string.
pub fn is_npy(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Reads and checks the header of the `.npy` file at `path`, and that the file holds exactly
/// the bytes the header declares. `name` names the array in errors.
pub fn read_header(
    reader: &mut WindowReader,
    path: &Path,
    name: &str,
) -> Result<ArrayInfo, DataError> {
    let file_len = reader.file_len()?;
    let head = reader.head(12)?;
    let fmt = |field: &str, reason: String| DataError::format(path, field, reason);
    if head.len() < 6 || !is_npy(head) {
        return Err(fmt(
            "magic (bytes 0..6)",
            "not a .npy file: it does not begin with \\x93NUMPY".into(),
        ));
    }
    if head.len() < 10 {
        return Err(fmt(
            "version (bytes 6..8)",
            "the file ends inside the header".into(),
        ));
    }
    let (major, minor) = (head[6], head[7]);
    let (len_bytes, utf8) = match major {
        1 => (2, false),
        2 => (4, false),
        3 => (4, true),
        _ => {
            return Err(fmt(
                "version (bytes 6..8)",
                format!("version {major}.{minor} is not one of 1.0, 2.0, 3.0"),
            ))
        }
    };
    if head.len() < 8 + len_bytes {
        return Err(fmt(
            "header length (bytes 8..)",
            "the file ends inside the header".into(),
        ));
    }
    let header_len = if len_bytes == 2 {
        u16::from_le_bytes([head[8], head[9]]) as usize
    } else {
        u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize
    };
    if header_len > MAX_HEADER_BYTES {
        return Err(fmt(
            "header length",
            format!("{header_len} bytes is longer than the {MAX_HEADER_BYTES} accepted"),
        ));
    }
    let start = 8 + len_bytes;
    let offset = (start + header_len) as u64;
    if file_len < offset {
        return Err(fmt(
            "header",
            format!(
                "the header should end at byte {offset} but the file holds {file_len} bytes (truncated?)"
            ),
        ));
    }
    let text = reader.read(start as u64, header_len, || "the header".into())?;
    let text = if utf8 {
        std::str::from_utf8(text).map_err(|e| {
            fmt(
                "header",
                format!("not UTF-8 at byte {}", start + e.valid_up_to()),
            )
        })?
    } else {
        if let Some(i) = text.iter().position(|b| !b.is_ascii()) {
            return Err(fmt("header", format!("not ASCII at byte {}", start + i)));
        }
        std::str::from_utf8(text).expect("ASCII")
    };
    let dict = parse_dict(text)
        .map_err(|(at, reason)| fmt("header", format!("at byte {}: {reason}", start + at)))?;
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    for (key, value) in dict {
        match (key.as_str(), value) {
            ("descr", Value::Str(s)) => descr = Some(s),
            ("descr", _) => {
                return Err(fmt(
                    "header descr",
                    "structured (record) dtypes are not supported: give a plain numeric array"
                        .into(),
                ))
            }
            ("fortran_order", Value::Bool(b)) => fortran = Some(b),
            ("shape", Value::Tuple(dims)) => shape = Some(dims),
            (k, _) => {
                return Err(fmt(
                    &format!("header {k}"),
                    "unexpected key or value type".into(),
                ))
            }
        }
    }
    let descr = descr.ok_or_else(|| fmt("header", "no 'descr' key".into()))?;
    let fortran = fortran.ok_or_else(|| fmt("header", "no 'fortran_order' key".into()))?;
    let shape = shape.ok_or_else(|| fmt("header", "no 'shape' key".into()))?;
    let elem = parse_descr(&descr).map_err(|r| fmt("header descr", format!("{descr:?}: {r}")))?;
    if fortran && shape.len() > 1 {
        return Err(fmt(
            "header fortran_order",
            "the array is in Fortran (column-major) order; only C order is supported \
             (save it with np.ascontiguousarray(a))"
                .into(),
        ));
    }
    let info = ArrayInfo {
        file: path.to_path_buf(),
        name: name.to_string(),
        offset,
        elem,
        shape,
    };
    let need = info.data_bytes()?;
    let have = file_len - offset;
    if have != need {
        return Err(fmt(
            "data",
            format!(
                "the header declares shape {:?} of {} ({need} bytes) but the file holds {have} bytes after the header{}",
                info.shape,
                elem.name(),
                if have < need { " (truncated?)" } else { "" }
            ),
        ));
    }
    Ok(info)
}

/// The element type of a `descr` string such as `<u2`.
fn parse_descr(d: &str) -> Result<Elem, String> {
    let b = d.as_bytes();
    if b.len() < 3 {
        return Err("not a dtype string like '<u2'".into());
    }
    let elem = match d.get(1..).unwrap_or("") {
        "b1" => Elem::Bool,
        "u1" => Elem::U8,
        "i1" => Elem::I8,
        "u2" => Elem::U16,
        "i2" => Elem::I16,
        "u4" => Elem::U32,
        "i4" => Elem::I32,
        "u8" => Elem::U64,
        "i8" => Elem::I64,
        "f4" => Elem::F32,
        "f8" => Elem::F64,
        _ => {
            return Err(
                "unsupported dtype (bool, int8..int64, uint8..uint64, float32 and float64 are)"
                    .into(),
            )
        }
    };
    match b[0] {
        b'<' | b'|' => Ok(elem),
        b'=' if cfg!(target_endian = "little") => Ok(elem),
        b'>' | b'=' if elem.size() == 1 => Ok(elem),
        b'>' => Err(
            "big-endian data is not supported (save it with a.astype(a.dtype.newbyteorder('<')))"
                .into(),
        ),
        _ => Err("not a dtype string like '<u2'".into()),
    }
}

/// A value of the header dict.
#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    Other,
}

/// Parses the Python dict literal of a header into (key, value) pairs; errors give the byte
/// offset in `text` and the reason.
fn parse_dict(text: &str) -> Result<Vec<(String, Value)>, (usize, String)> {
    let b = text.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let expect = |i: &mut usize, c: u8| -> Result<(), (usize, String)> {
        if *i < b.len() && b[*i] == c {
            *i += 1;
            Ok(())
        } else {
            Err((*i, format!("expected '{}'", c as char)))
        }
    };
    let string = |i: &mut usize| -> Result<String, (usize, String)> {
        let q = *b
            .get(*i)
            .ok_or((*i, "expected a string, found the end".to_string()))?;
        if q != b'\'' && q != b'"' {
            return Err((*i, "expected a quoted string".into()));
        }
        let start = *i + 1;
        let end = b[start..]
            .iter()
            .position(|&c| c == q)
            .ok_or((*i, "unterminated string".to_string()))?;
        *i = start + end + 1;
        Ok(text[start..start + end].to_string())
    };
    ws(&mut i);
    expect(&mut i, b'{')?;
    let mut out = Vec::new();
    loop {
        ws(&mut i);
        if i < b.len() && b[i] == b'}' {
            i += 1;
            break;
        }
        let key = string(&mut i)?;
        ws(&mut i);
        expect(&mut i, b':')?;
        ws(&mut i);
        let value = match b.get(i) {
            Some(b'\'') | Some(b'"') => Value::Str(string(&mut i)?),
            Some(b'(') => {
                i += 1;
                let mut dims = Vec::new();
                loop {
                    ws(&mut i);
                    if i < b.len() && b[i] == b')' {
                        i += 1;
                        break;
                    }
                    let s = i;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    if s == i {
                        return Err((i, "expected a dimension (a non-negative integer)".into()));
                    }
                    let d: usize = text[s..i]
                        .parse()
                        .map_err(|_| (s, "the dimension is too large".to_string()))?;
                    dims.push(d);
                    if i < b.len() && b[i] == b'L' {
                        i += 1;
                    }
                    ws(&mut i);
                    if i < b.len() && b[i] == b',' {
                        i += 1;
                    } else if !(i < b.len() && b[i] == b')') {
                        return Err((i, "expected ',' or ')' in the shape".into()));
                    }
                }
                Value::Tuple(dims)
            }
            _ if text[i..].starts_with("True") => {
                i += 4;
                Value::Bool(true)
            }
            _ if text[i..].starts_with("False") => {
                i += 5;
                Value::Bool(false)
            }
            Some(b'[') => {
                // A structured dtype's descr: skip to the matching bracket.
                let mut depth = 0usize;
                while i < b.len() {
                    match b[i] {
                        b'[' => depth += 1,
                        b']' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                Value::Other
            }
            _ => return Err((i, "expected a string, a tuple, True or False".into())),
        };
        out.push((key, value));
        ws(&mut i);
        if i < b.len() && b[i] == b',' {
            i += 1;
        } else if !(i < b.len() && b[i] == b'}') {
            return Err((i, "expected ',' or '}'".into()));
        }
    }
    ws(&mut i);
    if i != b.len() {
        return Err((i, "unexpected text after the dict".into()));
    }
    Ok(out)
}

/// The bytes of a `.npy` file (version 1.0) holding `data` (little-endian elements already
/// encoded) of `descr` and `shape`: for tests and for tools that write arrays.
pub fn encode(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend([1, 0]);
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_dict_as_numpy_writes_it_parses_to_its_three_keys() {
        let d =
            parse_dict("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }   \n").unwrap();
        assert_eq!(
            d,
            vec![
                ("descr".into(), Value::Str("<u2".into())),
                ("fortran_order".into(), Value::Bool(false)),
                ("shape".into(), Value::Tuple(vec![3, 4])),
            ]
        );
        let d = parse_dict("{'shape': (), 'descr': '|u1', 'fortran_order': True}").unwrap();
        assert_eq!(d[0].1, Value::Tuple(vec![]));
        assert!(parse_dict("{'shape': (3,,)}").is_err());
        assert!(parse_dict("{'shape': (-3,)}").is_err());
        assert!(parse_dict("{'shape': (3,)").is_err());
    }

    #[test]
    fn descr_strings_map_to_element_types_and_big_endian_is_refused() {
        assert_eq!(parse_descr("<u2"), Ok(Elem::U16));
        assert_eq!(parse_descr("|u1"), Ok(Elem::U8));
        assert_eq!(parse_descr("<f8"), Ok(Elem::F64));
        assert!(parse_descr(">i4").unwrap_err().contains("big-endian"));
        assert!(parse_descr("<f2").unwrap_err().contains("unsupported"));
        assert!(parse_descr("<U10").is_err());
    }
}
