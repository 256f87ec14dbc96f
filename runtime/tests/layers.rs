//! The runtime, the trainer and the command line are layers, and the arrows point down:
//! the runtime runs an `Executable` and nothing else, so it reads only the compiler's modules
//! that describe one (`ir`, `plan`, `lower`, `exe`) and never names the trainer or the command
//! line; the trainer never names the command line.
//!
//! Cargo already refuses a dependency cycle; this test catches what Cargo cannot: a runtime
//! module reaching into the compiler's tracing, models or autodiff (which would make running a
//! step depend on how it was built), and a dev-dependency that quietly turns an arrow round.
//! It scans every source file under `runtime/src` and `trainer/src`, comments left out, and
//! fails naming the file and line of each offending path, `use` groups over several lines
//! included. A module's `#[cfg(test)]` tail is exempt: a unit test may compile a real model to
//! get a realistic step.

use std::path::{Path, PathBuf};

/// The compiler's modules the runtime may use: what an `Executable` is made of.
const RUNTIME_MAY_USE: &[&str] = &[
    "ir", "plan", "lower", "exe",
    // Writing a file atomically (the PTX cache, saved tensors): the one helper the compiler
    // already has, and no stage.
    "files",
];

/// Uses outside [`RUNTIME_MAY_USE`] that are known and accepted, each with its reason:
/// `(file under runtime/src, path after ingot_compiler::)`.
const RUNTIME_EXCEPTIONS: &[(&str, &str)] = &[
    // The rows of a sharded optimizer's leaves are a rule of the compiler's sharding pass
    // (`autodiff::shard::whole_type`); the ranks read it through one wrapper
    // (`collective::ranks::whole_type`) until the rule moves into `exe`, where the runtime
    // may read it.
    ("collective/ranks.rs", "autodiff::shard"),
];

