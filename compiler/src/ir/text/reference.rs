//! The IR's op table for people: every op the text form reads, with its operands, its
//! attributes, what it computes and a line that uses it. docs/ir-reference.md is generated from
//! this table ([`markdown`]), and the table is checked against the parser (tests below): each
//! entry's example parses to an op of the entry's name whose printed attributes are the ones the
//! entry lists, and every op name the parser reads has an entry. So the page cannot name an op,
//! or an attribute, that the parser does not read, and an op added to the parser fails the
//! tests until it is documented here.

use super::layers::LAYERS;
use ingot_kernels::{BinaryOp, CmpOp, UnaryOp};

/// One op of the text form.
#[derive(Clone, Copy, Debug)]
pub struct OpDoc {
    /// The op's name: exactly [`Op::name`](crate::ir::Op::name).
    pub name: &'static str,
    /// Its operands, in order (`(a, b)`), or `-` for a leaf or constant.
    pub operands: &'static str,
    /// Its attributes, `key=FORM` separated by spaces, optional ones marked; `-` for none.
    pub attributes: &'static str,
    /// What it computes.
    pub meaning: &'static str,
    /// Lines of the text form (no header) whose last node is this op: what the page shows and
    /// the tests parse. Empty for `fused`, whose attribute is a whole kernel, and in the
    /// elementwise entries, whose examples [`Entry`] makes.
    pub example: &'static str,
}

/// A group of ops, as the page lists them.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub title: &'static str,
    pub intro: &'static str,
    pub ops: &'static [OpDoc],
}

const fn op(
    name: &'static str,
    operands: &'static str,
    attributes: &'static str,
    meaning: &'static str,
    example: &'static str,
) -> OpDoc {
    OpDoc {
        name,
        operands,
        attributes,
        meaning,
        example,
    }
}

/// The elementwise ops' meanings, by name; their names themselves come from the kernels' op
/// tables ([`UnaryOp::ALL`], [`BinaryOp::ALL`], [`CmpOp::ALL`]).
const ELEMENTWISE: &[(&str, &str)] = &[
    ("neg", "`-a`"),
    ("exp", "`e^a`"),
    ("log", "the natural logarithm of `a`"),
    ("sqrt", "the square root of `a`"),
    ("tanh", "the hyperbolic tangent of `a`"),
    ("recip", "`1 / a`"),
    (
        "erf",
        "the error function of `a` (exact GELU is `a·½·(1 + erf(a/√2))`)",
    ),
    ("add", "`a + b`"),
    ("sub", "`a - b`"),
    ("mul", "`a · b`"),
    ("div", "`a / b`"),
    (
        "max",
        "the larger of `a` and `b` (`relu(a)` is `max(a, 0)`)",
    ),
    ("min", "the smaller of `a` and `b`"),
    ("lt", "`a < b`"),
    ("le", "`a <= b`"),
    ("gt", "`a > b`"),
    ("ge", "`a >= b`"),
    ("eq", "`a == b`"),
    ("ne", "`a != b`"),
];

