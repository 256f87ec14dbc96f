//! The `id,lower,upper,size` CSV format that MiniMalloc's and idealloc's benchmarks use.
//!
//! Reading is strict and every complaint names the line: a missing column, a field that is not a
//! non-negative integer, an empty lifetime (`upper <= lower`), a repeated id, a row with the wrong
//! number of fields. Extra columns (a solution's `offset`, say) are ignored, columns may come in
//! any order, blank lines are skipped, and `\r\n` line ends are accepted.

use super::{Buffer, DsaError, Problem, Solution};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Column names accepted for each field (the first is the canonical one).
const ID: &[&str] = &["id"];
const LOWER: &[&str] = &["lower", "begin", "start"];
const UPPER: &[&str] = &["upper", "end"];
const SIZE: &[&str] = &["size"];

/// Parses a problem from CSV text with a header naming `id`, `lower`, `upper` and `size`.
///
/// The returned problem has alignment 1 (the benchmarks' convention); set
/// [`Problem::alignment`] afterwards for anything else.
pub fn read_csv(text: &str) -> Result<Problem, DsaError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
    let (header_line, header) = loop {
        match lines.next() {
            None => return Err(DsaError::CsvEmpty),
            Some((_, l)) if l.trim().is_empty() => continue,
            Some(found) => break found,
        }
    };
    let names: Vec<String> = header
        .split(',')
        .map(|f| f.trim().to_ascii_lowercase())
        .collect();
    let column = |aliases: &[&'static str]| -> Result<usize, DsaError> {
        let found: Vec<usize> = (0..names.len())
            .filter(|&i| aliases.contains(&names[i].as_str()))
            .collect();
        match found.as_slice() {
            [i] => Ok(*i),
            [] => Err(DsaError::CsvMissingColumn {
                line: header_line,
                column: aliases[0],
                header: header.to_string(),
            }),
            _ => Err(DsaError::Csv {
                line: header_line,
                message: format!(
                    "column `{}` appears more than once in the header",
                    aliases[0]
                ),
            }),
        }
    };
    let cols = [column(ID)?, column(LOWER)?, column(UPPER)?, column(SIZE)?];
    let col_names = ["id", "lower", "upper", "size"];

    let mut buffers = Vec::new();
    let mut first_line_of_id: BTreeMap<u64, usize> = BTreeMap::new();
    for (line, text) in lines {
        if text.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return Err(DsaError::Csv {
                line,
                message: format!(
                    "expected {} fields as in the header, found {}",
                    names.len(),
                    fields.len()
                ),
            });
        }
        let mut v = [0u64; 4];
        for k in 0..4 {
            let raw = fields[cols[k]];
            v[k] = raw.parse::<u64>().map_err(|_| DsaError::CsvNotInteger {
                line,
                column: col_names[k],
                value: raw.to_string(),
            })?;
        }
        let [id, lower, upper, size] = v;
        if upper <= lower {
            return Err(DsaError::CsvEmptyLifetime {
                line,
                id,
                lower,
                upper,
            });
        }
        if let Some(&first) = first_line_of_id.get(&id) {
            return Err(DsaError::CsvDuplicateId {
                line,
                id,
                first_line: first,
            });
        }
        first_line_of_id.insert(id, line);
        buffers.push(Buffer {
            id,
            lower,
            upper,
            size,
        });
    }
    Ok(Problem {
        buffers,
        alignment: 1,
    })
}

/// Writes a solution as CSV: `id,lower,upper,size,offset`, one row per buffer, in problem order.
///
/// `s.offsets` must have one entry per buffer (as every solution from [`super::solve`] does);
/// rows without an offset are written with an empty offset field rather than panicking.
pub fn write_csv(p: &Problem, s: &Solution) -> String {
    let mut out = String::with_capacity(32 * (p.buffers.len() + 1));
    out.push_str("id,lower,upper,size,offset\n");
    for (i, b) in p.buffers.iter().enumerate() {
        let _ = write!(out, "{},{},{},{},", b.id, b.lower, b.upper, b.size);
        if let Some(o) = s.offsets.get(i) {
            let _ = write!(out, "{o}");
        }
        out.push('\n');
    }
    out
}
