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
//! - `op` is exactly [`Op::name`](crate::ir::Op::name). Every node states its result type; [`Graph::push`] checks it,
//!   and a type error comes back naming the line.
//! - Attributes may come in any order; each op takes exactly these (every op, with its
//!   operands and meaning, is in docs/ir-reference.md, generated from the `reference` module):
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
//!   | `dropout(x, seed)` | `p=F` (in `[0, 1]`) `salt=N` (see [`Op::Dropout`](crate::ir::Op::Dropout)) |
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
//! - A layer line (`%2 = linear(%1) "fc1" out=16 : f32[4,16]`; [`layers`]) stands for a whole
//!   layer of the Rust API and expands into its ops as it is read, by the [`Layers`] given to
//!   [`parse_with`] (`Model::from_ir_text` gives the tracing stage's); `%N` then names the
//!   line's result, and [`parse`] alone refuses the line, naming it.
//!
//! Any text that is not a valid graph gives [`IrError::Parse`] with the 1-based line and a
//! reason that quotes the offending token; no input makes the parser panic.

mod header;
pub mod layers;
mod parse;
mod print;
pub mod reference;
mod tokens;

pub use header::VERSION;
pub use layers::{Layer, Layers};
pub use parse::{parse, parse_in, parse_with, Parsed};
pub use print::print;

use super::graph::Graph;
use crate::error::IrError;
use std::fmt;

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

#[cfg(test)]
mod tests;
