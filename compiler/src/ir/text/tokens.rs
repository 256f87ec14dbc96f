//! Tokens: one line of the text form split into words, node references, strings and
//! punctuation, its trailing comment dropped.

use super::print::quote;
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok<'a> {
    /// A run of characters that are not spaces, punctuation, quotes, `%` or `#`: op names,
    /// keywords, numbers, dtypes.
    Word(&'a str),
    /// `%N`.
    Ref(usize),
    /// A quoted string, escapes resolved.
    Str(String),
    /// One of `= ( ) [ ] , :`.
    Punct(char),
}

impl fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Word(w) => write!(f, "`{w}`"),
            Tok::Ref(n) => write!(f, "`%{n}`"),
            Tok::Str(s) => write!(f, "`{}`", quote(s)),
            Tok::Punct(c) => write!(f, "`{c}`"),
        }
    }
}

const PUNCT: &[char] = &['=', '(', ')', '[', ']', ',', ':'];

fn is_word_char(c: char) -> bool {
    !c.is_whitespace() && !PUNCT.contains(&c) && c != '"' && c != '%' && c != '#'
}

/// Splits one line into tokens, dropping a trailing comment. The error is a reason; the caller
/// adds the line number.
pub(super) fn tokenize(line: &str) -> Result<Vec<Tok<'_>>, String> {
    let mut toks = Vec::new();
    let mut it = line.char_indices().peekable();
    while let Some(&(i, c)) = it.peek() {
        if c.is_whitespace() {
            it.next();
        } else if c == '#' {
            break;
        } else if PUNCT.contains(&c) {
            it.next();
            toks.push(Tok::Punct(c));
        } else if c == '"' {
            it.next();
            toks.push(Tok::Str(string_body(&mut it)?));
        } else if c == '%' {
            it.next();
            let start = i + 1;
            let digits = &line[start..word_end(&mut it, start)];
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "bad node reference `%{digits}` (expected `%` and a number, like `%3`)"
                ));
            }
            let n = digits
                .parse::<usize>()
                .map_err(|_| format!("node reference `%{digits}` is too large"))?;
            toks.push(Tok::Ref(n));
        } else {
            toks.push(Tok::Word(&line[i..word_end(&mut it, i)]));
        }
    }
    Ok(toks)
}

/// Takes the word characters from `it` and returns where they end (`start` if there are none):
/// a word's or a node reference's number.
fn word_end(it: &mut std::iter::Peekable<std::str::CharIndices<'_>>, start: usize) -> usize {
    let mut end = start;
    while let Some(&(j, d)) = it.peek() {
        if !is_word_char(d) {
            break;
        }
        end = j + d.len_utf8();
        it.next();
    }
    end
}

/// The rest of a quoted string, after its opening quote.
fn string_body(it: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> Result<String, String> {
    let mut s = String::new();
    loop {
        let Some((_, c)) = it.next() else {
            return Err(format!(
                "unterminated string `\"{s}` (strings end with `\"` on the same line)"
            ));
        };
        match c {
            '"' => return Ok(s),
            '\\' => match it.next().map(|(_, e)| e) {
                Some('"') => s.push('"'),
                Some('\\') => s.push('\\'),
                Some('n') => s.push('\n'),
                Some('r') => s.push('\r'),
                Some('t') => s.push('\t'),
                Some('u') => {
                    if it.next().map(|(_, b)| b) != Some('{') {
                        return Err("bad escape: `\\u` must be followed by `{HEX}`".into());
                    }
                    let mut hex = String::new();
                    loop {
                        match it.next().map(|(_, h)| h) {
                            Some('}') => break,
                            Some(h) if h.is_ascii_hexdigit() && hex.len() < 6 => hex.push(h),
                            _ => return Err(format!("bad escape `\\u{{{hex}`: expected up to 6 hex digits and `}}`")),
                        }
                    }
                    let ch = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                    match ch {
                        Some(ch) => s.push(ch),
                        None => return Err(format!("bad escape `\\u{{{hex}}}`: not a character")),
                    }
                }
                Some(e) => return Err(format!("unknown escape `\\{e}` in a string (use `\\\"`, `\\\\`, `\\n`, `\\r`, `\\t` or `\\u{{HEX}}`)")),
                None => return Err("unterminated string (it ends in `\\`)".into()),
            },
            c => s.push(c),
        }
    }
}
