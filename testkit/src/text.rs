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

/// Asserts that `result` is an error whose message contains each of `parts` (as
/// [`assert_mentions`]): the check that bad input is refused, naming what is wrong.
#[track_caller]
pub fn assert_err_mentions<T, E: std::fmt::Display>(result: Result<T, E>, parts: &[&str]) {
    match result {
        Ok(_) => panic!("succeeded where an error naming {parts:?} was expected"),
        Err(e) => assert_mentions(&e.to_string(), parts),
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

    #[test]
    #[should_panic(expected = "succeeded where an error")]
    fn a_result_that_is_not_an_error_fails() {
        assert_err_mentions(Ok::<(), String>(()), &["line 3"]);
    }

    #[test]
    fn an_error_with_every_part_passes() {
        assert_err_mentions(Err::<(), _>("line 3: unknown op"), &["line 3", "op"]);
    }
}
