//! The values of an executable's constant leaves: state the step reads and never changes
//! (an imported model's exporter-made constants: a folded mask, a position table), which a
//! step started from a seed or from `--init` cannot make. An executable is "exactly what
//! runs", so it carries them: in the payload, base64-encoded, each checked against its leaf's
//! layout when the file is read, and written into its leaf when a session loads the step.

use super::layout::Layout;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// One constant leaf's value: little-endian elements of the leaf's own type (its
/// [`Layout`]'s dtype and shape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constant {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// A [`Constant`] as the payload holds it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Record {
    name: String,
    /// The bytes, base64 (RFC 4648, padded).
    data: String,
}

pub(super) fn encode(constants: &[Constant]) -> Vec<Record> {
    constants
        .iter()
        .map(|c| Record {
            name: c.name.clone(),
            data: STANDARD.encode(&c.bytes),
        })
        .collect()
}

pub(super) fn decode(records: Vec<Record>) -> Result<Vec<Constant>, String> {
    records
        .into_iter()
        .map(|r| {
            let bytes = STANDARD.decode(r.data.as_bytes()).map_err(|e| {
                format!(
                    "the value of constant {} is not base64: {e}",
                    crate::printable::printable(&r.name)
                )
            })?;
            Ok(Constant {
                name: r.name,
                bytes,
            })
        })
        .collect()
}

/// Every constant names a distinct state leaf and holds exactly its bytes.
pub(super) fn check(layouts: &[Layout], constants: &[Constant]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for c in constants {
        let name = crate::printable::printable(&c.name);
        let Some(l) = layouts.iter().find(|l| l.name == c.name) else {
            return Err(format!("constant {name} names no leaf of the step"));
        };
        if l.kind != "state" {
            return Err(format!(
                "constant {name} names a {} leaf; only state leaves (which the step never \
                 writes) can be constants",
                l.kind
            ));
        }
        if c.bytes.len() != l.bytes {
            return Err(format!(
                "constant {name} holds {} bytes, but its leaf is {} {:?} ({} bytes)",
                c.bytes.len(),
                l.dtype,
                l.shape,
                l.bytes
            ));
        }
        if !seen.insert(c.name.as_str()) {
            return Err(format!("constant {name} is given twice"));
        }
    }
    Ok(())
}
