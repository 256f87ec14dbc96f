//! Compiling a step's CUDA C with NVRTC once: the PTX is cached in memory and on disk, keyed by
//! a hash of the source, the compiler options and NVRTC's version, so loading the same step
//! again (or another step sharing the module) skips the compiler.
//!
//! The disk cache lives in `$INGOT_CACHE_DIR`, else `$XDG_CACHE_HOME/ingot/ptx`, else
//! `$HOME/.cache/ingot/ptx`. Each file starts with a comment line naming its key; a file whose
//! first line does not match (truncated, edited, another key) is ignored and rewritten. A cache
//! that cannot be written is not an error: the PTX is then only kept in memory.

use crate::error::ExecError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Where the PTX of one compilation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Memory,
    Disk,
    Compiled,
}

/// A 64-bit FNV-1a hash of `parts`, each followed by a 0 byte (so part boundaries count).
pub fn key(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.as_bytes().iter().chain(std::iter::once(&0u8)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The first line of a cache file holding the PTX of `key`.
pub fn header(key: u64) -> String {
    format!("// ingot ptx cache {key:016x}\n")
}

/// The PTX in a cache file's text, if the file is whole and belongs to `key`.
pub fn parse_cached(text: &str, key: u64) -> Option<&str> {
    let ptx = text.strip_prefix(&header(key))?;
    // NVRTC's PTX always declares its version and target; a truncated file loses its end, so
    // also require the end marker this module writes.
    let ptx = ptx.strip_suffix(END)?;
    ptx.contains(".version").then_some(ptx)
}

const END: &str = "\n// end of ingot ptx\n";

/// The disk cache directory, from the environment.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("INGOT_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("ingot").join("ptx")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("ingot").join("ptx")))
}

fn memory() -> &'static Mutex<HashMap<u64, String>> {
    static CACHE: OnceLock<Mutex<HashMap<u64, String>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// NVRTC's version, as "major.minor".
pub fn nvrtc_version() -> Result<String, ExecError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the two out-pointers are valid for writes.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(ExecError::Device {
            what: "NVRTC".into(),
            reason: format!("nvrtcVersion failed: {r:?}"),
        });
    }
    Ok(format!("{major}.{minor}"))
}

/// The PTX of `source` compiled with `options`, from the cache when it holds it.
pub fn compile(source: &str, options: &[String]) -> Result<(String, Source), ExecError> {
    let version = nvrtc_version()?;
    let mut parts: Vec<&str> = vec![source, &version];
    parts.extend(options.iter().map(String::as_str));
    let k = key(&parts);
    if let Some(ptx) = memory().lock().ok().and_then(|m| m.get(&k).cloned()) {
        return Ok((ptx, Source::Memory));
    }
    let file = cache_dir().map(|d| d.join(format!("{k:016x}.ptx")));
    if let Some(f) = &file {
        if let Ok(text) = std::fs::read_to_string(f) {
            if let Some(ptx) = parse_cached(&text, k) {
                let ptx = ptx.to_string();
                if let Ok(mut m) = memory().lock() {
                    m.insert(k, ptx.clone());
                }
                return Ok((ptx, Source::Disk));
            }
        }
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: options.to_vec(),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| ExecError::Device {
            what: "compiling the step's kernels with NVRTC".into(),
            reason: compile_error_text(&e),
        })?
        .to_src();
    if let Some(f) = &file {
        // Written to a temporary name, then renamed, so a reader never sees half a file.
        let write = || -> std::io::Result<()> {
            if let Some(d) = f.parent() {
                std::fs::create_dir_all(d)?;
            }
            ingot_compiler::files::write_atomically(
                f,
                format!("{}{ptx}{END}", header(k)).as_bytes(),
            )
        };
        let _ = write();
    }
    if let Ok(mut m) = memory().lock() {
        m.insert(k, ptx.clone());
    }
    Ok((ptx, Source::Compiled))
}

/// NVRTC's log, which names the line and the problem, instead of the raw debug print.
fn compile_error_text(e: &cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            format!("{nvrtc:?}: {}", log.to_string_lossy())
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_depends_on_every_part_and_on_where_parts_split() {
        let a = key(&["src", "13.0", "--x"]);
        assert_eq!(a, key(&["src", "13.0", "--x"]));
        assert_ne!(a, key(&["src", "13.0", "--y"]));
        assert_ne!(a, key(&["src", "13.1", "--x"]));
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
    }

    #[test]
    fn a_cache_file_is_used_only_whole_and_under_its_own_key() {
        let ptx = ".version 8.0\n.target sm_90\n";
        let text = format!("{}{ptx}{END}", header(7));
        assert_eq!(parse_cached(&text, 7), Some(ptx));
        assert_eq!(parse_cached(&text, 8), None, "another key");
        assert_eq!(parse_cached(&text[..text.len() - 3], 7), None, "truncated");
        assert_eq!(parse_cached(&format!("{}garbage{END}", header(7)), 7), None);
        assert_eq!(parse_cached("", 7), None);
    }
}
