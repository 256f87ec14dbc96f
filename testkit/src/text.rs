//! Checks of text the tests read: an error message, a report, a command's output.

/// Asserts that `text` contains each of `parts`, naming the first part it lacks and printing
/// the whole text: the check that an error or a report names what it must (the file, the line,
/// the sizes, what to do). One helper for the many tests that ask it, so that a failure always
/// says which part was missing.
#[track_caller]
pub fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} is not in:\n{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_with_every_part_passes() {
        assert_mentions("line 3: unknown op \"foo\"", &["line 3", "\"foo\""]);
    }

    #[test]
    #[should_panic(expected = "\"line 4\" is not in")]
    fn a_missing_part_fails_naming_it() {
        assert_mentions("line 3: unknown op", &["unknown op", "line 4"]);
    }
}
