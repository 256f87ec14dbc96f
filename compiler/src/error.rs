//! Errors the compiler returns. Every one names the op, the shapes or the line at fault and
//! says what to do; none of them is a panic.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// An op was given operands it cannot take (shapes, dtypes, attributes).
    #[error("{op} (node %{node}): {reason}; operands: {operands}")]
    Type {
        op: &'static str,
        node: usize,
        operands: String,
        reason: String,
    },
    /// An operand refers to a node that does not exist yet.
    #[error("{op} (node %{node}): operand %{operand} does not exist (the graph has {len} nodes; operands must come before their users)")]
    Dangling {
        op: &'static str,
        node: usize,
        operand: usize,
        len: usize,
    },
    /// The graph breaks a structural rule (duplicate names, bad updates, bad outputs).
    #[error("invalid graph: {0}")]
    Invalid(String),
    /// The text form could not be read.
    #[error("line {line}: {reason}")]
    Parse { line: usize, reason: String },
    /// A model specification could not be understood.
    #[error("model {spec:?}: {reason}")]
    Model { spec: String, reason: String },
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;

/// `text` as it may be shown on a terminal: every control character (an escape sequence that
/// could clear the screen or forge a report line, a newline or tab inside a name) written as a
/// `\u{..}` escape, everything else as it is. Names come from user files (IR text, ONNX, paths)
/// and may hold anything; whatever prints one prints it through this.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_print_as_escapes_and_other_text_as_it_is() {
        assert_eq!(printable("fc1.weight ünï"), "fc1.weight ünï");
        assert_eq!(printable("a\x1b[2Jb\nc\td"), "a\\u{1b}[2Jb\\u{a}c\\u{9}d");
        assert_eq!(printable("\u{9b}"), "\\u{9b}", "C1 controls too (CSI)");
    }
}
