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
