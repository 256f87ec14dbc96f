//! The IR's text form: what [`print()`] writes, what [`parse()`] reads, and what users write by hand
//! for `--model-file step.ir`. Printing then parsing gives back an equal [`Graph`], and printing
//! that graph again gives the same text, byte for byte.
//!
//! # Example
//!
//! ```
//! let text = r#"
//! ingot-ir 1
//! ## A linear layer with a ReLU, summed over its features.
//! %0 = parameter "fc1.weight" init=normal(0.02) : f32[16,8]
//! %1 = input "x" : f32[4,8]
//! %2 = transpose(%0) perm=[1,0] : f32[8,16]
//! %3 = matmul(%1, %2) : f32[4,16]
//! %4 = full value=0.0 : f32[4,16]
//! %5 = max(%3, %4) : f32[4,16]          # relu
//! %6 = reduce_sum(%5) axes=[1] : f32[4,1]
//! %7 = slice(%6) axis=0 start=0 end=2 : f32[2,1]
//! %8 = full value=0.1 : f32[16,8]
//! %9 = sub(%0, %8) : f32[16,8]
//! output "y" = %7
//! update %0 = %9
//! "#;
//! let g = ingot_compiler::ir::text::parse(text).unwrap();
//! assert_eq!(g.len(), 10);
//! assert_eq!(ingot_compiler::ir::text::parse(&g.to_string()).unwrap(), g);
//! ```
//!
//! # Grammar
//!
//! The text is read line by line. `#` starts a comment that runs to the end of the line (outside
//! strings); blank lines are ignored.
//!
//! ```text
//! file     := header line*
//! header   := "ingot-ir" "1"                    the first line that is not blank or a comment
//! line     := node | output | update
//! node     := "%" N "=" op operands? name? attr* ":" type
//! operands := "(" ( "%" N ( "," "%" N )* )? ")"
//! name     := STRING                            leaves only: parameter, state, input
//! attr     := KEY "=" value
//! value    := NUMBER | "[" ( N ( "," N )* )? "]" | "zeros" | "ones" | "normal(" NUMBER ")" | "uniform(" NUMBER ")"
//! type     := DTYPE "[" ( N ( "," N )* )? "]"   f32 | f64 | i32 | i64 | bool; a scalar is f32[]
//! output   := "output" STRING "=" "%" N
//! update   := "update" "%" N "=" "%" N           target (a parameter or state) = new value
//! ```
//!
//! - Node ids count up from `%0` with no gaps, one node per line, and an operand must be a node
//!   defined on an earlier line (so the file order is the graph's topological order).
//! - `op` is exactly [`Op::name`]. Every node states its result type; [`Graph::push`] checks it,
//!   and a type error comes back naming the line.
//! - Attributes may come in any order; each op takes exactly these:
//!
//!   | op | attributes |
//!   |---|---|
//!   | `parameter`, `state` | a name string, `init=zeros\|ones\|normal(STD)\|uniform(BOUND)` |
//!   | `input` | a name string (`init=` is allowed but optional, default `zeros`) |
//!   | `full` | `value=F` (any f64: `0.1`, `1e-8`, `-0.0`, `inf`, `-inf`, `nan`) |
//!   | `iota` | `axis=N` |
//!   | `transpose` | `perm=[N,...]` |
//!   | `slice` | `axis=N start=N end=N` (the range is `[start, end)`) |
//!   | `concat` | `axis=N` |
//!   | `reduce_sum`, `reduce_max` | `axes=[N,...]` |
//!   | `scatter_add` | `rows=N` |
//!   | `dropout(x, seed)` | `p=F` (in `[0, 1]`) `salt=N` (see [`Op::Dropout`]) |
//!   | `matmul` | `ta=true\|false tb=true\|false` (absent means `false`) |
//!   | `attention(q, k, v)`, `attention_grad(q, k, v, out, lse, dout)`; with `layout=packed`, `attention(qkv)`, `attention_grad(qkv, out, lse, dout)` | `scale=F`, `causal=true\|false` (absent means `false`), `layout=heads\|tokens\|packed` (absent means `heads`; see `AttentionLayout`) |
//!   | `result(%N)` | `index=N`: output N of a fused kernel or an attention op |
//!   | `conv2d` | `stride=[A,B] padding=[A,B] dilation=[A,B] groups=N` |
//!   | `conv2d_grad_input` | those of `conv2d`, and `input=[H,W]` |
//!   | `conv2d_grad_weight` | those of `conv2d`, and `kernel=[KH,KW]` |
//!   | `max_pool2d`, `max_pool2d_grad` | `kernel=[A,B] stride=[A,B] padding=[A,B] dilation=[A,B]` |
//!   | every other op | none |
//!
//! - Floats print with Rust's shortest round-tripping form (`{:?}`, with NaN as `nan`), so
//!   every f64 comes back bit for bit (NaN comes back as the canonical NaN).
//! - Strings are in double quotes; `\"`, `\\`, `\n`, `\r`, `\t` and `\u{HEX}` are their escapes.
//! - Outputs and updates may appear anywhere after the nodes they name; the printer puts them
//!   last, in the graph's order.
//!
//! Any text that is not a valid graph gives [`IrError::Parse`] with the 1-based line and a
//! reason that quotes the offending token; no input makes the parser panic.

use super::{
    AttentionLayout, Axes, BinaryOp, CmpOp, DType, Graph, Init, LeafKind, Mode, NodeId, Op,
    ReduceOp, Shape, TensorType, UnaryOp, WindowOp,
};
use crate::error::IrError;
use std::collections::HashMap;
use std::fmt::{self, Write as _};

/// The version this build writes and reads, on the first line: `ingot-ir 1`.
pub const VERSION: u32 = 1;

/// The header's keyword.
const MAGIC: &str = "ingot-ir";

// ---------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------

/// The text form of `g`; [`parse()`] reads it back into an equal graph.
pub fn print(g: &Graph) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{MAGIC} {VERSION}");
    for (i, n) in g.nodes().iter().enumerate() {
        let _ = write!(s, "%{i} = {}", n.op.name());
        if !n.inputs.is_empty() {
            s.push('(');
            for (k, x) in n.inputs.iter().enumerate() {
                if k > 0 {
                    s.push_str(", ");
                }
                let _ = write!(s, "{x}");
            }
            s.push(')');
        }
        write_attrs(&mut s, &n.op);
        let _ = writeln!(s, " : {}", n.ty);
    }
    for (name, id) in &g.outputs {
        let _ = writeln!(s, "output {} = {id}", quote(name));
    }
    for u in &g.updates {
        let _ = writeln!(s, "update {} = {}", u.target, u.value);
    }
    s
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print(self))
    }
}

impl std::str::FromStr for Graph {
    type Err = IrError;

    fn from_str(s: &str) -> Result<Graph, IrError> {
        parse(s)
    }
}