/// The ops, group by group, in the page's order (the elementwise ops are added from the
/// kernels' tables by [`groups`]).
const GROUPS: &[Group] = &[
    Group {
        title: "Leaves and constants",
        intro: "Leaves are the step's named tensors: the planner keeps them resident. A model file gives parameters and inputs; `ingot` adds the optimizer's state.",
        ops: &[
            op(
                "parameter",
                "-",
                "a name string, `init=zeros|ones|normal(STD)|uniform(BOUND)`",
                "A trainable parameter, updated in place by the step. `init` is its value when no weights file is given (`normal` and `uniform` draw from the run's seeded generator; `uniform(B)` is on `[-B, B)`, PyTorch's default for linear and conv layers). PyTorch's names (`fc1.weight`) let safetensors files move between the two unchanged.",
                "%0 = parameter \"fc1.weight\" init=normal(0.02) : f32[16,8]",
            ),
            op(
                "state",
                "-",
                "a name string, `init=zeros|ones|normal(STD)|uniform(BOUND)`",
                "Optimizer state (a moment, a step count): resident, updated in place by the step.",
                "%0 = state \"fc1.weight.exp_avg\" init=zeros : f32[16,8]",
            ),
            op(
                "input",
                "-",
                "a name string; optional `init=ids(N)` (default `zeros`)",
                "A step input (a batch), written by the host before each step. `init=ids(N)` says an integer input's ids lie in `0..N` (a synthetic batch draws them there, a loaded one is checked).",
                "%0 = input \"y\" init=ids(10) : i64[4]",
            ),
            op(
                "full",
                "-",
                "`value=F` (any f64: `0.1`, `1e-8`, `-0.0`, `inf`, `-inf`, `nan`)",
                "A constant tensor with every element `value`.",
                "%0 = full value=0.125 : f32[4,2]",
            ),
            op(
                "iota",
                "-",
                "`axis=N`",
                "Each element is its index along `axis` (for masks and one-hot encodings).",
                "%0 = iota axis=1 : i64[4,10]",
            ),
        ],
    },
    Group {
        title: "Selection, conversion and gradients",
        intro: "",
        ops: &[
            op(
                "select",
                "(cond, a, b)",
                "-",
                "`a` where the bool `cond` is true, else `b` (all three of one shape).",
                "%0 = input \"c\" : bool[2,3]\n%1 = input \"a\" : f32[2,3]\n%2 = input \"b\" : f32[2,3]\n%3 = select(%0, %1, %2) : f32[2,3]",
            ),
            op(
                "convert",
                "(a)",
                "-",
                "`a` converted to the node's dtype (bf16 rounds to nearest even).",
                "%0 = input \"a\" : f32[2,3]\n%1 = convert(%0) : bf16[2,3]",
            ),
            op(
                "stop_gradient",
                "(a)",
                "-",
                "`a`, through which autodiff passes no gradient (softmax's max shift); removed once the backward pass exists.",
                "%0 = input \"a\" : f32[2,3]\n%1 = stop_gradient(%0) : f32[2,3]",
            ),
            op(
                "dropout",
                "(x, seed)",
                "`p=F` (in `[0, 1]`) `salt=N`",
                "`nn.Dropout(p)` in training mode: `x[i] / (1 - p)` where the counter-based draw of `(seed, salt, i)` is at least `p`, else 0. `seed` is an `i64` scalar (the step's seed input); nothing random is stored, so the gradient draws the same mask. `salt` tells layers apart.",
                "%0 = input \"x\" : f32[2,3]\n%1 = input \"seed\" : i64[]\n%2 = dropout(%0, %1) p=0.1 salt=7 : f32[2,3]",
            ),
        ],
    },
    Group {
        title: "Shapes",
        intro: "Binary, compare and select ops take operands of one shape: broadcasting is its own op, so its cost and its gradient (a sum) show.",
        ops: &[
            op(
                "broadcast",
                "(a)",
                "-",
                "NumPy broadcasting to the node's shape: axes align to the right, each equal or 1.",
                "%0 = input \"b\" : f32[3]\n%1 = broadcast(%0) : f32[2,3]",
            ),
            op(
                "reshape",
                "(a)",
                "-",
                "The same elements in a new shape (row-major order kept); shares its operand's bytes.",
                "%0 = input \"a\" : f32[2,3]\n%1 = reshape(%0) : f32[6]",
            ),
            op(
                "transpose",
                "(a)",
                "`perm=[N,...]`",
                "Output axis `i` is operand axis `perm[i]`.",
                "%0 = input \"a\" : f32[2,3]\n%1 = transpose(%0) perm=[1,0] : f32[3,2]",
            ),
            op(
                "slice",
                "(a)",
                "`axis=N start=N end=N`",
                "Elements `[start, end)` along `axis`.",
                "%0 = input \"a\" : f32[2,3]\n%1 = slice(%0) axis=1 start=0 end=2 : f32[2,2]",
            ),
            op(
                "concat",
                "(a, b, ...)",
                "`axis=N`",
                "The operands joined along `axis`.",
                "%0 = input \"a\" : f32[2,3]\n%1 = input \"b\" : f32[1,3]\n%2 = concat(%0, %1) axis=0 : f32[3,3]",
            ),
        ],
    },
    Group {
        title: "Reductions and products",
        intro: "",
        ops: &[
            op(
                "reduce_sum",
                "(a)",
                "`axes=[N,...]`",
                "The sum over `axes`, each kept as size 1 (a scalar is a `reshape` of the result).",
                "%0 = input \"a\" : f32[4,2]\n%1 = reduce_sum(%0) axes=[0,1] : f32[1,1]",
            ),
            op(
                "reduce_max",
                "(a)",
                "`axes=[N,...]`",
                "The maximum over `axes`, each kept as size 1.",
                "%0 = input \"a\" : f32[4,10]\n%1 = reduce_max(%0) axes=[1] : f32[4,1]",
            ),
            op(
                "matmul",
                "(a, b)",
                "optional `ta=true|false` `tb=true|false` (default `false`)",
                "The batched matrix product `[..., m, k] x [..., k, n] -> [..., m, n]` over equal batch axes; `ta` (`tb`) reads `a` (`b`) with its last two axes swapped, so a transposed weight is never copied. A linear layer is `matmul(x, w) tb=true`.",
                "%0 = input \"x\" : f32[4,8]\n%1 = parameter \"fc.weight\" init=normal(0.02) : f32[16,8]\n%2 = matmul(%0, %1) tb=true : f32[4,16]",
            ),
            op(
                "matmul_acc",
                "(c, a, b)",
                "optional `ta=true|false` `tb=true|false`",
                "`c + matmul(a, b)` as one product accumulated in f32 and rounded once; may be written over `c`. Made by fusion from `add(c, matmul(a, b))`.",
                "%0 = input \"c\" : f32[4,16]\n%1 = input \"x\" : f32[4,8]\n%2 = input \"w\" : f32[16,8]\n%3 = matmul_acc(%0, %1, %2) tb=true : f32[4,16]",
            ),
            op(
                "gather",
                "(table, ids)",
                "-",
                "`table [r, d...]` rows picked by integer `ids [i...]`: `[i..., d...]` (an embedding).",
                "%0 = parameter \"wte.weight\" init=normal(0.02) : f32[32,8]\n%1 = input \"x\" init=ids(32) : i64[2,4]\n%2 = gather(%0, %1) : f32[2,4,8]",
            ),
            op(
                "scatter_add",
                "(ids, values)",
                "`rows=N`",
                "The transpose of `gather`: `values [i..., d...]` added into rows `ids` of a zero `[rows, d...]` (an embedding's gradient).",
                "%0 = input \"x\" init=ids(32) : i64[2,4]\n%1 = input \"dy\" : f32[2,4,8]\n%2 = scatter_add(%0, %1) rows=32 : f32[32,8]",
            ),
        ],
    },
    Group {
        title: "Attention",
        intro: "Fused scaled dot-product attention: one kernel that never stores the scores (FlashAttention-2 on CUDA). Recognised in models written with softmax and matmuls; also written directly.",
        ops: &[
            op(
                "attention",
                "(q, k, v), or (qkv) with `layout=packed`",
                "`scale=F`; optional `causal=true|false` (default `false`), `layout=heads|tokens|packed` (default `heads`)",
                "`softmax(scale · q·kᵀ [causal mask]) · v`. `heads`: q `[.., Tq, D]`, k and v `[.., Tk, D]`; `tokens`: `[B, T, H, D]`; `packed`: one `[B, T, 3, H, D]`. Output 1 (a `result`) is `lse`, f32 `[.., Tq]`: each row's `ln Σ exp(scale · q·k)`, from which the backward pass recomputes the probabilities.",
                "%0 = input \"q\" : f32[2,4,8]\n%1 = input \"k\" : f32[2,4,8]\n%2 = input \"v\" : f32[2,4,8]\n%3 = attention(%0, %1, %2) scale=0.35355339059327373 causal=true : f32[2,4,8]",
            ),
            op(
                "attention_grad",
                "(q, k, v, out, lse, dout), or (qkv, out, lse, dout)",
                "those of `attention`",
                "The backward pass of `attention`: the gradients of its operands in their order (`dq`, then outputs 1 and 2 `dk`, `dv`; or one `dqkv`).",
                "%0 = input \"q\" : f32[2,4,8]\n%1 = input \"k\" : f32[2,4,8]\n%2 = input \"v\" : f32[2,4,8]\n%3 = attention(%0, %1, %2) scale=0.5 : f32[2,4,8]\n%4 = result(%3) index=1 : f32[2,4]\n%5 = input \"dout\" : f32[2,4,8]\n%6 = attention_grad(%0, %1, %2, %3, %4, %5) scale=0.5 : f32[2,4,8]",
            ),
            op(
                "result",
                "(node)",
                "`index=N` (at least 1)",
                "Output `index` of a node with several outputs (`attention`, `attention_grad`, `fused`, the collectives); written when that node runs.",
                "%0 = input \"q\" : f32[2,4,8]\n%1 = input \"k\" : f32[2,4,8]\n%2 = input \"v\" : f32[2,4,8]\n%3 = attention(%0, %1, %2) scale=0.5 : f32[2,4,8]\n%4 = result(%3) index=1 : f32[2,4]",
            ),
        ],
    },
    Group {
        title: "Convolution and pooling",
        intro: "NCHW images, PyTorch's semantics. A conv's bias is a `broadcast` and an `add`; average pooling is a conv with a constant weight.",
        ops: &[
            op(
                "conv2d",
                "(x, w)",
                "`stride=[A,B] padding=[A,B] dilation=[A,B] groups=N`",
                "`x [N,C,H,W]` convolved with `w [O,C/groups,kh,kw]` (cross-correlation, zeros outside the image): `[N,O,Ho,Wo]`, `Ho = (H + 2·padding − dilation·(kh − 1) − 1) / stride + 1`.",
                "%0 = input \"x\" : f32[1,2,5,5]\n%1 = parameter \"conv.weight\" init=uniform(0.2) : f32[3,2,3,3]\n%2 = conv2d(%0, %1) stride=[1,1] padding=[1,1] dilation=[1,1] groups=1 : f32[1,3,5,5]",
            ),
            op(
                "conv2d_grad_input",
                "(dy, w)",
                "those of `conv2d`, and `input=[H,W]`",
                "The gradient of `conv2d` in `x`, of spatial size `input`.",
                "%0 = input \"dy\" : f32[1,3,5,5]\n%1 = input \"w\" : f32[3,2,3,3]\n%2 = conv2d_grad_input(%0, %1) stride=[1,1] padding=[1,1] dilation=[1,1] groups=1 input=[5,5] : f32[1,2,5,5]",
            ),
            op(
                "conv2d_grad_weight",
                "(x, dy)",
                "those of `conv2d`, and `kernel=[KH,KW]`",
                "The gradient of `conv2d` in `w`, `[O, C/groups, KH, KW]`.",
                "%0 = input \"x\" : f32[1,2,5,5]\n%1 = input \"dy\" : f32[1,3,5,5]\n%2 = conv2d_grad_weight(%0, %1) stride=[1,1] padding=[1,1] dilation=[1,1] groups=1 kernel=[3,3] : f32[3,2,3,3]",
            ),
            op(
                "max_pool2d",
                "(x)",
                "`kernel=[A,B] stride=[A,B] padding=[A,B] dilation=[A,B]`",
                "The maximum of each window, padding being −∞ (the first maximum wins; a NaN wins over every number).",
                "%0 = input \"x\" : f32[1,2,4,4]\n%1 = max_pool2d(%0) kernel=[2,2] stride=[2,2] padding=[0,0] dilation=[1,1] : f32[1,2,2,2]",
            ),
            op(
                "max_pool2d_grad",
                "(x, dy)",
                "those of `max_pool2d`",
                "Each window's `dy` added at the element the forward pass picked (recomputed from `x`: no indices are stored).",
                "%0 = input \"x\" : f32[1,2,4,4]\n%1 = input \"dy\" : f32[1,2,2,2]\n%2 = max_pool2d_grad(%0, %1) kernel=[2,2] stride=[2,2] padding=[0,0] dilation=[1,1] : f32[1,2,4,4]",
            ),
        ],
    },
    Group {
        title: "Made by the compiler",
        intro: "These appear in printed step graphs (a `Graph`'s text, as in the ir-tests snapshots), made by fusion and by data parallelism; a model file does not need them.",
        ops: &[
            op(
                "fused",
                "the kernel's inputs",
                "the kernel as a quoted JSON string",
                "A fused kernel (a chain of elementwise ops and reductions that never writes its intermediates); its value is the kernel's output 0, other outputs through `result`.",
                "",
            ),
            op(
                "all_reduce",
                "(a, ...)",
                "`ranks=N`",
                "Data parallelism: the sum over `ranks` ranks of each operand (a bucket of gradients), written in place; output `i` through `result`.",
                "%0 = input \"g\" : f32[2,3]\n%1 = all_reduce(%0) ranks=2 : f32[2,3]",
            ),
            op(
                "all_gather",
                "(a)",
                "`ranks=N`",
                "Data parallelism: every rank's operand joined along axis 0, rank 0's first.",
                "%0 = input \"g\" : f32[2,3]\n%1 = all_gather(%0) ranks=2 : f32[4,3]",
            ),
            op(
                "reduce_scatter",
                "(a, ...)",
                "`ranks=N`",
                "Data parallelism: rank `r`'s rows of the sum over the ranks of each operand (ZeRO stage 1).",
                "%0 = input \"g\" : f32[2,3]\n%1 = reduce_scatter(%0) ranks=2 : f32[1,3]",
            ),
        ],
    },
];

