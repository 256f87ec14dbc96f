//! The compiler's folders follow its pipeline: a module may use the stages before it, never a
//! later one, so each stage can be read (and tested) knowing only what comes before it.
//!
//! This test scans every source file under `compiler/src` for `crate::<module>` paths and fails
//! naming the file and line of each one that reaches a later stage. A module's `#[cfg(test)]`
//! tail is exempt: a unit test may drive the whole pipeline to get a realistic input.

use std::path::{Path, PathBuf};

/// The pipeline's stages, in the order data flows through them.
const STAGES: &[&str] = &[
    "ir",
    "flops",
    "trace",
    "models",
    "recognize",
    "precision",
    "autodiff",
    "rewrite",
    "fuse",
    "schedule",
    "plan",
    "report",
    "lower",
    "exe",
    "pipeline",
    "fit",
];
/// Helpers every stage may use; they use no stage themselves.
const BASE: &[&str] = &["error", "files", "printable"];
/// Drivers and test tools built on the whole pipeline; no stage may use them.
const TOOLS: &[&str] = &["random_graph", "snapshot"];

/// Where a top-level module sits: base helpers first, then the stages, then the tools.
fn rank(module: &str) -> Option<usize> {
    if BASE.contains(&module) {
        return Some(0);
    }
    if let Some(i) = STAGES.iter().position(|s| *s == module) {
        return Some(1 + i);
    }
    TOOLS.contains(&module).then_some(1 + STAGES.len())
}

/// The top-level modules a line names through `crate::` (`crate::a::..`, `crate::{a, b}`).
/// Capitalised names are items the crate root re-exports (`crate::IrError`), not modules.
fn modules_named(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|n| n.trim().split("::").next().unwrap_or("").trim())
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![&rest[..end]]
        };
        out.extend(
            names
                .into_iter()
                .filter(|n| n.starts_with(|c: char| c.is_ascii_lowercase()))
                .map(str::to_string),
        );
    }
    out
}

/// Each upward reference in one file's text, as `file:line: <module> uses crate::<later>`.
/// `module` is the top-level module the file belongs to.
fn violations(file: &str, module: &str, text: &str) -> Vec<String> {
    let Some(own) = rank(module) else {
        return vec![format!(
            "{file}: module `{module}` is in no list of tests/stage_order.rs; place it"
        )];
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        for used in modules_named(line) {
            match rank(&used) {
                None => out.push(format!(
                    "{file}:{}: `{used}` is in no list of tests/stage_order.rs",
                    n + 1
                )),
                Some(r) if r > own => out.push(format!(
                    "{file}:{}: `{module}` uses the later `crate::{used}`",
                    n + 1
                )),
                Some(_) => {}
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

#[test]
fn no_compiler_module_uses_a_later_pipeline_stage() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut bad = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first);
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        bad.extend(violations(
            &format!("compiler/src/{}", rel.display()),
            module,
            &text,
        ));
    }
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn the_scan_names_the_file_and_line_of_an_upward_import() {
    let text = "use crate::ir::Graph;\nuse crate::{error, plan};\nfn f() { crate::pipeline::compile(); }\n";
    assert_eq!(
        violations("compiler/src/fuse/mod.rs", "fuse", text),
        vec![
            "compiler/src/fuse/mod.rs:2: `fuse` uses the later `crate::plan`",
            "compiler/src/fuse/mod.rs:3: `fuse` uses the later `crate::pipeline`",
        ]
    );
}

#[test]
fn the_scan_rejects_a_base_helper_using_a_stage_and_an_unplaced_module() {
    assert_eq!(
        violations("compiler/src/files.rs", "files", "use crate::ir::Graph;\n"),
        vec!["compiler/src/files.rs:1: `files` uses the later `crate::ir`"]
    );
    assert_eq!(violations("compiler/src/new.rs", "new", "").len(), 1);
}

#[test]
fn the_scan_leaves_a_modules_unit_tests_and_root_items_alone() {
    let text = "use crate::IrError;\n#[cfg(test)]\nmod tests { use crate::pipeline; }\n";
    assert!(violations("compiler/src/plan/mod.rs", "plan", text).is_empty());
}