fn write_attrs(s: &mut String, op: &Op) {
    let list = |axes: &Axes| {
        let items: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
        format!("[{}]", items.join(","))
    };
    let _ = match op {
        Op::Leaf { kind, name, init } => {
            let _ = write!(s, " {}", quote(name));
            if *kind != LeafKind::Input || *init != Init::Zeros {
                let _ = write!(s, " init=");
                match init {
                    Init::Zeros => s.push_str("zeros"),
                    Init::Ones => s.push_str("ones"),
                    Init::Normal { std } => {
                        let _ = write!(s, "normal({})", float(*std));
                    }
                    Init::Uniform { bound } => {
                        let _ = write!(s, "uniform({})", float(*bound));
                    }
                    Init::Ids { bound } => {
                        let _ = write!(s, "ids({bound})");
                    }
                }
            }
            Ok(())
        }
        Op::Full { value } => write!(s, " value={}", float(*value)),
        Op::Iota { axis } => write!(s, " axis={axis}"),
        Op::Transpose { perm } => write!(s, " perm={}", list(perm)),
        Op::Slice { axis, start, end } => write!(s, " axis={axis} start={start} end={end}"),
        Op::Concat { axis } => write!(s, " axis={axis}"),
        Op::Reduce { axes, .. } => write!(s, " axes={}", list(axes)),
        Op::ScatterAdd { rows } => write!(s, " rows={rows}"),
        Op::MatMul { ta, tb } | Op::MatMulAcc { ta, tb } => {
            let _ = match (ta, tb) {
                (false, false) => Ok(()),
                _ => write!(s, " ta={ta} tb={tb}"),
            };
            Ok(())
        }
        Op::Result { index } => write!(s, " index={index}"),
        Op::AllReduce { ranks } | Op::AllGather { ranks } | Op::ReduceScatter { ranks } => {
            write!(s, " ranks={ranks}")
        }
        Op::Dropout { p, salt } => write!(s, " p={} salt={salt}", float(*p)),
        Op::Attention {
            causal,
            scale,
            layout,
        }
        | Op::AttentionGrad {
            causal,
            scale,
            layout,
        } => {
            // The default layout is not written, so heads-layout text reads as it always has.
            match layout {
                AttentionLayout::Heads => write!(s, " causal={causal} scale={}", float(*scale)),
                l => write!(
                    s,
                    " causal={causal} scale={} layout={}",
                    float(*scale),
                    l.name()
                ),
            }
        }
        Op::Fused(k) => write!(
            s,
            " {}",
            quote(&serde_json::to_string(k).expect("a kernel serializes"))
        ),
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Broadcast
        | Op::Reshape
        | Op::Gather
        | Op::StopGradient
        | Op::Convert => Ok(()),
        Op::Window(w) => {
            w.write_attrs(s);
            Ok(())
        }
    };
}

/// An f64 in its shortest form that parses back to the same bits (NaN as `nan`).
fn float(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else {
        format!("{v:?}")
    }
}

/// A string in double quotes, with `"`, `\` and control characters escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Tok<'a> {
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
fn tokenize(line: &str) -> Result<Vec<Tok<'_>>, String> {
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
            let mut end = start;
            while let Some(&(j, d)) = it.peek() {
                if !is_word_char(d) {
                    break;
                }
                end = j + d.len_utf8();
                it.next();
            }
            let digits = &line[start..end];
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
            let mut end = i;
            while let Some(&(j, d)) = it.peek() {
                if !is_word_char(d) {
                    break;
                }
                end = j + d.len_utf8();
                it.next();
            }
            toks.push(Tok::Word(&line[i..end]));
        }
    }
    Ok(toks)
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

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// Reads a graph from its text form (see the module documentation for the grammar).
///
/// Syntax errors, type errors and structural errors (duplicate outputs, bad updates) all come
/// back as [`IrError::Parse`] naming the 1-based line and, for syntax, the offending token.
pub fn parse(text: &str) -> Result<Graph, IrError> {
    parse_in(text, Mode::Train)
}

/// [`parse`] as a model's forward pass traced in `mode` ([`Mode`]): in [`Mode::Eval`] each
/// `dropout` line, checked as always, becomes the identity (a `reshape` of its operand to its
/// own shape, so that line `%N` is still node `N`). In [`Mode::Train`] it is [`parse`].
pub fn parse_in(text: &str, mode: Mode) -> Result<Graph, IrError> {
    let mut g = Graph::new();
    g.set_mode(mode);
    let mut header = false;
    let mut output_lines: HashMap<String, usize> = HashMap::new();
    let mut update_lines: HashMap<usize, usize> = HashMap::new();
    let mut last = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        last = line;
        let err = |reason: String| IrError::Parse { line, reason };
        let toks = tokenize(raw).map_err(err)?;
        if toks.is_empty() {
            continue;
        }
        let mut c = Cursor { toks, pos: 0 };
        if !header {
            read_header(&mut c).map_err(err)?;
            header = true;
            continue;
        }
        match c.peek() {
            Some(Tok::Ref(_)) => read_node(&mut c, &mut g).map_err(err)?,
            Some(Tok::Word("output")) => {
                c.next();
                let name = c.string("the output's name in quotes").map_err(err)?;
                c.punct('=', "`=` after the output's name").map_err(err)?;
                let id = c.node_ref(&g, "the output's node").map_err(err)?;
                c.end().map_err(err)?;
                if let Some(first) = output_lines.get(&name) {
                    return Err(err(format!(
                        "output {} is named twice (first on line {first})",
                        quote(&name)
                    )));
                }
                g.set_output(&name, id).map_err(|e| err(e.to_string()))?;
                output_lines.insert(name, line);
            }
            Some(Tok::Word("update")) => {
                c.next();
                let target = c
                    .node_ref(&g, "the updated parameter or state, like `%0`")
                    .map_err(err)?;
                c.punct('=', "`=` after the update's target").map_err(err)?;
                let value = c.node_ref(&g, "the new value, like `%9`").map_err(err)?;
                c.end().map_err(err)?;
                if let Some(first) = update_lines.get(&target.index()) {
                    return Err(err(format!(
                        "{target} is updated twice (first on line {first})"
                    )));
                }
                g.set_update(target, value)
                    .map_err(|e| err(e.to_string()))?;
                update_lines.insert(target.index(), line);
            }
            _ => {
                let found = c.describe();
                return Err(err(format!(
                    "expected a node (`%{} = ...`), `output` or `update`, found {found}",
                    g.len()
                )));
            }
        }
    }
    if !header {
        return Err(IrError::Parse {
            line: last.max(1),
            reason: format!("the text is empty: it must start with the header `{MAGIC} {VERSION}`"),
        });
    }
    g.set_mode(Mode::Train);
    Ok(g)
}

