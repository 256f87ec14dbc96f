//! Parsing: the text form read back into a graph, line by line, each error naming its line
//! and the offending token.

use super::header::{MAGIC, VERSION};
use super::layers::{layer_named, Layer, LayerDoc, Layers};
use super::print::quote;
use super::tokens::{tokenize, Tok};
use crate::error::IrError;
use crate::ir::graph::{Graph, Mode, NodeId};
use crate::ir::op::{AttentionLayout, Axes, Init, LeafKind, Op};
use crate::ir::shape::Shape;
use crate::ir::tensor_type::TensorType;
use crate::ir::window::WindowOp;
use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use std::collections::HashMap;
use std::fmt;

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
    parse_with(text, mode, None).map(|p| p.graph)
}

/// A graph read from its text form, with the line each of its nodes was read from.
#[derive(Debug)]
pub struct Parsed {
    pub graph: Graph,
    /// The 1-based line of each node, by node index. A layer line's nodes all have its line.
    pub lines: Vec<usize>,
}

/// [`parse_in`], with layer lines ([`super::layers`]) built by `layers`. Without `layers` a
/// layer line is an error naming it. With them, the `%N` of a line names the line's result:
/// a layer line adds several nodes, so the graph's node ids are then no longer the file's.
pub fn parse_with(text: &str, mode: Mode, layers: Option<&dyn Layers>) -> Result<Parsed, IrError> {
    let mut g = Graph::new();
    g.set_mode(mode);
    let mut header = false;
    let mut output_lines: HashMap<String, usize> = HashMap::new();
    let mut update_lines: HashMap<usize, usize> = HashMap::new();
    // The graph node each `%N` of the file names, and the line of each graph node.
    let mut ids: Vec<NodeId> = Vec::new();
    let mut lines: Vec<usize> = Vec::new();
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
            Some(Tok::Ref(_)) => {
                read_node(&mut c, &mut g, &mut ids, layers).map_err(err)?;
                lines.resize(g.len(), line);
            }
            Some(Tok::Word("output")) => {
                c.next();
                let name = c.string("the output's name in quotes").map_err(err)?;
                c.punct('=', "`=` after the output's name").map_err(err)?;
                let id = c.node_ref(&ids, "the output's node").map_err(err)?;
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
                    .node_ref(&ids, "the updated parameter or state, like `%0`")
                    .map_err(err)?;
                c.punct('=', "`=` after the update's target").map_err(err)?;
                let value = c.node_ref(&ids, "the new value, like `%9`").map_err(err)?;
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
                    ids.len()
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
    Ok(Parsed { graph: g, lines })
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

    /// A reference to a node already defined: `ids` maps the file's `%N` to graph nodes.
    fn node_ref(&mut self, ids: &[NodeId], what: &str) -> Result<NodeId, String> {
        match self.peek() {
            Some(&Tok::Ref(n)) => {
                self.pos += 1;
                defined(ids, n)
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

fn defined(ids: &[NodeId], n: usize) -> Result<NodeId, String> {
    if let Some(&id) = ids.get(n) {
        Ok(id)
    } else if ids.is_empty() {
        Err(format!("`%{n}` is not defined (no node is defined yet)"))
    } else {
        Err(format!(
            "`%{n}` is not defined (nodes so far are %0 to %{}; operands must be defined on earlier lines)",
            ids.len() - 1
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

    fn optional_word(&mut self, key: &str) -> Result<Option<String>, String> {
        if !self.has(key) {
            return Ok(None);
        }
        match self.take(key)? {
            Value::Word(w) => Ok(Some(w.to_string())),
            v => Err(format!("`{key}=` must be one word, found {v}")),
        }
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
pub(super) fn op_by_name(name: &str) -> Option<Op> {
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

/// Reads one node line (a layer line's several nodes) into `g`.
fn read_node(
    c: &mut Cursor<'_>,
    g: &mut Graph,
    ids: &mut Vec<NodeId>,
    layers: Option<&dyn Layers>,
) -> Result<(), String> {
    let Some(Tok::Ref(id)) = c.next() else {
        return Err("expected a node id like `%0`".into());
    };
    if id != ids.len() {
        return Err(format!(
            "node `%{id}` is out of order: the next node must be `%{}` (ids count up from %0 with no gaps)",
            ids.len()
        ));
    }
    c.punct('=', &format!("`=` after `%{id}`"))?;
    let word = c.word("an op name, like `add` or `matmul`")?;
    let op = op_by_name(word);
    let is_layer = super::layers::LAYERS.iter().any(|l| l.name == word);
    if op.is_none() && !is_layer {
        return Err(format!("unknown op `{word}`"));
    }

    let mut inputs: Vec<NodeId> = Vec::new();
    if c.is_punct('(') {
        c.next();
        if c.is_punct(')') {
            c.next();
        } else {
            loop {
                inputs.push(c.node_ref(ids, &format!("an operand of `{word}`, like `%0`"))?);
                if c.is_punct(')') {
                    c.next();
                    break;
                }
                c.punct(',', &format!("`,` or `)` in the operands of `{word}`"))?;
            }
        }
    }

    let name = match c.peek() {
        Some(Tok::Str(_)) => Some(c.string("a name")?),
        _ => None,
    };
    let layer = layer_named(word, name.is_some());
    let op_name = match (layer, &op) {
        (Some(l), _) => l.name,
        (None, Some(op)) => op.name(),
        (None, None) => return Err(format!("unknown op `{word}`")),
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

    if let Some(doc) = layer {
        let Some(layers) = layers else {
            return Err(format!(
                "`{op_name}` is a layer line, which `ir::text::parse` does not read: read the file with `Model::from_ir_text` (as `ingot --model-file` does) or `trace::layers::parse`"
            ));
        };
        let layer = read_layer(doc, name, inputs.len(), attrs, ty.dtype)?;
        let out = layers
            .build(g, &layer, &inputs)
            .map_err(|e| format!("`{op_name}`: {e}"))?;
        if g.ty(out) != &ty {
            return Err(format!(
                "`{op_name}` gives {}, but the line states {ty}",
                g.ty(out)
            ));
        }
        ids.push(out);
        return Ok(());
    }
    let Some(op) = op else {
        return Err(format!("unknown op `{word}`"));
    };
    ids.push(NodeId(g.len() as u32));
    // Type errors name the file's `%N`, which differs from the graph's node after a layer line.
    let in_file = |e: IrError| match e {
        IrError::Type {
            op,
            operands,
            reason,
            ..
        } => IrError::Type {
            op,
            node: id,
            operands,
            reason,
        }
        .to_string(),
        e => e.to_string(),
    };
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
        crate::ir::infer(&op, &types, Some(&ty), id).map_err(in_file)?;
        g.push(Op::Reshape, &inputs[..1], Some(ty))
            .map_err(in_file)?;
        return Ok(());
    }
    g.push(op, &inputs, Some(ty)).map_err(in_file)?;
    Ok(())
}

/// A layer line's [`Layer`], from its operand count, name string and attributes.
fn read_layer(
    doc: &LayerDoc,
    name: Option<String>,
    operands: usize,
    mut a: Attrs<'_>,
    dtype: DType,
) -> Result<Layer, String> {
    let l = doc.name;
    let want = doc.operands.split(',').count();
    if operands != want {
        return Err(format!(
            "`{l}` takes {want} operand(s), `{l}{}`, found {operands}",
            doc.operands
        ));
    }
    let name = match (doc.named, name) {
        (true, Some(n)) if !n.is_empty() => n,
        (true, _) => {
            return Err(format!(
                "`{l}` needs the layer's name in quotes after its operands, like `{l}(%0) \"fc1\"` (its parameters are named `fc1.weight`, ...)"
            ))
        }
        (false, Some(_)) => {
            return Err(format!("`{l}` takes no name string (it has no parameters)"));
        }
        (false, None) => String::new(),
    };
    let flag = |a: &mut Attrs<'_>, key: &str, default: bool| {
        if a.has(key) {
            a.take_bool_or_false(key)
        } else {
            Ok(default)
        }
    };
    let count = |a: &mut Attrs<'_>, key: &str, default: usize| {
        if a.has(key) {
            a.take_usize(key)
        } else {
            Ok(default)
        }
    };
    let layer = match l {
        "linear" => Layer::Linear {
            out: a.take_usize("out")?,
            bias: flag(&mut a, "bias", true)?,
            init: if a.has("init") {
                Some(a.take_init()?)
            } else {
                None
            },
            name,
        },
        "conv2d" => Layer::Conv2d {
            out: a.take_usize("out")?,
            kernel: a.take_usize("kernel")?,
            stride: count(&mut a, "stride", 1)?,
            padding: count(&mut a, "padding", 0)?,
            dilation: count(&mut a, "dilation", 1)?,
            groups: count(&mut a, "groups", 1)?,
            bias: flag(&mut a, "bias", true)?,
            name,
        },
        "layer_norm" => Layer::LayerNorm {
            eps: if a.has("eps") {
                a.take_f64("eps")?
            } else {
                1e-5
            },
            name,
        },
        "embedding" => Layer::Embedding {
            rows: a.take_usize("rows")?,
            dim: a.take_usize("dim")?,
            name,
            dtype,
        },
        "relu" => Layer::Relu,
        "gelu_tanh" => Layer::GeluTanh,
        "softmax" => Layer::Softmax,
        "log_softmax" => Layer::LogSoftmax,
        "cross_entropy" => Layer::CrossEntropy,
        "flatten" => Layer::Flatten,
        other => {
            return Err(format!(
                "`{other}` has no reader (a layer of the table without one)"
            ))
        }
    };
    let allowed = if doc.attributes == "-" {
        "it takes no attributes".to_string()
    } else {
        format!("it takes {}", doc.attributes)
    };
    a.finish(&allowed)?;
    Ok(layer)
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
