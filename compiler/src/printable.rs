//! Text that is safe to print to a terminal: names come from users' files (IR text, ONNX
//! models, safetensors headers, checkpoints), and a name holding an escape sequence would clear
//! the screen, move the cursor or forge a report line when printed as it is (issue 53).
//!
//! [`printable`] is the one function every printer uses: the `ingot` command line passes each
//! line it writes through it, so names inside compiler errors, ONNX importer messages, plan
//! text and run reports are escaped wherever they were formatted. Names are never changed
//! where they are kept (files, checkpoints, plans): only their printed form is.

use std::borrow::Cow;

/// `text` with every control character but newline and tab written as Rust writes it in a
/// string literal's debug form (`\u{1b}` for ESC, `\r`, `\u{7f}`, `\u{9b}` for the 8-bit CSI):
/// the C0 controls, DEL and the C1 controls, any of which a terminal may act on. Text without
/// them comes back borrowed, unchanged.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn escape_sequences_are_written_out_and_plain_text_is_borrowed() {
        assert_eq!(
            printable("w\u{1b}[2J\u{1b}]0;x\u{7}\r\u{9b}1m"),
            "w\\u{1b}[2J\\u{1b}]0;x\\u{7}\\r\\u{9b}1m"
        );
        assert!(matches!(
            printable("fc1.weight: f32[16,8]\n\tok é"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