/// One op of the page: an [`OpDoc`], its example owned (the elementwise ops' are made from
/// their names).
#[derive(Clone, Debug)]
pub struct Entry {
    pub doc: OpDoc,
    pub example: String,
}

impl Entry {
    fn of(doc: &OpDoc) -> Entry {
        Entry {
            doc: *doc,
            example: doc.example.to_string(),
        }
    }

    /// An elementwise op of `operands` (1 or 2) operands whose result has dtype `result`.
    fn elementwise(name: &'static str, operands: usize, result: &str) -> Entry {
        let meaning = ELEMENTWISE
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, m)| m);
        let example = match operands {
            1 => format!("%0 = input \"a\" : f32[2,3]\n%1 = {name}(%0) : {result}[2,3]"),
            _ => format!(
                "%0 = input \"a\" : f32[2,3]\n%1 = input \"b\" : f32[2,3]\n%2 = {name}(%0, %1) : {result}[2,3]"
            ),
        };
        Entry {
            doc: op(
                name,
                if operands == 1 { "(a)" } else { "(a, b)" },
                "-",
                meaning,
                "",
            ),
            example,
        }
    }
}

/// Every group with its entries, in the page's order: the elementwise ops (named by the
/// kernels' op tables) after the leaves.
pub fn groups() -> Vec<(Group, Vec<Entry>)> {
    let elementwise = Group {
        title: "Elementwise",
        intro: "One operand, or two of one shape and dtype; the result has their shape. Comparisons give `bool`.",
        ops: &[],
    };
    let entries: Vec<Entry> = UnaryOp::ALL
        .iter()
        .map(|u| Entry::elementwise(u.name(), 1, "f32"))
        .chain(
            BinaryOp::ALL
                .iter()
                .map(|b| Entry::elementwise(b.name(), 2, "f32")),
        )
        .chain(
            CmpOp::ALL
                .iter()
                .map(|c| Entry::elementwise(c.name(), 2, "bool")),
        )
        .collect();
    let table = |g: &Group| (*g, g.ops.iter().map(Entry::of).collect::<Vec<_>>());
    let mut out = vec![table(&GROUPS[0]), (elementwise, entries)];
    out.extend(GROUPS[1..].iter().map(table));
    out
}