/// A source text with every comment blanked out (newlines kept, so line numbers hold), and
/// string literals left alone.
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_str, mut depth) = (false, 0usize);
    while let Some(c) = chars.next() {
        if depth > 0 {
            if c == '*' && chars.peek() == Some(&'/') {
                chars.next();
                depth -= 1;
                out.push_str("  ");
            } else if c == '/' && chars.peek() == Some(&'*') {
                chars.next();
                depth += 1;
                out.push_str("  ");
            } else {
                out.push(if c == '\n' { '\n' } else { ' ' });
            }
            continue;
        }
        if in_str {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_str = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                depth = 1;
                out.push_str("  ");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The part of a file before its `#[cfg(test)]` tail.
fn before_tests(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with("#[cfg(test)]") {
            return &text[..at];
        }
        at += line.len();
    }
    text
}

/// The 1-based line of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// Whether the byte before `at` can end an identifier (so `my_crate::` is not `crate::`).
fn inside_a_word(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The byte offsets where `text` names crate `krate` as a whole word.
fn mentions(text: &str, krate: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(krate) {
        let at = from + i;
        from = at + krate.len();
        let word_goes_on = text[from..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
        if !inside_a_word(text, at) && !word_goes_on {
            out.push(at);
        }
    }
    out
}

/// Every path `text` names under crate `krate`, as `(line, path after krate::)`: each item of
/// a `krate::{..}` group (nested groups and lines included) on the line it starts, its path
/// cut at the first group or `as`. The crate named alone (`use krate;`, `krate as k`) is
/// `(line, "")`: an alias would hide every later path.
fn paths_under(text: &str, krate: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for at in mentions(text, krate) {
        let from = at + krate.len();
        match text[from..].strip_prefix("::") {
            Some(rest) => group_items(text, from + 2, rest, "", &mut out),
            None => out.push((line_of(text, at), String::new())),
        }
    }
    out
}

/// The paths of one use-tree item starting at byte `start` of `text` (`rest` is
/// `&text[start..]`), each prefixed by `prefix`.
fn group_items(text: &str, start: usize, rest: &str, prefix: &str, out: &mut Vec<(usize, String)>) {
    let skip = rest.len() - rest.trim_start().len();
    let (start, rest) = (start + skip, rest.trim_start());
    if let Some(inner) = rest.strip_prefix('{') {
        let mut depth = 1;
        let mut item_start = 0;
        for (j, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' | ',' if depth == 1 => {
                    let item = &inner[item_start..j];
                    if !item.trim().is_empty() {
                        group_items(text, start + 1 + item_start, item, prefix, out);
                    }
                    item_start = j + 1;
                    if c == '}' {
                        return;
                    }
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        return;
    }
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    let path = rest[..end].trim_end_matches(':');
    let whole = match (prefix, path) {
        (p, "self") => p.trim_end_matches("::").to_string(),
        (p, path) => format!("{p}{path}"),
    };
    if rest[end..].trim_start().starts_with('{') && rest[..end].ends_with("::") {
        let next = &rest[end..];
        return group_items(text, start + end, next, &format!("{whole}::"), out);
    }
    out.push((line_of(text, start), whole));
}

/// What is wrong with one runtime file's uses of the compiler, as `file:line: ...`.
fn runtime_violations(file: &str, text: &str) -> Vec<String> {
    let code = without_comments(text);
    let code = before_tests(&code);
    let mut out = Vec::new();
    for (line, path) in paths_under(code, "ingot_compiler") {
        let module = path.split("::").next().unwrap_or("");
        if RUNTIME_MAY_USE.contains(&module) {
            continue;
        }
        if RUNTIME_EXCEPTIONS
            .iter()
            .any(|(f, p)| file.ends_with(f) && (path == *p || path.starts_with(&format!("{p}::"))))
        {
            continue;
        }
        out.push(match path.as_str() {
            "" => format!("runtime/src/{file}:{line}: names `ingot_compiler` without a module"),
            _ => format!(
                "runtime/src/{file}:{line}: uses `ingot_compiler::{path}`; the runtime may use \
                 only {RUNTIME_MAY_USE:?} of the compiler"
            ),
        });
    }
    out
}

/// Each use of a crate above `layer` in one of its files, as `file:line: ...`.
fn upward_violations(layer: &str, file: &str, text: &str, above: &[&str]) -> Vec<String> {
    let code = without_comments(text);
    let mut out = Vec::new();
    for krate in above {
        for at in mentions(&code, krate) {
            let line = line_of(&code, at);
            out.push(format!(
                "{layer}/src/{file}:{line}: names `{krate}`, a layer above {layer}"
            ));
        }
    }
    out
}

/// The packages a Cargo.toml names as dependencies of any kind, in order.
fn dependencies(toml: &str) -> Vec<String> {
    names_under(toml, |table| table.ends_with("dependencies"))
}

/// The names under `[dev-dependencies]` alone.
fn dev_dependencies(toml: &str) -> Vec<String> {
    names_under(toml, |table| table == "dev-dependencies")
}

/// The keys (package names) of the Cargo.toml tables whose header `wanted` accepts, in order;
/// a dotted key (`name.workspace = true`) counts by its first part.
fn names_under(toml: &str, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = wanted(line.trim_matches(['[', ']']));
            continue;
        }
        if inside && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once(['=', '.']) {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

#[path = "../../compiler/tests/support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;

/// Every source file of `crate_dir/src`, as (path relative to src, text).
fn sources(crate_dir: &Path) -> Vec<(String, String)> {
    let src = crate_dir.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect()
}

fn runtime_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn trainer_dir() -> PathBuf {
    runtime_dir().join("../trainer")
}

#[test]
fn the_runtime_uses_only_the_compilers_ir_plan_lower_and_exe() {
    let files = sources(&runtime_dir());
    assert!(files.len() > 20, "found only {} files", files.len());
    let bad: Vec<String> = files
        .iter()
        .flat_map(|(f, t)| runtime_violations(f, t))
        .collect();
    assert!(
        bad.is_empty(),
        "the runtime reaches into the compiler:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_runtime_never_names_the_trainer_or_the_command_line_nor_the_trainer_the_command_line() {
    let mut bad = Vec::new();
    for (f, t) in sources(&runtime_dir()) {
        bad.extend(upward_violations(
            "runtime",
            &f,
            &t,
            &["ingot_trainer", "ingot_cli"],
        ));
    }
    let trainer = sources(&trainer_dir());
    assert!(
        trainer.len() > 10,
        "found only {} trainer files",
        trainer.len()
    );
    for (f, t) in trainer {
        bad.extend(upward_violations("trainer", &f, &t, &["ingot_cli"]));
    }
    for (dir, above) in [
        (
            runtime_dir(),
            &["ingot-trainer", "ingot", "ingot-testkit"][..],
        ),
        (trainer_dir(), &["ingot", "ingot-testkit"][..]),
    ] {
        let toml = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        // The test kit is dev-only (`publish = false`): the trainer's own tests may share its
        // step loops; its code may not.
        let dev = dev_dependencies(&toml);
        let all = dependencies(&toml);
        for dep in &all {
            // Named only under [dev-dependencies] (each name once a section).
            let dev_only = dev.contains(dep) && all.iter().filter(|d| *d == dep).count() == 1;
            let dev_kit = dep == "ingot-testkit" && dir == trainer_dir() && dev_only;
            if above.contains(&dep.as_str()) && !dev_kit {
                bad.push(format!(
                    "{}/Cargo.toml: depends on `{dep}`, a layer above",
                    dir.display()
                ));
            }
        }
    }
    assert!(bad.is_empty(), "upward references:\n{}", bad.join("\n"));
}

#[test]
fn the_scan_names_the_file_and_line_of_each_item_of_a_use_group_over_several_lines() {
    let text = "use ingot_compiler::{\n    ir::Graph,\n    models::{Model, by_name},\n    plan::{self, MemoryPlan},\n};\n";
    assert_eq!(
        runtime_violations("cpu/x.rs", text),
        vec![
            "runtime/src/cpu/x.rs:3: uses `ingot_compiler::models::Model`; the runtime may use \
             only [\"ir\", \"plan\", \"lower\", \"exe\", \"files\"] of the compiler",
            "runtime/src/cpu/x.rs:3: uses `ingot_compiler::models::by_name`; the runtime may use \
             only [\"ir\", \"plan\", \"lower\", \"exe\", \"files\"] of the compiler",
        ]
    );
}

#[test]
fn the_scan_catches_a_path_in_code_an_alias_and_a_nested_group_but_not_a_comment() {
    let text = "//! see ingot_compiler::models\nuse ingot_compiler as c;\nfn f() {\n    /* ingot_compiler::trace */ ingot_compiler::pipeline::compile();\n    let s = \"ingot_compiler::x\";\n}\nuse ingot_compiler::{autodiff::{shard, copies}};\n";
    let bad = runtime_violations("cuda/y.rs", text);
    let lines: Vec<&str> = bad.iter().map(|b| b.split(": ").next().unwrap()).collect();
    assert_eq!(
        lines,
        [
            "runtime/src/cuda/y.rs:2",
            "runtime/src/cuda/y.rs:4",
            "runtime/src/cuda/y.rs:5",
            "runtime/src/cuda/y.rs:7",
            "runtime/src/cuda/y.rs:7",
        ],
        "{bad:#?}"
    );
    assert!(
        bad[1].contains("`ingot_compiler::pipeline::compile`"),
        "{}",
        bad[1]
    );
    assert!(
        bad[3].contains("`ingot_compiler::autodiff::shard`"),
        "{}",
        bad[3]
    );
}

#[test]
fn the_scan_accepts_the_listed_exception_only_in_its_file_and_leaves_unit_tests_alone() {
    let text = "use ingot_compiler::autodiff::shard;\n#[cfg(test)]\nmod tests { use ingot_compiler::models; }\n";
    assert!(runtime_violations("collective/ranks.rs", text).is_empty());
    assert_eq!(runtime_violations("cpu/planned.rs", text).len(), 1);
}

#[test]
fn the_scan_names_an_upward_crate_and_an_upward_dependency() {
    let bad = upward_violations(
        "trainer",
        "session.rs",
        "use ingot_runtime::cpu;\n\nuse ingot_cli::{\n    out,\n};\nlet my_ingot_cli = 1;\n",
        &["ingot_cli"],
    );
    assert_eq!(
        bad,
        ["trainer/src/session.rs:3: names `ingot_cli`, a layer above trainer"]
    );
    let toml = "[package]\nname = \"x\"\n[dependencies]\ningot-runtime.workspace = true\n[dev-dependencies]\ningot = { path = \"../cli\" }\n";
    assert_eq!(dependencies(toml), ["ingot-runtime", "ingot"]);
}
