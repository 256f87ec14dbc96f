//! The compiler's folders follow its pipeline: a module may use the stages before it, never a
//! later one, so each stage can be read (and tested) knowing only what comes before it.
//!
//! This test scans every source file under `compiler/src` for `crate::<module>` paths and fails
//! naming the file and line of each one that reaches a later stage. A module's `#[cfg(test)]`
//! tail is exempt: a unit test may drive the whole pipeline to get a realistic input.

use std::path::Path;

/// The pipeline's stages, in the order data flows through them.
const STAGES: &[&str] = &[
    "ir",
    "flops",
    "trace",
    "recognize",
    "precision",
    "align",
    "autodiff",
    "model",
    "rewrite",
    "layout",
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

/// The top-level modules `text` names through `crate::` (`crate::a::..`, `crate::{a, b}`), each
/// with the 1-based line it is named on: the item's own line inside a `use` group spread over
/// several lines. Capitalised names are items the crate root re-exports (`crate::IrError`),
/// not modules.
fn modules_named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("crate::") {
        let start = from + i + "crate::".len();
        from = start;
        let rest = &text[start..];
        let names: Vec<(usize, &str)> = if rest.starts_with('{') {
            group_heads(text, start)
        } else {
            vec![(start, first_segment(rest))]
        };
        out.extend(
            names
                .into_iter()
                .filter(|(_, n)| n.starts_with(|c: char| c.is_ascii_lowercase()))
                .map(|(at, n)| (text[..at].matches('\n').count() + 1, n.to_string())),
        );
    }
    out
}

/// The identifier `rest` starts with.
fn first_segment(rest: &str) -> &str {
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The first segment of each item of the `{..}` group opening at byte `open` of `text`, with
/// the byte where the item starts; nested groups belong to their item. An unclosed group ends
/// with the text.
fn group_heads(text: &str, open: usize) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut item = None;
    for (j, c) in text[open..].char_indices() {
        let at = open + j;
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    item = Some(at + 1);
                }
            }
            '}' | ',' if depth == 1 => {
                if let Some(s) = item.take() {
                    let skip = text[s..at].len() - text[s..at].trim_start().len();
                    out.push((s + skip, first_segment(&text[s + skip..at])));
                }
                if c == '}' {
                    break;
                }
                item = Some(at + 1);
            }
            '}' => depth -= 1,
            _ => {}
        }
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
    let code = before_tests(text);
    let mut out = Vec::new();
    for (line, used) in modules_named(code) {
        match rank(&used) {
            None => out.push(format!(
                "{file}:{line}: `{used}` is in no list of tests/stage_order.rs"
            )),
            Some(r) if r > own => out.push(format!(
                "{file}:{line}: `{module}` uses the later `crate::{used}`"
            )),
            Some(_) => {}
        }
    }
    out
}

/// The part of a file before its `#[cfg(test)]` tail (the line that starts with it).
fn before_tests(text: &str) -> &str {
    let lines = text.split_inclusive('\n');
    let kept = lines.take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"));
    &text[..kept.map(str::len).sum::<usize>()]
}

/// Whether `path` is unit tests in a file of their own: a module its parent (the folder's
/// `mod.rs`, or the file named as the folder) declares only under `#[cfg(test)]` (`mod tests;`,
/// `mod conv_tests;`). Exempt, as a `#[cfg(test)]` tail is.
fn is_unit_test_file(path: &Path) -> bool {
    let (Some(dir), Some(stem)) = (path.parent(), path.file_stem().and_then(|s| s.to_str())) else {
        return false;
    };
    let declaration = format!("#[cfg(test)]\nmod {stem};");
    [dir.join("mod.rs"), dir.with_extension("rs")]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(&declaration)))
}

#[path = "support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;

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
        if module == "lib" || is_unit_test_file(path) {
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

#[test]
fn the_scan_reads_a_use_group_over_several_lines_and_names_the_items_line() {
    let text =
        "use crate::{\n    error::IrError,\n    ir::{Graph, NodeId},\n    plan::Location,\n};\n";
    assert_eq!(
        violations("compiler/src/fuse/mod.rs", "fuse", text),
        vec!["compiler/src/fuse/mod.rs:4: `fuse` uses the later `crate::plan`"]
    );
}

#[test]
fn the_scan_reads_nested_groups_by_their_first_segment_only() {
    let text = "use crate::{ir::{Graph, plan}, lower::{cpu, cuda::{x, y}}};\n";
    assert_eq!(
        violations("compiler/src/plan/mod.rs", "plan", text),
        vec!["compiler/src/plan/mod.rs:1: `plan` uses the later `crate::lower`"]
    );
}

#[test]
fn a_tests_file_is_exempt_only_where_its_parent_declares_it_under_cfg_test() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(is_unit_test_file(&src.join("lower/cuda/tests.rs")));
    assert!(is_unit_test_file(&src.join("lower/cuda/conv_tests.rs")));
    assert!(is_unit_test_file(&src.join("rewrite/tests.rs")));
    assert!(!is_unit_test_file(&src.join("lower/cuda/lowering.rs")));
    assert!(!is_unit_test_file(&src.join("fuse/tests.rs")));
}
