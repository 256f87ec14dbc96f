//! The commands of README.md and docs/user-guide.md, run: every fenced block marked
//! `<!-- doc-test: run -->` runs, in order, with the `ingot` program this build made, in a
//! scratch directory that sees the repository's files, and what the guide shows as each
//! command's output must be what it prints, figures included. So a change that moves a figure
//! fails here until the guide shows the new one.
//!
//! The convention (also at the top of docs/user-guide.md's source):
//!
//! - `<!-- doc-test: run -->` on the line before a fence: the block runs. Lines starting `$ `
//!   are commands (a line ending in `\`, `&&` or `|` continues on the next), and the lines up to the next
//!   `$ ` are the output the command must print (stdout and stderr together); a command with
//!   no lines after it is not compared. In a block without `$ `, every line is a command whose
//!   output the guide does not show.
//!   `cargo run --release --` and a leading `ingot` stand for this build's program.
//! - `<!-- doc-test: run exit=N -->`: the same, the block's last command exiting with N (every
//!   other command must succeed).
//! - `<!-- doc-test: skip REASON -->`: shown, not run (a GPU, a long run, files the repository
//!   does not have); the test lists these blocks with their reasons.
//! - In shown output, a line that is exactly `...` stands for any number of lines left out, and
//!   `<name>` inside a line (`<ms>`, `<rate>`: lowercase, in angle brackets) for a part that
//!   differs from run to run (a time, a rate), together with the spaces before it. Every other
//!   character must match; trailing spaces are ignored.
//!
//! A fenced block holding a command (a `$ ` line, or one starting with `cargo run`, `ingot` or
//! `torchrun`) without a mark fails the test, naming its file and line: each block says whether
//! it runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The files whose commands run.
const DOCS: [&str; 2] = ["README.md", "docs/user-guide.md"];

/// What a block's mark says.
#[derive(Clone, Debug, PartialEq)]
enum Mark {
    /// Run; the last command exits with this code.
    Run { exit: i32 },
    /// Not run, for this reason.
    Skip(String),
}

/// One fenced block of a markdown file.
#[derive(Clone, Debug)]
struct Block {
    /// `file:line` of its opening fence.
    at: String,
    /// 1-based line of its first content line.
    first_line: usize,
    mark: Option<Mark>,
    lines: Vec<String>,
}

/// One command of a block and the output the guide shows for it (`None`: not shown).
#[derive(Clone, Debug, PartialEq)]
struct Step {
    /// 1-based line of the command in its file.
    line: usize,
    command: String,
    shown: Option<Vec<String>>,
}

/// The info strings of command blocks: none, or a shell's.
const SHELL_INFO: [&str; 5] = ["", "sh", "bash", "shell", "console"];

/// The fenced blocks of `text` whose info string is empty or a shell's (command blocks;
/// `rust`, `toml`, `python`, ... blocks are code, checked elsewhere), each with the mark on
/// the line before its fence.
fn blocks(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let open = i;
        let end = (open + 1..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .ok_or_else(|| format!("{file}:{}: a fence that is never closed", open + 1))?;
        let mark = match open.checked_sub(1).map(|p| lines[p].trim()) {
            Some(prev) if prev.starts_with("<!-- doc-test:") => {
                Some(parse_mark(prev).map_err(|e| format!("{file}:{open}: {e}"))?)
            }
            _ => None,
        };
        if SHELL_INFO.contains(&info.trim()) {
            out.push(Block {
                at: format!("{file}:{}", open + 1),
                first_line: open + 2,
                mark,
                lines: lines[open + 1..end].iter().map(|l| l.to_string()).collect(),
            });
        } else if mark.is_some() {
            return Err(format!(
                "{file}:{}: a doc-test mark on a `{info}` block (only blocks without a language, or a shell's, run)",
                open + 1
            ));
        }
        i = end + 1;
    }
    Ok(out)
}

