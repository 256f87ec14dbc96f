//! The Rust files of a source tree, for the tests that read a crate's own source (the
//! compiler's stage order, the runtime's layers). `#[path]`-included by them.

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, appended to `out` in path order.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}