/// Every documented op, in the page's order.
pub fn all() -> Vec<Entry> {
    groups().into_iter().flat_map(|(_, ops)| ops).collect()
}

/// docs/ir-reference.md as this build writes it.
pub fn markdown() -> String {
    let mut s = String::from(
        "<!-- Generated from compiler/src/ir/text/reference.rs by `INGOT_WRITE_DOCS=1 cargo test --release -p ingot-compiler --lib ir_reference`; do not edit by hand. -->\n\
         # The IR text form: reference\n\n\
         A model file (`ingot train --model-file step.ir`) is a forward pass in Ingot's IR text form: one \
         primitive op per line, each with its result type, and an output named `\"loss\"` (a float scalar). \
         `ingot` appends the backward pass and the optimizer's update. docs/examples/tiny-mlp.ir is a whole \
         model; the grammar, with its error messages, is in compiler/src/ir/text/mod.rs.\n\n\
         ```text\n\
         ingot-ir 1                                  # the header: the first line that is not blank or a comment\n\
         optimizer adamw lr=3e-4 betas=0.9,0.95      # optional: sgd | momentum | adamw, with lr= momentum= betas= eps= weight_decay=\n\
         precision bf16                              # optional: f32 | tf32 | bf16\n\
         %0 = parameter \"fc.weight\" init=normal(0.02) : f32[16,8]\n\
         %1 = input \"x\" : f32[4,8]\n\
         %2 = matmul(%1, %0) tb=true : f32[4,16]     # node := %N = op(operands) \"name\"? key=value* : type\n\
         output \"loss\" = %9                          # output NAME = %N\n\
         ```\n\n\
         - Node ids count up from `%0` with no gaps; an operand is a node of an earlier line.\n\
         - Types are `DTYPE[dims]`: `f32`, `f64`, `bf16`, `i32`, `i64`, `bool`; a scalar is `f32[]`.\n\
         - Attributes come in any order; each op takes exactly those listed below.\n\
         - `#` starts a comment. Floats are Rust's shortest round-tripping form (`nan`, `inf`).\n\
         - A [layer line](#layers) (`%2 = linear(%1) \"fc1\" out=16 : f32[4,16]`) stands for a whole layer \
         and expands into its ops as it is read.\n\n\
         ## Ops\n\n",
    );
    let groups = groups();
    for (g, _) in &groups {
        let anchor = g
            .title
            .to_lowercase()
            .replace([' ', ','], "-")
            .replace("--", "-");
        s.push_str(&format!("- [{}](#{anchor})\n", g.title));
    }
    for (g, ops) in &groups {
        s.push_str(&format!("\n### {}\n\n", g.title));
        if !g.intro.is_empty() {
            s.push_str(g.intro);
            s.push_str("\n\n");
        }
        s.push_str("| op | operands | attributes | computes |\n|---|---|---|---|\n");
        for Entry { doc: o, .. } in ops {
            s.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                o.name,
                o.operands,
                o.attributes.replace('|', "\\|"),
                o.meaning.replace('|', "\\|")
            ));
        }
        let examples: Vec<&Entry> = ops.iter().filter(|o| !o.example.is_empty()).collect();
        if !examples.is_empty() {
            s.push_str("\n```text\n");
            for o in examples {
                let last = o.example.lines().last().unwrap_or("");
                s.push_str(last);
                s.push('\n');
            }
            s.push_str("```\n");
        }
    }
    s.push_str(&layers_markdown());
    s
}