/// The tokens of one line and a position in them. Errors are reasons without the line number.
struct Cursor<'a> {
    toks: Vec<Tok<'a>>,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&Tok<'a>> {
        self.toks.get(self.pos)
    }

    fn next(&mut self) -> Option<Tok<'a>> {
        let t = self.toks.get(self.pos).cloned();
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    /// The next token as an error message quotes it.
    fn describe(&self) -> String {
        match self.peek() {
            Some(t) => t.to_string(),
            None => "the end of the line".into(),
        }
    }

    fn expected(&self, what: &str) -> String {
        format!("expected {what}, found {}", self.describe())
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }

    fn punct(&mut self, c: char, what: &str) -> Result<(), String> {
        if self.is_punct(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.expected(what))
        }
    }

    fn word(&mut self, what: &str) -> Result<&'a str, String> {
        match self.peek() {
            Some(&Tok::Word(w)) => {
                self.pos += 1;
                Ok(w)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        match self.peek() {
            Some(Tok::Str(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    /// A reference to a node already defined in `g`.
    fn node_ref(&mut self, g: &Graph, what: &str) -> Result<NodeId, String> {
        match self.peek() {
            Some(&Tok::Ref(n)) => {
                self.pos += 1;
                defined(g, n)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn end(&self) -> Result<(), String> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(format!("unexpected {t} at the end of the line")),
        }
    }
}

fn defined(g: &Graph, n: usize) -> Result<NodeId, String> {
    if n < g.len() {
        Ok(NodeId(n as u32))
    } else if g.is_empty() {
        Err(format!("`%{n}` is not defined (no node is defined yet)"))
    } else {
        Err(format!(
            "`%{n}` is not defined (nodes so far are %0 to %{}; operands must be defined on earlier lines)",
            g.len() - 1
        ))
    }
}

fn read_header(c: &mut Cursor<'_>) -> Result<(), String> {
    let expected = format!("the header `{MAGIC} {VERSION}` on the first line");
    match c.peek() {
        Some(Tok::Word(w)) if *w == MAGIC => {
            c.next();
        }
        _ => return Err(c.expected(&expected)),
    }
    match c.peek() {
        Some(Tok::Word(v)) if *v == VERSION.to_string() => {
            c.next();
        }
        Some(Tok::Word(v)) => {
            return Err(format!(
                "unsupported version `{v}` (this build reads `{MAGIC} {VERSION}`)"
            ));
        }
        _ => return Err(c.expected(&format!("the version after `{MAGIC}` (`{VERSION}`)"))),
    }
    c.end()
}

/// One attribute value, as written, before the op decides what it must be.
#[derive(Debug)]
enum Value<'a> {
    /// `3`, `0.1`, `zeros`.
    Word(&'a str),
    /// `[1,0]`.
    List(Vec<&'a str>),
    /// `normal(0.02)`.
    Call(&'a str, &'a str),
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Word(w) => write!(f, "`{w}`"),
            Value::List(l) => write!(f, "`[{}]`", l.join(",")),
            Value::Call(n, a) => write!(f, "`{n}({a})`"),
        }
    }
}

fn read_value<'a>(c: &mut Cursor<'a>, key: &str) -> Result<Value<'a>, String> {
    if c.is_punct('[') {
        c.next();
        let mut items = Vec::new();
        if c.is_punct(']') {
            c.next();
            return Ok(Value::List(items));
        }
        loop {
            items.push(c.word(&format!("a number in the list `{key}=[...]`"))?);
            if c.is_punct(']') {
                c.next();
                return Ok(Value::List(items));
            }
            c.punct(',', &format!("`,` or `]` in the list `{key}=[...]`"))?;
        }
    }
    let w = c.word(&format!("a value after `{key}=`"))?;
    if c.is_punct('(') {
        c.next();
        let arg = c.word(&format!("a number in `{w}(...)`"))?;
        c.punct(')', &format!("`)` to close `{w}({arg}`"))?;
        return Ok(Value::Call(w, arg));
    }
    Ok(Value::Word(w))
}

/// The attributes written on one node line, taken one by one as the op asks for them.
struct Attrs<'a> {
    op: &'static str,
    items: Vec<(&'a str, Value<'a>)>,
}

impl<'a> Attrs<'a> {
    fn take(&mut self, key: &str) -> Result<Value<'a>, String> {
        match self.items.iter().position(|(k, _)| *k == key) {
            Some(i) => Ok(self.items.remove(i).1),
            None => Err(format!("`{}` needs the attribute `{key}=`", self.op)),
        }
    }

    fn take_usize(&mut self, key: &str) -> Result<usize, String> {
        match self.take(key)? {
            Value::Word(w) => int(w, key),
            v => Err(format!(
                "`{key}=` must be a non-negative integer, found {v}"
            )),
        }
    }

    fn take_list(&mut self, key: &str) -> Result<Axes, String> {
        match self.take(key)? {
            Value::List(items) => items.into_iter().map(|w| int(w, key)).collect(),
            v => Err(format!(
                "`{key}=` must be a list of axes like `[1,0]`, found {v}"
            )),
        }
    }

    fn take_f64(&mut self, key: &str) -> Result<f64, String> {
        match self.take(key)? {
            Value::Word(w) => number(w, key),
            v => Err(format!("`{key}=` must be a number, found {v}")),
        }
    }

    fn take_init(&mut self) -> Result<Init, String> {
        match self.take("init")? {
            Value::Word("zeros") => Ok(Init::Zeros),
            Value::Word("ones") => Ok(Init::Ones),
            Value::Call("normal", std) => Ok(Init::Normal {
                std: number(std, "normal")?,
            }),
            Value::Call("uniform", bound) => Ok(Init::Uniform {
                bound: number(bound, "uniform")?,
            }),
            Value::Call("ids", bound) => {
                let b = number(bound, "ids")?;
                if !(b >= 1.0 && b.fract() == 0.0 && b < 2f64.powi(53)) {
                    return Err(format!("`init=ids(N)` needs a whole number N >= 1, found {b}"));
                }
                Ok(Init::Ids { bound: b as u64 })
            }
            v => Err(format!(
                "`init=` must be `zeros`, `ones`, `normal(STD)`, `uniform(BOUND)` or `ids(N)`, found {v}"
            )),
        }
    }

    /// `heads`, `tokens` or `packed`; absent means `heads`.
    fn take_attention_layout(&mut self) -> Result<AttentionLayout, String> {
        if !self.has("layout") {
            return Ok(AttentionLayout::Heads);
        }
        let all = [
            AttentionLayout::Heads,
            AttentionLayout::Tokens,
            AttentionLayout::Packed,
        ];
        match self.take("layout")? {
            Value::Word(w) => all.into_iter().find(|l| l.name() == w),
            _ => None,
        }
        .ok_or_else(|| "`layout=` must be `heads`, `tokens` or `packed`".to_string())
    }

    /// `true` or `false`; absent means `false`.
    fn take_bool_or_false(&mut self, key: &str) -> Result<bool, String> {
        if !self.has(key) {
            return Ok(false);
        }
        match self.take(key)? {
            Value::Word("true") => Ok(true),
            Value::Word("false") => Ok(false),
            v => Err(format!("`{key}=` must be `true` or `false`, found {v}")),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.items.iter().any(|(k, _)| *k == key)
    }

    /// Fails on any attribute the op did not take.
    fn finish(self, allowed: &str) -> Result<(), String> {
        match self.items.first() {
            None => Ok(()),
            Some((k, _)) => Err(format!(
                "unknown attribute `{k}` for `{}` ({allowed})",
                self.op
            )),
        }
    }
}

impl crate::ir::window::ReadAttrs for Attrs<'_> {
    fn pair(&mut self, key: &str) -> Result<[usize; 2], String> {
        match self.take_list(key)?.as_slice() {
            &[a, b] => Ok([a, b]),
            other => Err(format!(
                "`{key}=` must be a list of two numbers like `[1,1]`, found {other:?}"
            )),
        }
    }

    fn int(&mut self, key: &str) -> Result<usize, String> {
        self.take_usize(key)
    }
}

fn int(w: &str, key: &str) -> Result<usize, String> {
    if !w.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "bad number `{w}` for `{key}`: expected a non-negative integer"
        ));
    }
    w.parse::<usize>().map_err(|_| {
        format!(
            "bad number `{w}` for `{key}`: expected a non-negative integer that fits in 64 bits"
        )
    })
}

fn number(w: &str, key: &str) -> Result<f64, String> {
    w.parse::<f64>().map_err(|_| {
        format!("bad number `{w}` for `{key}`: expected a float like `0.5`, `1e-8`, `inf` or `nan`")
    })
}

/// The op named `name` with no attributes filled in yet, or `None` for an unknown name.
fn op_by_name(name: &str) -> Option<Op> {
    let leaf = |kind| Op::Leaf {
        kind,
        name: String::new(),
        init: Init::Zeros,
    };
    if let Some(u) = UnaryOp::from_name(name) {
        return Some(Op::Unary(u));
    }
    if let Some(b) = BinaryOp::from_name(name) {
        return Some(Op::Binary(b));
    }
    if let Some(c) = CmpOp::from_name(name) {
        return Some(Op::Compare(c));
    }
    if let Some(w) = WindowOp::from_name(name) {
        return Some(Op::Window(w));
    }
    Some(match name {
        "parameter" => leaf(LeafKind::Parameter),
        "state" => leaf(LeafKind::State),
        "input" => leaf(LeafKind::Input),
        "full" => Op::Full { value: 0.0 },
        "iota" => Op::Iota { axis: 0 },
        "select" => Op::Select,
        "broadcast" => Op::Broadcast,
        "reshape" => Op::Reshape,
        "transpose" => Op::Transpose { perm: Axes::new() },
        "slice" => Op::Slice {
            axis: 0,
            start: 0,
            end: 0,
        },
        "concat" => Op::Concat { axis: 0 },
        "reduce_sum" => Op::Reduce {
            op: ReduceOp::Sum,
            axes: Axes::new(),
        },
        "reduce_max" => Op::Reduce {
            op: ReduceOp::Max,
            axes: Axes::new(),
        },
        "matmul" => Op::MATMUL,
        "matmul_acc" => Op::MatMulAcc {
            ta: false,
            tb: false,
        },
        "stop_gradient" => Op::StopGradient,
        "result" => Op::Result { index: 0 },
        "all_reduce" => Op::AllReduce { ranks: 0 },
        "all_gather" => Op::AllGather { ranks: 0 },
        "reduce_scatter" => Op::ReduceScatter { ranks: 0 },
        "dropout" => Op::Dropout { p: 0.0, salt: 0 },
        "attention" => Op::Attention {
            causal: false,
            scale: 1.0,
            layout: AttentionLayout::Heads,
        },
        "attention_grad" => Op::AttentionGrad {
            causal: false,
            scale: 1.0,
            layout: AttentionLayout::Heads,
        },
        "fused" => Op::Fused(Box::new(ingot_kernels::FusedKernel {
            domain: vec![],
            reduce_axes: vec![],
            inputs: vec![],
            body: vec![],
            outputs: vec![],
        })),
        "gather" => Op::Gather,
        "scatter_add" => Op::ScatterAdd { rows: 0 },
        "convert" => Op::Convert,
        _ => return None,
    })
}