/// `<!-- doc-test: run -->`, `<!-- doc-test: run exit=N -->` or `<!-- doc-test: skip REASON -->`.
fn parse_mark(line: &str) -> Result<Mark, String> {
    let body = line
        .strip_prefix("<!-- doc-test:")
        .and_then(|r| r.strip_suffix("-->"))
        .ok_or("a doc-test mark is one line, `<!-- doc-test: ... -->`")?
        .trim();
    if let Some(reason) = body.strip_prefix("skip") {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err("`doc-test: skip` needs a reason".into());
        }
        return Ok(Mark::Skip(reason.to_string()));
    }
    match body.strip_prefix("run").map(str::trim) {
        Some("") => Ok(Mark::Run { exit: 0 }),
        Some(rest) => rest
            .strip_prefix("exit=")
            .and_then(|n| n.parse().ok())
            .map(|exit| Mark::Run { exit })
            .ok_or_else(|| format!("unknown doc-test mark `{body}`")),
        None => Err(format!(
            "unknown doc-test mark `{body}` (`run`, `run exit=N` or `skip REASON`)"
        )),
    }
}

/// Whether a block's line is a command a reader would type.
fn is_command(line: &str) -> bool {
    let l = line.trim_start();
    ["$ ", "cargo run", "ingot ", "torchrun "]
        .iter()
        .any(|p| l.starts_with(p))
}

/// A block's commands, each with its shown output (see the module docs).
fn steps(block: &Block) -> Vec<Step> {
    let transcript = block.lines.iter().any(|l| l.starts_with("$ "));
    let mut out: Vec<Step> = Vec::new();
    let mut continued = false;
    for (k, raw) in block.lines.iter().enumerate() {
        let line = block.first_line + k;
        if continued {
            let step = out.last_mut().expect("a continued command");
            step.command.push('\n');
            step.command.push_str(raw);
            continued = continues(raw);
            continue;
        }
        let command = if transcript {
            raw.strip_prefix("$ ")
        } else {
            (!raw.trim().is_empty()).then_some(raw.as_str())
        };
        match command {
            Some(c) => {
                out.push(Step {
                    line,
                    command: c.to_string(),
                    shown: transcript.then(Vec::new),
                });
                continued = continues(c);
            }
            None => {
                if let Some(Some(shown)) = out.last_mut().map(|s| s.shown.as_mut()) {
                    shown.push(raw.clone());
                }
            }
        }
    }
    out
}

/// Whether a command line goes on on the next line: it ends in a backslash, `&&` or `|`.
fn continues(line: &str) -> bool {
    let l = line.trim_end();
    l.ends_with('\\') || l.ends_with("&&") || l.ends_with('|')
}

/// `command` as the shell runs it: this build's program for `cargo run --release --` and a
/// leading `ingot`.
fn shell_command(command: &str) -> String {
    let c = command.replace("cargo run --release -- ", "\"$INGOT\" ");
    let c = match c.strip_prefix("ingot ") {
        Some(rest) => format!("\"$INGOT\" {rest}"),
        None => c,
    };
    c.replace("&& ingot ", "&& \"$INGOT\" ")
}

/// Whether `actual` is a line the guide's `shown` line stands for: `<name>` placeholders match
/// any text with a non-space character (taking the spaces before them), the rest exactly.
fn line_matches(shown: &str, actual: &str) -> bool {
    // The shown line cut at its placeholders: literal, placeholder, literal, ...
    let mut literals: Vec<String> = vec![String::new()];
    let mut rest = shown.trim_end();
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let close = after.find('>');
        let name_ok = close.is_some_and(|c| {
            c > 0
                && after[..c].starts_with(|ch: char| ch.is_ascii_lowercase())
                && after[..c].chars().all(|ch| {
                    ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_' || ch == '-'
                })
        });
        let last = literals.last_mut().unwrap();
        if let (true, Some(c)) = (name_ok, close) {
            last.push_str(rest[..open].trim_end());
            literals.push(String::new());
            rest = &after[c + 1..];
        } else {
            last.push_str(&rest[..open + 1]);
            rest = after;
        }
    }
    literals.last_mut().unwrap().push_str(rest);
    glob(&literals, actual.trim_end())
}