/// The page's section on layer lines, from [`LAYERS`].
fn layers_markdown() -> String {
    let mut s = String::from(
        "\n## Layers\n\n\
         A layer line stands for a layer of the Rust API (`ingot_compiler::trace::nn` and `trace::conv`) and \
         expands, as the file is read, into exactly the ops and parameters that layer adds in Rust, with \
         PyTorch's parameter names (`NAME.weight`, `NAME.bias`) and the layer's initialisation. It is written \
         like a node line and states its result type; its `%N` names the layer's result, so node ids in a \
         file with layer lines are the file's, not the graph's. The layer's own nodes are named by the layer \
         in the plan's report (`fc1`, `fc1 (backward)`), the unnamed ones by their line. A wrong use (a \
         missing name or attribute, an input the layer cannot take, a result type other than the layer's) \
         is an error naming the line. docs/examples/tiny-classifier.ir is a whole model written with them.\n\n\
         | layer | operands | name | attributes | computes |\n|---|---|---|---|---|\n",
    );
    for l in LAYERS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            l.name,
            l.operands,
            if l.named { "required" } else { "-" },
            l.attributes.replace('|', "\\|"),
            l.meaning.replace('|', "\\|")
        ));
    }
    s.push_str("\n```text\n");
    for l in LAYERS {
        s.push_str(l.example.lines().last().unwrap_or(""));
        s.push('\n');
    }
    s.push_str("```\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;
    use crate::ir::WindowOp;
    use std::collections::BTreeSet;

    /// The keys of `key=` attributes on a line of the text form (outside strings).
    fn keys(line: &str) -> BTreeSet<String> {
        let code = line.split(':').next().unwrap_or("");
        let mut outside = String::new();
        let mut quoted = false;
        for ch in code.chars() {
            if ch == '"' {
                quoted = !quoted;
            } else if !quoted {
                outside.push(ch);
            }
        }
        outside
            .split_whitespace()
            .filter_map(|w| w.split_once('=').map(|(k, _)| k.to_string()))
            .filter(|k| !k.is_empty() && !k.starts_with('%'))
            .collect()
    }

    #[test]
    fn every_documented_ops_example_parses_to_that_op_with_the_attributes_it_lists() {
        for Entry { doc: o, example } in all() {
            assert!(
                !o.meaning.is_empty(),
                "{} says nothing of what it computes",
                o.name
            );
            if example.is_empty() {
                assert_eq!(o.name, "fused", "only fused goes without an example");
                continue;
            }
            let text = format!("ingot-ir 1\n{example}\n");
            let g = parse(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", o.name));
            let last = crate::ir::NodeId(g.len() as u32 - 1);
            assert_eq!(g.node(last).op.name(), o.name, "{text}");
            // The printer writes every attribute the op holds (defaults of optional ones
            // left out): each must be one the entry lists, and so must the example's.
            let printed = g.to_string();
            let line = printed
                .lines()
                .find(|l| l.starts_with(&format!("%{} =", last.0)))
                .unwrap();
            for k in keys(line).union(&keys(example.lines().last().unwrap())) {
                let listed =
                    o.attributes.contains(&format!("{k}=")) || o.attributes.starts_with("those of");
                assert!(
                    listed,
                    "{}: attribute {k}= is not listed ({})",
                    o.name, o.attributes
                );
            }
        }
    }

    #[test]
    fn every_op_the_parser_reads_is_documented_once() {
        let documented: Vec<&str> = all().iter().map(|o| o.doc.name).collect();
        let unique: BTreeSet<&str> = documented.iter().copied().collect();
        assert_eq!(unique.len(), documented.len(), "an op is documented twice");
        let mut read: Vec<&str> = vec![
            "parameter",
            "state",
            "input",
            "full",
            "iota",
            "select",
            "broadcast",
            "reshape",
            "transpose",
            "slice",
            "concat",
            "reduce_sum",
            "reduce_max",
            "matmul",
            "matmul_acc",
            "gather",
            "scatter_add",
            "convert",
            "stop_gradient",
            "dropout",
            "fused",
            "result",
            "attention",
            "attention_grad",
            "all_reduce",
            "all_gather",
            "reduce_scatter",
        ];
        read.extend(UnaryOp::ALL.iter().map(|o| o.name()));
        read.extend(BinaryOp::ALL.iter().map(|o| o.name()));
        read.extend(CmpOp::ALL.iter().map(|o| o.name()));
        read.extend(WindowOp::NAMES.iter().copied());
        for name in &read {
            assert!(
                super::super::parse::op_by_name(name).is_some(),
                "the parser does not read {name}"
            );
            assert!(unique.contains(name), "{name} is not in the reference");
        }
        for name in &unique {
            let op = super::super::parse::op_by_name(name)
                .unwrap_or_else(|| panic!("{name} is documented but the parser does not read it"));
            assert_eq!(op.name(), *name);
        }
        assert_eq!(read.len(), unique.len());
    }

    /// docs/ir-reference.md is what [`markdown`] writes now; with `INGOT_WRITE_DOCS=1` the test
    /// writes it.
    #[test]
    fn ir_reference_page_is_generated_from_the_op_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ir-reference.md");
        let now = markdown();
        if std::env::var_os("INGOT_WRITE_DOCS").is_some() {
            std::fs::write(path, &now).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == now,
            "docs/ir-reference.md differs from what compiler/src/ir/text/reference.rs generates: regenerate it with `INGOT_WRITE_DOCS=1 cargo test --release -p ingot-compiler --lib ir_reference` and commit it"
        );
    }
}
