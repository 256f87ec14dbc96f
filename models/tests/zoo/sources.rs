//! The zoo's files are also compiled as a module of the compiler, for its unit tests
//! (`compiler/src/lib.rs`), where `crate::` would name the compiler: they must not write it.

use std::path::Path;

/// Each `file:line` of the `.rs` files under `dir` that writes `crate::`.
fn crate_paths(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(crate_paths(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                if line.contains("crate::") {
                    out.push(format!("{}:{}", path.display(), i + 1));
                }
            }
        }
    }
    out
}

#[test]
fn no_file_of_the_zoo_writes_crate_paths() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(
        src.join("spec.rs").exists(),
        "the zoo's sources are at {src:?}"
    );
    let found = crate_paths(&src);
    assert!(
        found.is_empty(),
        "write `super::` or `ingot_compiler::` instead of `crate::` (the compiler's unit tests \
         compile these files as its module `models`):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_a_crate_path() {
    let dir = std::env::temp_dir().join(format!("ingot-zoo-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.rs"), "use super::x;\nuse crate::ir::Graph;\n").unwrap();
    let found = crate_paths(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].ends_with("a.rs:2"), "{found:?}");
}