/// Whether `text` is `literals` joined by runs of text that each hold a non-space character.
fn glob(literals: &[String], text: &str) -> bool {
    let Some((first, rest)) = literals.split_first() else {
        return text.is_empty();
    };
    let Some(after) = text.strip_prefix(first.as_str()) else {
        return false;
    };
    if rest.is_empty() {
        return after.is_empty();
    }
    // Each way to end the placeholder here, shortest first.
    (1..=after.len())
        .filter(|&n| after.is_char_boundary(n))
        .filter(|&n| !after[..n].trim().is_empty())
        .any(|n| glob(rest, &after[n..]))
}

/// Whether `actual`'s lines are the `shown` ones, where a `...` line stands for any number of
/// lines.
fn output_matches(shown: &[String], actual: &[&str]) -> bool {
    match shown.split_first() {
        None => actual.is_empty(),
        Some((s, rest)) if s.trim() == "..." => {
            (0..=actual.len()).any(|skip| output_matches(rest, &actual[skip..]))
        }
        Some((s, rest)) => match actual.split_first() {
            Some((a, more)) => line_matches(s, a) && output_matches(rest, more),
            None => false,
        },
    }
}

/// A scratch directory that sees the repository: a link to each of its top-level entries but
/// `target`, which is a directory of its own.
fn scratch_root(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("guide_commands")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("target")).unwrap();
    for entry in std::fs::read_dir(root()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), dir.join(&name)).unwrap();
    }
    dir
}

/// What went wrong with one command, or `None`; and the seconds it took.
fn run_step(dir: &Path, step: &Step, exit: i32, at: &str) -> (Option<String>, f64) {
    let start = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        // The newline ends a `# comment` the command may have.
        .arg(format!("( {}\n) 2>&1", shell_command(&step.command)))
        .current_dir(dir)
        .env("INGOT", env!("CARGO_BIN_EXE_ingot"))
        // The guide's CPU figures are of two threads (a rate, a thread count), and the
        // commands' output goes to a pipe: plain lines, no progress bars.
        .env("INGOT_THREADS", "2")
        .output()
        .expect("sh runs");
    let seconds = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = out.status.code().unwrap_or(-1);
    let place = format!("{at} (line {}): `{}`", step.line, step.command);
    if code != exit {
        return (
            Some(format!(
                "{place} exited with {code}, the guide expects {exit}; it printed:\n{text}"
            )),
            seconds,
        );
    }
    if let Some(shown) = step.shown.as_ref().filter(|s| !s.is_empty()) {
        let actual: Vec<&str> = text.lines().collect();
        if !output_matches(shown, &actual) {
            return (
                Some(format!(
                    "{place} printed what the guide does not show.\nthe guide shows:\n{}\nit printed:\n{text}",
                    shown.join("\n")
                )),
                seconds,
            );
        }
    }
    (None, seconds)
}

/// Every block of `file` (read from the repository) and every problem with its marks.
fn marked_blocks(file: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let all = blocks(file, &text).unwrap_or_else(|e| panic!("{e}"));
    let unmarked: Vec<&str> = all
        .iter()
        .filter(|b| b.mark.is_none() && b.lines.iter().any(|l| is_command(l)))
        .map(|b| b.at.as_str())
        .collect();
    assert!(
        unmarked.is_empty(),
        "command blocks without a doc-test mark (add `<!-- doc-test: run -->` or `<!-- doc-test: skip REASON -->` on the line before the fence): {unmarked:?}"
    );
    all
}