/// Fills in `op`'s attributes (and a leaf's name) from what the line wrote.
fn with_attrs(op: Op, name: Option<String>, mut a: Attrs<'_>) -> Result<Op, String> {
    let op_name = a.op;
    if name.is_some() && !op.is_leaf() && !matches!(op, Op::Fused(_)) {
        return Err(format!(
            "`{op_name}` takes no name string (only parameter, state and input do)"
        ));
    }
    let (op, allowed) = match op {
        Op::Leaf { kind, .. } => {
            let Some(name) = name else {
                return Err(format!(
                    "`{op_name}` needs its name in quotes, like `{op_name} \"fc1.weight\"`"
                ));
            };
            let init = if kind == LeafKind::Input && !a.has("init") {
                Init::Zeros
            } else {
                a.take_init()?
            };
            (Op::Leaf { kind, name, init }, "it takes `init=`")
        }
        Op::Full { .. } => (
            Op::Full {
                value: a.take_f64("value")?,
            },
            "it takes `value=`",
        ),
        Op::Iota { .. } => (
            Op::Iota {
                axis: a.take_usize("axis")?,
            },
            "it takes `axis=`",
        ),
        Op::Transpose { .. } => (
            Op::Transpose {
                perm: a.take_list("perm")?,
            },
            "it takes `perm=`",
        ),
        Op::Slice { .. } => {
            let axis = a.take_usize("axis")?;
            let start = a.take_usize("start")?;
            let end = a.take_usize("end")?;
            (
                Op::Slice { axis, start, end },
                "it takes `axis=`, `start=` and `end=`",
            )
        }
        Op::Concat { .. } => (
            Op::Concat {
                axis: a.take_usize("axis")?,
            },
            "it takes `axis=`",
        ),
        Op::Reduce { op, .. } => (
            Op::Reduce {
                op,
                axes: a.take_list("axes")?,
            },
            "it takes `axes=`",
        ),
        Op::ScatterAdd { .. } => (
            Op::ScatterAdd {
                rows: a.take_usize("rows")?,
            },
            "it takes `rows=`",
        ),
        Op::MatMul { .. } => {
            let ta = a.take_bool_or_false("ta")?;
            let tb = a.take_bool_or_false("tb")?;
            (Op::MatMul { ta, tb }, "it takes `ta=` and `tb=`")
        }
        Op::MatMulAcc { .. } => {
            let ta = a.take_bool_or_false("ta")?;
            let tb = a.take_bool_or_false("tb")?;
            (Op::MatMulAcc { ta, tb }, "it takes `ta=` and `tb=`")
        }
        Op::Result { .. } => (
            Op::Result {
                index: a.take_usize("index")?,
            },
            "it takes `index=`",
        ),
        Op::AllReduce { .. } => (
            Op::AllReduce {
                ranks: a.take_usize("ranks")?,
            },
            "it takes `ranks=`",
        ),
        Op::AllGather { .. } => (
            Op::AllGather {
                ranks: a.take_usize("ranks")?,
            },
            "it takes `ranks=`",
        ),
        Op::ReduceScatter { .. } => (
            Op::ReduceScatter {
                ranks: a.take_usize("ranks")?,
            },
            "it takes `ranks=`",
        ),
        Op::Dropout { .. } => {
            let p = a.take_f64("p")?;
            let salt = a.take_usize("salt")? as u64;
            (Op::Dropout { p, salt }, "it takes `p=` and `salt=`")
        }
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let causal = a.take_bool_or_false("causal")?;
            let scale = a.take_f64("scale")?;
            let layout = a.take_attention_layout()?;
            let op = if matches!(op, Op::Attention { .. }) {
                Op::Attention {
                    causal,
                    scale,
                    layout,
                }
            } else {
                Op::AttentionGrad {
                    causal,
                    scale,
                    layout,
                }
            };
            (op, "it takes `causal=`, `scale=` and `layout=`")
        }
        Op::Fused(_) => {
            let Some(json) = name else {
                return Err("`fused` needs its kernel as a quoted JSON string".into());
            };
            let k: ingot_kernels::FusedKernel = serde_json::from_str(&json)
                .map_err(|e| format!("`fused`: the kernel does not parse: {e}"))?;
            (Op::Fused(Box::new(k)), "it takes no attributes")
        }
        Op::Window(w) => (Op::Window(w.with_attrs(&mut a)?), w.allowed()),
        other => (other, "it takes no attributes"),
    };
    a.finish(allowed)?;
    Ok(op)
}

