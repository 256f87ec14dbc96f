//! The text stage of a reduction: last edits of the finished kernel text.

/// The text stage of a reduction: the kernel's text without the line that defines `row` from
/// the clamped slot (at byte `row_line`) when nothing after it reads `row`, so that the
/// compiler is not asked to keep an unused value.
pub(super) fn text_without_unread_row(mut text: String, row_line: Option<usize>) -> String {
    if let Some(at) = row_line {
        let end = at + text[at..].find('\n').map_or(0, |e| e + 1);
        if !mentions(&text[end..], "row") {
            text.replace_range(at..end, "");
        }
    }
    text
}

/// `body` (a lane's scope of straight-line definitions) without the `const` definitions that
/// nothing in it reads, repeatedly: a lane that knows a condition's value no longer reads what
/// computed it, and the compiler is not asked to keep unused values.
pub(super) fn without_unread_values(body: &str) -> String {
    // The name a `const TYPE NAME = ...;` line defines.
    let defined = |l: &str| -> Option<String> {
        let t = l.trim_start().strip_prefix("const ")?;
        let (lhs, _) = t.split_once(" = ")?;
        lhs.rsplit(' ').next().map(str::to_string)
    };
    let mut lines: Vec<&str> = body.lines().collect();
    loop {
        let unread = (0..lines.len()).find(|&k| {
            defined(lines[k]).is_some_and(|name| {
                !(lines.iter().enumerate()).any(|(o, l)| o != k && mentions(l, &name))
            })
        });
        match unread {
            Some(k) => {
                lines.remove(k);
            }
            None => break,
        }
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Whether `text` uses the identifier `word`.
pub(super) fn mentions(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !ident(c));
        let after = text[i + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !ident(c));
        before && after
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_matches_whole_identifiers_only() {
        assert!(mentions("out0[row] = v1;", "row"));
        assert!(mentions("row", "row"));
        assert!(!mentions("const unsigned rows = rr;", "row"));
        assert!(!mentions("b_row + row2", "row"));
    }

    #[test]
    fn definitions_nothing_reads_are_dropped_until_none_is_left() {
        let body = "const unsigned i3 = j;\nconst int v0 = (int)i3;\n\
                    const unsigned char v2 = 1u;\nconst float v8 = v2 ? v3 : v7;\n\
                    a10 = ig_keep_max(a10, v8);\n";
        assert_eq!(
            without_unread_values(body),
            "const unsigned char v2 = 1u;\nconst float v8 = v2 ? v3 : v7;\n\
             a10 = ig_keep_max(a10, v8);\n"
        );
        let all_read = "const float v1 = c1[u];\nr0[0] = ig_narrow(v1);\n";
        assert_eq!(without_unread_values(all_read), all_read);
    }

    #[test]
    fn the_clamped_row_line_is_dropped_only_when_nothing_after_it_reads_row() {
        let head = "const bool ok = rr < 4u;\n";
        let line = "const unsigned row = ok ? rr : 3u;\n";
        let tail = "if (ok) { out0[rr] = v1; }\n";
        let unread = format!("{head}{line}{tail}");
        assert_eq!(
            text_without_unread_row(unread.clone(), Some(head.len())),
            format!("{head}{tail}")
        );
        assert_eq!(text_without_unread_row(unread.clone(), None), unread);
        let read = format!("{head}{line}out0[row] = v1;\n");
        assert_eq!(
            text_without_unread_row(read.clone(), Some(head.len())),
            read
        );
    }
}