#[test]
fn every_runnable_command_of_the_readme_and_the_guide_prints_what_they_show() {
    let dir = scratch_root("docs");
    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    let mut times = Vec::new();
    for file in DOCS {
        for block in marked_blocks(file) {
            match &block.mark {
                Some(Mark::Skip(reason)) => skipped.push(format!("{}: {reason}", block.at)),
                Some(Mark::Run { exit }) => {
                    let steps = steps(&block);
                    assert!(
                        !steps.is_empty(),
                        "{}: a run block with no command",
                        block.at
                    );
                    for (k, step) in steps.iter().enumerate() {
                        let want = if k + 1 == steps.len() { *exit } else { 0 };
                        let (problem, seconds) = run_step(&dir, step, want, &block.at);
                        times.push((seconds, format!("{}:{}", file, step.line)));
                        if let Some(p) = problem {
                            failures.push(p);
                            break;
                        }
                    }
                }
                None => {}
            }
        }
    }
    println!("not run ({}):", skipped.len());
    for s in &skipped {
        println!("  {s}");
    }
    times.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = times.iter().map(|t| t.0).sum();
    println!("{} commands in {total:.1} s; the slowest:", times.len());
    for (s, at) in times.iter().take(5) {
        println!("  {s:6.2} s  {at}");
    }
    assert!(
        failures.is_empty(),
        "{} command(s) of the docs do not print what the docs show (update the docs, or the output if the change was not meant):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The guide's block that compiles the mlp, with the first digit of its figures changed.
#[test]
fn a_guide_block_with_one_figure_changed_fails_naming_the_command_and_both_outputs() {
    let block = marked_blocks("docs/user-guide.md")
        .into_iter()
        .find(|b| {
            b.lines
                .iter()
                .any(|l| l.contains("compile --model mlp -o mlp.ingot"))
        })
        .expect("the guide compiles the mlp");
    let step = steps(&block)
        .into_iter()
        .find(|s| s.command.contains("compile --model mlp"))
        .unwrap();
    let shown = step.shown.clone().unwrap();
    let dir = scratch_root("altered");
    // As the guide shows it, the command passes.
    let (problem, _) = run_step(&dir, &step, 0, &block.at);
    assert_eq!(problem, None);
    // One digit of one figure changed: it fails, showing both.
    let line = &shown[0];
    let at = line.find(|c: char| c.is_ascii_digit()).expect("a figure");
    let digit = line.as_bytes()[at];
    let other = if digit == b'9' {
        '1'
    } else {
        (digit + 1) as char
    };
    let altered = format!("{}{other}{}", &line[..at], &line[at + 1..]);
    let mut bad = step.clone();
    bad.shown = Some(
        std::iter::once(altered.clone())
            .chain(shown[1..].iter().cloned())
            .collect(),
    );
    let (problem, _) = run_step(&dir, &bad, 0, &block.at);
    let problem = problem.expect("a changed figure fails");
    assert!(problem.contains(&block.at), "{problem}");
    assert!(problem.contains(&altered), "{problem}");
    assert!(problem.contains(line.as_str()), "{problem}");
}

#[test]
fn a_placeholder_stands_for_a_run_dependent_part_and_its_spaces_but_not_for_nothing() {
    let shown = "step     1  loss     2.300490 <ms> ms  <rate> GFLOP/s";
    assert!(line_matches(
        shown,
        "step     1  loss     2.300490     98.267 ms  24.92 GFLOP/s"
    ));
    assert!(line_matches(
        shown,
        "step     1  loss     2.300490   1098.267 ms  124.92 GFLOP/s"
    ));
    // The loss is a figure: a changed digit fails.
    assert!(!line_matches(
        shown,
        "step     1  loss     2.300491     98.267 ms  24.92 GFLOP/s"
    ));
    // A placeholder stands for something, not for a missing value.
    assert!(!line_matches(
        shown,
        "step     1  loss     2.300490 ms  24.92 GFLOP/s"
    ));
    // Angle brackets that are not a placeholder are text.
    assert!(line_matches("a <B> c < d", "a <B> c < d"));
    assert!(!line_matches("a <B> c", "a x c"));
}

#[test]
fn an_ellipsis_line_stands_for_any_lines_and_only_on_a_line_of_its_own() {
    let shown: Vec<String> = ["first", "...", "last"].map(String::from).to_vec();
    assert!(output_matches(&shown, &["first", "last"]));
    assert!(output_matches(&shown, &["first", "a", "b", "last"]));
    assert!(!output_matches(&shown, &["first", "a", "lost"]));
    assert!(!output_matches(&shown, &["first", "last", "extra"]));
    assert!(!line_matches("total ... bytes", "total 12 bytes"));
}

#[test]
fn marks_and_transcripts_are_read_as_the_convention_says() {
    let md = "text\n<!-- doc-test: run exit=3 -->\n```\n$ ingot plan --model mlp \\\n    --budget 8MiB\nout 1\n...\n$ cargo run --release -- inspect f\n```\n\n```rust\nfn main() {}\n```\n<!-- doc-test: skip needs a GPU -->\n```\ningot train --device cuda\n```\n```\ningot plan\n```\n";
    let b = blocks("t.md", md).unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!(b[0].mark, Some(Mark::Run { exit: 3 }));
    assert_eq!(b[1].mark, Some(Mark::Skip("needs a GPU".into())));
    assert_eq!(
        b[2].mark, None,
        "an unmarked block is reported by marked_blocks"
    );
    let s = steps(&b[0]);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].line, 4);
    assert_eq!(s[0].command, "ingot plan --model mlp \\\n    --budget 8MiB");
    assert_eq!(
        s[0].shown,
        Some(vec!["out 1".to_string(), "...".to_string()])
    );
    assert_eq!(
        shell_command(&s[1].command),
        "\"$INGOT\" inspect f",
        "cargo run stands for the program"
    );
    assert!(
        parse_mark("<!-- doc-test: skip -->").is_err(),
        "a skip needs a reason"
    );
    assert!(parse_mark("<!-- doc-test: running -->").is_err());
}