fn read_node(c: &mut Cursor<'_>, g: &mut Graph) -> Result<(), String> {
    let Some(Tok::Ref(id)) = c.next() else {
        return Err("expected a node id like `%0`".into());
    };
    if id != g.len() {
        return Err(format!(
            "node `%{id}` is out of order: the next node must be `%{}` (ids count up from %0 with no gaps)",
            g.len()
        ));
    }
    c.punct('=', &format!("`=` after `%{id}`"))?;
    let op_name = c.word("an op name, like `add` or `matmul`")?;
    let Some(op) = op_by_name(op_name) else {
        return Err(format!("unknown op `{op_name}`"));
    };
    let op_name = op.name();

    let mut inputs: Vec<NodeId> = Vec::new();
    if c.is_punct('(') {
        c.next();
        if c.is_punct(')') {
            c.next();
        } else {
            loop {
                inputs.push(c.node_ref(g, &format!("an operand of `{op_name}`, like `%0`"))?);
                if c.is_punct(')') {
                    c.next();
                    break;
                }
                c.punct(',', &format!("`,` or `)` in the operands of `{op_name}`"))?;
            }
        }
    }

    let name = match c.peek() {
        Some(Tok::Str(_)) => Some(c.string("a name")?),
        _ => None,
    };

    let mut attrs = Attrs {
        op: op_name,
        items: Vec::new(),
    };
    while !c.is_punct(':') {
        let key = c.word("an attribute `key=value` or `:` and the result type")?;
        c.punct('=', &format!("`=` after the attribute `{key}`"))?;
        let value = read_value(c, key)?;
        if attrs.has(key) {
            return Err(format!("the attribute `{key}` is given twice"));
        }
        attrs.items.push((key, value));
    }
    c.next();
    let ty = read_type(c)?;
    c.end()?;

    let op = with_attrs(op, name, attrs)?;
    if let Op::Concat { axis } = &op {
        // `infer` adds the sizes along `axis`; keep that sum from overflowing.
        let total =
            inputs
                .iter()
                .try_fold(0usize, |acc, &x| match g.ty(x).shape.dims().get(*axis) {
                    Some(&d) => acc.checked_add(d),
                    None => Some(acc),
                });
        if total.is_none() {
            return Err(format!("`concat` (node %{id}): the operands' sizes along axis {axis} add up to more than fits in memory"));
        }
    }
    if matches!(op, Op::Dropout { .. }) && g.mode() == Mode::Eval {
        let types: Vec<&TensorType> = inputs.iter().map(|&x| g.ty(x)).collect();
        crate::ir::infer(&op, &types, Some(&ty), g.len()).map_err(|e| e.to_string())?;
        g.push(Op::Reshape, &inputs[..1], Some(ty))
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    g.push(op, &inputs, Some(ty)).map_err(|e| e.to_string())?;
    Ok(())
}

/// `DTYPE[d0,d1,...]`, then nothing else on the line.
fn read_type(c: &mut Cursor<'_>) -> Result<TensorType, String> {
    let w = c.word("the result type after `:`, like `f32[4,8]`")?;
    let dtype = DType::from_name(w)
        .ok_or_else(|| format!("unknown dtype `{w}` (expected f32, f64, i32, i64 or bool)"))?;
    c.punct(
        '[',
        &format!("`[` and the shape after `{w}` (a scalar is `{w}[]`)"),
    )?;
    let mut dims = Vec::new();
    if c.is_punct(']') {
        c.next();
    } else {
        loop {
            let d = c.word("a dimension size")?;
            dims.push(int(d, "a dimension")?);
            if c.is_punct(']') {
                c.next();
                break;
            }
            c.punct(',', "`,` or `]` in the shape")?;
        }
    }
    // Every size later code computes (elements, bytes) must fit in a usize.
    let bytes = dims
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
    let ty = TensorType::new(Shape::new(&dims), dtype);
    if bytes.is_none() {
        return Err(format!(
            "the type {ty} is too large: its size in bytes does not fit in 64 bits"
        ));
    }
    Ok(ty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A graph with every op, every dtype and every kind of leaf and init.
    fn every_op_graph() -> Graph {
        let mut g = Graph::new();
        let w = g
            .parameter("fc1.weight", [3, 4], DType::F32, Init::Normal { std: 0.02 })
            .unwrap();
        let b = g
            .parameter("fc1.bias", [3], DType::F32, Init::Zeros)
            .unwrap();
        let m = g
            .state("adam.m.fc1.weight", [3, 4], DType::F32, Init::Ones)
            .unwrap();
        let x = g.input("x", [2, 4], DType::F32).unwrap();
        let ids = g
            .input("tokens \"quoted\" \\ # not a comment", [2], DType::I32)
            .unwrap();
        let ids64 = g.input("ids64", [2], DType::I64).unwrap();
        let xd = g.input("x64", [2, 3], DType::F64).unwrap();

        let wt = g.transpose(w, &[1, 0]).unwrap();
        let h = g.matmul(x, wt).unwrap();
        let h = g.add(h, b).unwrap(); // broadcast + add
        let zero = g.full(0.0, [2, 3], DType::F32).unwrap();
        let mask = g.compare(CmpOp::Gt, h, zero).unwrap();
        let r = g.select(mask, h, zero).unwrap();
        let mut e = r;
        for u in [
            UnaryOp::Neg,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Tanh,
            UnaryOp::Recip,
            UnaryOp::Erf,
        ] {
            e = g.unary(u, e).unwrap();
        }
        for op in [
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Max,
            BinaryOp::Min,
        ] {
            e = g.binary(op, e, r).unwrap();
        }
        let mut masks = vec![];
        for op in [CmpOp::Lt, CmpOp::Le, CmpOp::Ge, CmpOp::Eq, CmpOp::Ne] {
            masks.push(g.compare(op, e, r).unwrap());
        }
        let flat = g.reshape(e, [6]).unwrap();
        let sl = g.slice(flat, 0, 1, 4).unwrap();
        let cat = g.concat(&[sl, sl, flat], 0).unwrap();
        let s = g.sum(cat, &[0]).unwrap();
        let mx = g.max(e, &[0, 1]).unwrap();
        let _ = g.sum_all(mx).unwrap();
        let rows = g.gather(w, ids).unwrap();
        let rows64 = g.gather(w, ids64).unwrap();
        let back = g.scatter_add(ids, rows, 3).unwrap();
        let _ = g.scatter_add(ids64, rows64, 5).unwrap();
        let io = g.iota([2, 3], 1, DType::I64).unwrap();
        let iof = g.convert(io, DType::F64).unwrap();
        let _ = g.add(iof, xd).unwrap();
        let _ = g.convert(masks[0], DType::F32).unwrap();
        let _ = g.full(1.0, [], DType::Bool).unwrap();
        let _ = g.full(-7.0, [2], DType::I32).unwrap();
        let _ = g.full(f64::INFINITY, [], DType::F64).unwrap();
        // bf16 storage: a cast in, arithmetic, a cast out.
        let hb = g.convert(h, DType::BF16).unwrap();
        let hb = g.mul(hb, hb).unwrap();
        let _ = g.convert(hb, DType::F32).unwrap();
        // A bf16 product accumulated into an f32 value.
        let xb = g.convert(x, DType::BF16).unwrap();
        let wb = g.convert(w, DType::BF16).unwrap();
        let _ = g.matmul_acc(h, xb, wb, false, true).unwrap();
        let seed = g.input("dropout_seed", [], DType::I64).unwrap();
        let _ = g
            .dropout_mask(h, seed, 0.125, 0xdead_beef_0123_4567)
            .unwrap();

        let newm = g.add(m, back).unwrap();
        let lr = g.full(0.1, [3, 4], DType::F32).unwrap();
        let step = g.mul(newm, lr).unwrap();
        let neww = g.sub(w, step).unwrap();
        g.set_output("loss", s).unwrap();
        g.set_output("max", mx).unwrap();
        g.set_update(w, neww).unwrap();
        g.set_update(m, newm).unwrap();
        g
    }

    fn parse_err(text: &str) -> (usize, String) {
        match parse(text) {
            Err(IrError::Parse { line, reason }) => (line, reason),
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    #[test]
    fn a_bf16_op_on_an_f32_operand_without_a_cast_is_a_type_error_naming_the_line() {
        let good = "ingot-ir 1\n%0 = input \"x\" : f32[2,3]\n%1 = input \"h\" : bf16[2,3]\n\
                    %2 = convert(%0) : bf16[2,3]\n%3 = add(%2, %1) : bf16[2,3]\noutput \"y\" = %3\n";
        let g = parse(good).unwrap();
        assert_eq!(g.ty(NodeId(3)).dtype, DType::BF16);
        assert_eq!(g.ty(NodeId(3)).bytes(), 12, "bf16 is 2 bytes an element");
        assert_eq!(print(&g), good, "bf16 prints as it parses");
        let bad = "ingot-ir 1\n%0 = input \"x\" : f32[2,3]\n%1 = input \"h\" : bf16[2,3]\n\
                   %2 = add(%0, %1) : bf16[2,3]\n";
        let (line, reason) = parse_err(bad);
        assert_eq!(line, 4, "{reason}");
        assert!(
            reason.contains("f32") && reason.contains("bf16"),
            "{reason}"
        );
    }

    #[test]
    fn the_reference_graph_uses_every_op_and_every_dtype() {
        let g = every_op_graph();
        let names: Vec<&str> = g.op_histogram().keys().copied().collect();
        let all = [
            "add",
            "broadcast",
            "concat",
            "convert",
            "div",
            "dropout",
            "eq",
            "erf",
            "exp",
            "full",
            "gather",
            "ge",
            "gt",
            "input",
            "iota",
            "le",
            "log",
            "lt",
            "matmul",
            "matmul_acc",
            "max",
            "min",
            "mul",
            "ne",
            "neg",
            "parameter",
            "recip",
            "reduce_max",
            "reduce_sum",
            "reshape",
            "scatter_add",
            "select",
            "slice",
            "sqrt",
            "state",
            "sub",
            "tanh",
            "transpose",
        ];
        for op in all {
            assert!(names.contains(&op), "missing op {op}");
            assert!(
                op_by_name(op).is_some_and(|o| o.name() == op),
                "op_by_name disagrees with Op::name for {op}"
            );
        }
        for d in DType::ALL {
            assert!(
                g.nodes().iter().any(|n| n.ty.dtype == d),
                "missing dtype {d}"
            );
        }
    }

    #[test]
    fn print_then_parse_gives_an_equal_graph_and_the_same_text() {
        let g = every_op_graph();
        g.verify().unwrap();
        let text = print(&g);
        let back = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, g);
        back.verify().unwrap();
        assert_eq!(print(&back), text);
        assert_eq!(back.to_string(), text);
        assert_eq!(text.parse::<Graph>().unwrap(), g);
    }

    #[test]
    fn the_printed_form_reads_as_documented() {
        let mut g = Graph::new();
        let w = g
            .parameter(
                "fc1.weight",
                [1024, 784],
                DType::F32,
                Init::Normal { std: 0.02 },
            )
            .unwrap();
        let x = g.input("x", [256, 784], DType::F32).unwrap();
        let wt = g.transpose(w, &[1, 0]).unwrap();
        let h = g.matmul(x, wt).unwrap();
        let s = g.sum(h, &[1]).unwrap();
        let y = g.slice(s, 0, 0, 2).unwrap();
        g.set_output("loss", y).unwrap();
        let expected = "\
ingot-ir 1
%0 = parameter \"fc1.weight\" init=normal(0.02) : f32[1024,784]
%1 = input \"x\" : f32[256,784]
%2 = transpose(%0) perm=[1,0] : f32[784,1024]
%3 = matmul(%1, %2) : f32[256,1024]
%4 = reduce_sum(%3) axes=[1] : f32[256,1]
%5 = slice(%4) axis=0 start=0 end=2 : f32[2,1]
output \"loss\" = %5
";
        assert_eq!(print(&g), expected);
    }

    #[test]
    fn an_all_gather_round_trips_and_concatenates_the_ranks_along_axis_0() {
        let text = "ingot-ir 1
%0 = input \"x\" : f32[3,5]
%1 = all_gather(%0) ranks=2 : f32[6,5]
output \"loss\" = %1
";
        let g = parse(text).unwrap();
        assert_eq!(print(&g), text);
        for (bad, says) in [
            ("%1 = all_gather(%0) ranks=2 : f32[3,5]", "stated result"),
            ("%1 = all_gather(%0) ranks=1 : f32[3,5]", "needs ranks >= 2"),
            ("%1 = all_gather(%0) : f32[6,5]", "ranks"),
        ] {
            let text = format!("ingot-ir 1\n%0 = input \"x\" : f32[3,5]\n{bad}\n");
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("line 3"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_reduce_scatter_and_its_results_round_trip_and_keep_a_ranks_rows() {
        let text = "ingot-ir 1
%0 = input \"a\" : f32[8,3]
%1 = input \"b\" : f32[6]
%2 = reduce_scatter(%0, %1) ranks=2 : f32[4,3]
%3 = result(%2) index=1 : f32[3]
output \"a\" = %2
output \"b\" = %3
";
        let g = parse(text).unwrap();
        g.verify().unwrap();
        assert_eq!(g.node(NodeId(2)).op, Op::ReduceScatter { ranks: 2 });
        assert_eq!(print(&g), text);
        assert_eq!(print(&g).parse::<Graph>().unwrap(), g);
        let head = "ingot-ir 1\n%0 = input \"a\" : f32[8,3]\n%1 = input \"b\" : f32[6]\n";
        for (bad, says) in [
            (
                "%2 = reduce_scatter(%0, %1) ranks=2 : f32[8,3]",
                "stated result",
            ),
            (
                "%2 = reduce_scatter(%0, %1) ranks=4 : f32[2,3]",
                "do not divide among 4",
            ),
            (
                "%2 = reduce_scatter(%0) ranks=1 : f32[8,3]",
                "needs ranks >= 2",
            ),
            ("%2 = reduce_scatter(%0) : f32[4,3]", "ranks"),
        ] {
            let e = parse(&format!("{head}{bad}\n")).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("line 4"), "{bad}: {e}");
        }
        // A result typed as the whole operand, not a rank's rows of it: the verifier says so.
        let whole = format!(
            "{head}%2 = reduce_scatter(%0, %1) ranks=2 : f32[4,3]\n%3 = result(%2) index=1 : f32[6]\n"
        );
        let e = parse(&whole).unwrap().verify().unwrap_err().to_string();
        assert!(e.contains("typed f32[6] but the output is f32[3]"), "{e}");
    }

    #[test]
    fn f64_constants_round_trip_bit_for_bit() {
        let values = [
            0.1,
            1e-8,
            -0.0,
            0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::MIN,
            1.0 / 3.0,
            -2.5e300,
            123456789.0,
        ];
        for v in values {
            let mut g = Graph::new();
            g.full(v, [2], DType::F64).unwrap();
            // A standard deviation must be finite and not negative; the constant takes any.
            let std_of = if v.is_finite() && v >= 0.0 {
                v
            } else {
                v.abs().min(f64::MAX)
            };
            g.parameter("p", [1], DType::F32, Init::Normal { std: std_of })
                .unwrap();
            let back = parse(&print(&g)).unwrap();
            let Op::Full { value } = back.node(NodeId(0)).op else {
                panic!()
            };
            assert_eq!(
                value.to_bits(),
                v.to_bits(),
                "{v:?} printed as {}",
                print(&g)
            );
            let Op::Leaf {
                init: Init::Normal { std },
                ..
            } = back.node(NodeId(1)).op
            else {
                panic!()
            };
            assert_eq!(std.to_bits(), std_of.to_bits());
        }
    }

    #[test]
    fn a_normal_init_with_a_nan_infinite_or_negative_std_is_an_error_naming_the_line() {
        for bad in ["nan", "inf", "-inf", "-0.35", "-1e-300"] {
            let text = format!(
                "ingot-ir 1\n%0 = input \"x\" : f32[2]\n%1 = parameter \"w\" init=normal({bad}) : f32[2]\n"
            );
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains("line 3"), "{bad}: {e}");
            assert!(
                e.contains("normal(") && e.contains("standard deviation"),
                "{bad}: {e}"
            );
        }
        // Zero is a valid standard deviation (the leaf starts at zeros).
        parse("ingot-ir 1\n%0 = parameter \"w\" init=normal(0) : f32[2]\n").unwrap();
    }

    #[test]
    fn a_shape_whose_bytes_overflow_is_an_error_naming_the_line_and_the_shape() {
        let text = "ingot-ir 1\n%0 = input \"x\" : f32[4611686018427387904,4]\n";
        let e = parse(text).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("4611686018427387904"),
            "{e}"
        );
        // Each dimension fits, their product does not.
        let text = "ingot-ir 1\n%0 = parameter \"w\" init=zeros : f32[4294967296,4294967296]\n";
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("too large"), "{e}");
    }

    #[test]
    fn nan_inf_and_minus_inf_are_accepted_as_written() {
        let g = parse("ingot-ir 1\n%0 = full value=nan : f32[]\n%1 = full value=inf : f32[]\n%2 = full value=-inf : f64[2]\n")
            .unwrap();
        let v = |i| match g.node(NodeId(i)).op {
            Op::Full { value } => value,
            _ => unreachable!(),
        };
        assert!(v(0).is_nan());
        assert_eq!(v(1), f64::INFINITY);
        assert_eq!(v(2), f64::NEG_INFINITY);
        assert!(print(&g).contains("value=nan"));
        let again = parse(&print(&g)).unwrap();
        assert_eq!(print(&again), print(&g));
    }

    #[test]
    fn names_with_quotes_backslashes_and_control_characters_round_trip() {
        for name in [
            "a\"b",
            "back\\slash",
            "tab\there",
            "new\nline",
            "bell\u{7}",
            "# hash",
            "üñï©ødé",
            "%0 = x",
        ] {
            let mut g = Graph::new();
            let p = g.parameter(name, [2], DType::F32, Init::Ones).unwrap();
            g.set_output(name, p).unwrap();
            let text = print(&g);
            assert_eq!(text.lines().count(), 3, "one line per entry: {text}");
            assert_eq!(parse(&text).unwrap(), g, "{text}");
        }
    }

    #[test]
    fn comments_blank_lines_and_spacing_are_ignored() {
        let text = "# a leading comment\n\n  ingot-ir   1   # the header\n\n%0=input \"x\":f32[2,3]#c\n  %1 = neg( %0 )  :  f32[ 2 , 3 ]\noutput \"y\"=%1\n";
        let g = parse(text).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g.outputs["y"], NodeId(1));
    }

    #[test]
    fn attributes_may_come_in_any_order() {
        let a = parse(
            "ingot-ir 1\n%0 = input \"x\" : f32[5]\n%1 = slice(%0) end=4 axis=0 start=1 : f32[3]\n",
        )
        .unwrap();
        assert_eq!(
            a.node(NodeId(1)).op,
            Op::Slice {
                axis: 0,
                start: 1,
                end: 4
            }
        );
    }

    #[test]
    fn a_header_alone_is_an_empty_graph() {
        assert_eq!(parse("ingot-ir 1\n").unwrap(), Graph::new());
    }

    /// Each case: the text, the line the error must name, and words the reason must contain.
    #[test]
    fn each_error_names_its_line_and_the_offending_token() {
        let h = "ingot-ir 1\n%0 = input \"x\" : f32[2,3]\n";
        let cases: Vec<(String, usize, &[&str])> = vec![
            ("".into(), 1, &["empty", "ingot-ir 1"]),
            ("# only a comment\n".into(), 1, &["empty"]),
            ("%0 = input \"x\" : f32[]\n".into(), 1, &["header", "`%0`"]),
            ("ingot-ir 2\n".into(), 1, &["unsupported version", "`2`"]),
            ("ingot-ir\n".into(), 1, &["version", "end of the line"]),
            ("ingot-ir 1 extra\n".into(), 1, &["`extra`"]),
            (format!("{h}%1 = frobnicate(%0) : f32[2,3]\n"), 3, &["unknown op", "`frobnicate`"]),
            (format!("{h}%2 = neg(%0) : f32[2,3]\n"), 3, &["`%2`", "out of order", "`%1`"]),
            (format!("{h}%0 = neg(%0) : f32[2,3]\n"), 3, &["`%0`", "out of order"]),
            (format!("{h}%1 = neg(%7) : f32[2,3]\n"), 3, &["`%7`", "not defined"]),
            (format!("{h}%1 = neg(%1) : f32[2,3]\n"), 3, &["`%1`", "not defined"]),
            (format!("{h}%1 = neg(%x) : f32[2,3]\n"), 3, &["`%x`"]),
            (format!("{h}%1 = neg(%0)\n"), 3, &["result type", "end of the line"]),
            (format!("{h}%1 = neg(%0) : f33[2,3]\n"), 3, &["unknown dtype", "`f33`"]),
            (format!("{h}%1 = neg(%0) : f32[2,x]\n"), 3, &["bad number", "`x`"]),
            (format!("{h}%1 = neg(%0) : f32[2,-3]\n"), 3, &["bad number", "`-3`"]),
            (format!("{h}%1 = neg(%0) : f32[2,3] junk\n"), 3, &["`junk`"]),
            (format!("{h}%1 = neg(%0) : f32[99999999999999999999]\n"), 3, &["bad number"]),
            (format!("{h}%1 = neg(%0) : f32[4611686018427387904,8]\n"), 3, &["too large"]),
            (format!("{h}%1 = neg(%0) bogus=1 : f32[2,3]\n"), 3, &["unknown attribute", "`bogus`", "`neg`"]),
            (format!("{h}%1 = transpose(%0) perm=[1,0] axis=1 : f32[3,2]\n"), 3, &["unknown attribute", "`axis`"]),
            (format!("{h}%1 = transpose(%0) : f32[3,2]\n"), 3, &["`transpose`", "`perm=`"]),
            (format!("{h}%1 = transpose(%0) perm=1 : f32[3,2]\n"), 3, &["`perm=`", "`1`"]),
            (format!("{h}%1 = transpose(%0) perm=[1,0 : f32[3,2]\n"), 3, &["`,` or `]`", "`:`"]),
            (format!("{h}%1 = slice(%0) axis=0 start=0 : f32[1,3]\n"), 3, &["`end=`"]),
            (format!("{h}%1 = slice(%0) axis=0 start=0 end=1 end=1 : f32[1,3]\n"), 3, &["`end`", "twice"]),
            (format!("{h}%1 = full value=abc : f32[]\n"), 3, &["bad number", "`abc`"]),
            (format!("{h}%1 = full value=1.0.0 : f32[]\n"), 3, &["bad number", "`1.0.0`"]),
            (format!("{h}%1 = iota axis=-1 : i32[3]\n"), 3, &["bad number", "`-1`"]),
            (format!("{h}%1 = parameter init=zeros : f32[]\n"), 3, &["name in quotes"]),
            (format!("{h}%1 = parameter \"w\" : f32[]\n"), 3, &["`init=`"]),
            (format!("{h}%1 = parameter \"w\" init=laplace(1) : f32[]\n"), 3, &["`init=`", "`laplace(1)`"]),
            (format!("{h}%1 = parameter \"w\" init=normal(x) : f32[]\n"), 3, &["bad number", "`x`"]),
            (format!("{h}%1 = parameter \"x\" init=zeros : f32[]\n"), 3, &["two leaves", "\"x\""]),
            (format!("{h}%1 = parameter \"w : f32[]\n"), 3, &["unterminated string"]),
            (format!("{h}%1 = parameter \"w\\q\" init=zeros : f32[]\n"), 3, &["unknown escape", "\\q"]),
            (format!("{h}%1 = neg(%0) \"name\" : f32[2,3]\n"), 3, &["`neg`", "no name"]),
            (format!("{h}%1 = neg(%0 %0) : f32[2,3]\n"), 3, &["`,` or `)`", "`%0`"]),
            // Type errors from Graph::push keep their message and gain the line.
            (format!("{h}%1 = neg(%0) : f32[3,2]\n"), 3, &["neg", "stated result f32[3,2]", "f32[2,3]"]),
            (format!("{h}%1 = matmul(%0, %0) : f32[2,3]\n"), 3, &["matmul", "inner dimensions"]),
            (format!("{h}%1 = matmul_acc(%0, %0, %0) : f32[2,3]\n"), 3, &["matmul_acc", "%1", "inner dimensions"]),
            (format!("{h}%1 = neg : f32[2,3]\n"), 3, &["neg", "operand"]),
            (format!("{h}%1 = broadcast(%0) : f32[5,3]\n"), 3, &["broadcast", "cannot broadcast"]),
            (format!("{h}output \"y\" = %0\noutput \"y\" = %0\n"), 4, &["\"y\"", "twice", "line 3"]),
            (format!("{h}output y = %0\n"), 3, &["output's name", "`y`"]),
            (format!("{h}output \"y\" = %4\n"), 3, &["`%4`", "not defined"]),
            (format!("{h}output \"y\" %0\n"), 3, &["`=`", "`%0`"]),
            (format!("{h}update %0 = %0\n"), 3, &["update target", "input"]),
            (format!("{h}update %0 = %3\n"), 3, &["`%3`", "not defined"]),
            (format!("{h}%1 = parameter \"w\" init=ones : f32[2,3]\nupdate %1 = %0\nupdate %1 = %0\n"), 5, &["twice", "line 4"]),
            (format!("{h}frobnicate\n"), 3, &["`frobnicate`", "`%1 = ...`"]),
            (format!("{h}\n\n# comment\n%1 = neg(%0) : f32[2]\n"), 6, &["neg"]),
            (format!("{h}%1 = concat(%0, %0) axis=9 : f32[2,3]\n"), 3, &["concat", "axis 9"]),
            (format!("{h}%1 = attention(%0, %0, %0) scale=1 layout=sideways : f32[2,3]\n"), 3, &["`layout=`", "`packed`"]),
            (format!("{h}%1 = attention(%0) scale=1 layout=packed : f32[2,3]\n"), 3, &["attention", "qkv [batch, seq, 3, heads, head_dim]", "f32[2,3]"]),
            (format!("{h}%1 = attention(%0, %0, %0) scale=1 layout=tokens : f32[2,3]\n"), 3, &["attention", "rank 4"]),
            (format!("{h}%1 = attention(%0, %0, %0) scale=1 layout=packed : f32[2,3]\n"), 3, &["attention", "takes 1 operand(s) (qkv), got 3"]),
        ];
        for (text, line, words) in cases {
            let (got_line, reason) = parse_err(&text);
            assert_eq!(got_line, line, "wrong line for {text:?}: {reason}");
            for w in words {
                assert!(
                    reason.contains(w),
                    "reason for {text:?} should contain {w:?}: {reason}"
                );
            }
            // The Display form starts with the line, so users see it first.
            let shown = IrError::Parse {
                line: got_line,
                reason: reason.clone(),
            }
            .to_string();
            assert!(shown.starts_with(&format!("line {line}: ")));
        }
    }

    #[test]
    fn an_integer_inputs_declared_id_bound_round_trips_and_only_an_integer_input_takes_one() {
        let text = "ingot-ir 1\n%0 = input \"y\" init=ids(7) : i64[2,3]\n";
        let g = parse(text).unwrap();
        assert!(matches!(
            g.node(NodeId(0)).op,
            Op::Leaf {
                init: Init::Ids { bound: 7 },
                ..
            }
        ));
        assert_eq!(parse(&print(&g)).unwrap(), g);
        for bad in [
            "%0 = input \"y\" init=ids(0) : i64[2]",
            "%0 = input \"y\" init=ids(2.5) : i64[2]",
            "%0 = input \"x\" init=ids(7) : f32[2]",
            "%0 = parameter \"w\" init=ids(7) : i64[2]",
        ] {
            let e = parse(&format!("ingot-ir 1\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("line 2") && e.contains("ids"), "{bad}: {e}");
        }
    }

    #[test]
    fn concat_sizes_that_would_overflow_are_an_error_not_a_panic() {
        let text = "ingot-ir 1\n%0 = input \"x\" : bool[9223372036854775807]\n%1 = concat(%0, %0, %0) axis=0 : bool[1]\n";
        let (line, reason) = parse_err(text);
        assert_eq!(line, 3);
        assert!(reason.contains("concat"), "{reason}");
    }

    #[test]
    fn the_tiny_mlp_example_parses_and_verifies() {
        let text = include_str!("../../../docs/examples/tiny-mlp.ir");
        let g = parse(text).unwrap_or_else(|e| panic!("docs/examples/tiny-mlp.ir: {e}"));
        g.verify().unwrap();
        let loss = g.outputs["loss"];
        assert_eq!(*g.ty(loss), TensorType::new(Shape::scalar(), DType::F32));
        assert_eq!(g.leaves(LeafKind::Parameter).len(), 4);
        assert_eq!(g.leaves(LeafKind::Input).len(), 2);
        // Its printed form (comments dropped) reads back to the same graph.
        assert_eq!(parse(&print(&g)).unwrap(), g);
    }

    /// Small edits of a valid text: the parser must answer (Ok or Err), never panic.
    #[derive(Debug, Clone)]
    enum Mutation {
        Truncate(usize),
        DeleteChar(usize),
        InsertChar(usize, char),
        ReplaceChar(usize, char),
        SwapLines(usize, usize),
        DuplicateLine(usize),
        DeleteLine(usize),
    }

    fn apply(text: &str, m: &Mutation) -> String {
        let chars: Vec<char> = text.chars().collect();
        let n = chars.len().max(1);
        let mut lines: Vec<&str> = text.lines().collect();
        let nl = lines.len().max(1);
        match *m {
            Mutation::Truncate(i) => chars[..i % n].iter().collect(),
            Mutation::DeleteChar(i) => chars
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != i % n)
                .map(|(_, c)| c)
                .collect(),
            Mutation::InsertChar(i, c) => {
                let mut v = chars.clone();
                v.insert(i % n, c);
                v.into_iter().collect()
            }
            Mutation::ReplaceChar(i, c) => {
                let mut v = chars.clone();
                if !v.is_empty() {
                    v[i % n] = c;
                }
                v.into_iter().collect()
            }
            Mutation::SwapLines(a, b) => {
                if !lines.is_empty() {
                    lines.swap(a % nl, b % nl);
                }
                lines.join("\n")
            }
            Mutation::DuplicateLine(a) => {
                if !lines.is_empty() {
                    let l = lines[a % nl];
                    lines.insert(a % nl, l);
                }
                lines.join("\n")
            }
            Mutation::DeleteLine(a) => {
                if !lines.is_empty() {
                    lines.remove(a % nl);
                }
                lines.join("\n")
            }
        }
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        let ch = prop_oneof![
            prop::sample::select(vec![
                '%', '=', '(', ')', '[', ']', ',', ':', '"', '\\', '#', ' ', '\n', '0', '9', '-',
                'e', 'x'
            ]),
            any::<char>(),
        ];
        prop_oneof![
            any::<usize>().prop_map(Mutation::Truncate),
            any::<usize>().prop_map(Mutation::DeleteChar),
            (any::<usize>(), ch.clone()).prop_map(|(i, c)| Mutation::InsertChar(i, c)),
            (any::<usize>(), ch).prop_map(|(i, c)| Mutation::ReplaceChar(i, c)),
            (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
            any::<usize>().prop_map(Mutation::DuplicateLine),
            any::<usize>().prop_map(Mutation::DeleteLine),
        ]
    }

    /// After a parse, whatever comes back is either a graph that verifies and round-trips, or a
    /// parse error with a line inside the text.
    fn check_answer(text: &str) {
        match parse(text) {
            Ok(g) => {
                g.verify().unwrap();
                let printed = print(&g);
                let again = parse(&printed).unwrap();
                assert_eq!(print(&again), printed);
            }
            Err(IrError::Parse { line, .. }) => {
                assert!(line >= 1 && line <= text.lines().count().max(1))
            }
            Err(e) => panic!("non-parse error {e:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn random_strings_never_make_the_parser_panic(s in ".*") {
            check_answer(&s);
            check_answer(&format!("ingot-ir 1\n{s}"));
        }

        #[test]
        fn random_token_soup_never_makes_the_parser_panic(
            parts in prop::collection::vec(prop::sample::select(vec![
                "%0", "%1", "%2", "=", "(", ")", "[", "]", ",", ":", "\"x\"", "\"", "input", "parameter",
                "add", "concat", "slice", "reduce_sum", "full", "f32", "i32", "bool", "[]", "0", "1", "2",
                "18446744073709551615", "axis=", "perm=", "init=", "normal(", "nan", "output", "update", "\n", " ",
            ]), 0..60)
        ) {
            check_answer(&format!("ingot-ir 1\n{}", parts.join(" ")));
            check_answer(&format!("ingot-ir 1\n{}", parts.concat()));
        }

        #[test]
        fn mutations_of_a_valid_text_never_make_the_parser_panic(ms in prop::collection::vec(mutation(), 1..4)) {
            let mut text = print(&every_op_graph());
            for m in &ms {
                text = apply(&text, m);
            }
            check_answer(&text);
        }

        #[test]
        fn any_leaf_name_round_trips(name in "\\PC*|.*", std in 0.0..f64::MAX) {
            prop_assume!(!name.is_empty());
            let mut g = Graph::new();
            let p = g.parameter(&name, [1], DType::F32, Init::Normal { std }).unwrap();
            g.set_output(&name, p).unwrap();
            let back = parse(&print(&g)).unwrap();
            prop_assert_eq!(print(&back), print(&g));
            prop_assert_eq!(back.leaf_name(NodeId(0)), Some(name.as_str()));
        }
    }
}