/// The guide shows docs/examples/tiny-classifier.ir's lines; they are the file's.
#[test]
fn the_guides_copy_of_the_layer_line_example_is_the_files() {
    let guide = std::fs::read_to_string(root().join("docs/user-guide.md")).unwrap();
    let file = std::fs::read_to_string(root().join("docs/examples/tiny-classifier.ir")).unwrap();
    let lines: Vec<&str> = file
        .lines()
        .filter(|l| l.starts_with('%') || l.starts_with("output"))
        .collect();
    assert!(lines.len() >= 7);
    for l in lines {
        assert!(
            guide.lines().any(|g| g == l),
            "docs/user-guide.md does not show the line {l:?} of docs/examples/tiny-classifier.ir"
        );
    }
}

/// The guide's excerpt of the mlp's plan snapshot is the committed snapshot's first lines.
#[test]
fn the_guides_plan_snapshot_excerpt_is_the_committed_snapshots() {
    let guide = std::fs::read_to_string(root().join("docs/user-guide.md")).unwrap();
    let snap = std::fs::read_to_string(
        root().join("examples/tests/snapshots/plan_snapshot__mlp_plan.snap"),
    )
    .unwrap();
    let start = guide
        .find("```yaml\nmodel: mlp\n")
        .expect("the guide shows the snapshot")
        + 8;
    let excerpt: Vec<&str> = guide[start..]
        .lines()
        .take_while(|l| *l != "```")
        .filter(|l| l.trim() != "...")
        .collect();
    let body: Vec<&str> = snap.lines().skip_while(|l| *l != "model: mlp").collect();
    assert_eq!(
        excerpt,
        body[..excerpt.len()],
        "docs/user-guide.md's snapshot differs from examples/tests/snapshots/plan_snapshot__mlp_plan.snap"
    );
}
