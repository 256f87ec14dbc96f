//! The text form's tests: round trips, the documented form, every error naming its line, and
//! property tests that no input makes the parser panic.

use super::parse::op_by_name;
use super::*;
use crate::ir::{BinaryOp, CmpOp, DType, Init, LeafKind, NodeId, Op, Shape, TensorType, UnaryOp};
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
    for &u in UnaryOp::ALL {
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
        (
            format!("{h}%1 = frobnicate(%0) : f32[2,3]\n"),
            3,
            &["unknown op", "`frobnicate`"],
        ),
        (
            format!("{h}%2 = neg(%0) : f32[2,3]\n"),
            3,
            &["`%2`", "out of order", "`%1`"],
        ),
        (
            format!("{h}%0 = neg(%0) : f32[2,3]\n"),
            3,
            &["`%0`", "out of order"],
        ),
        (
            format!("{h}%1 = neg(%7) : f32[2,3]\n"),
            3,
            &["`%7`", "not defined"],
        ),
        (
            format!("{h}%1 = neg(%1) : f32[2,3]\n"),
            3,
            &["`%1`", "not defined"],
        ),
        (format!("{h}%1 = neg(%x) : f32[2,3]\n"), 3, &["`%x`"]),
        (
            format!("{h}%1 = neg(%0)\n"),
            3,
            &["result type", "end of the line"],
        ),
        (
            format!("{h}%1 = neg(%0) : f33[2,3]\n"),
            3,
            &["unknown dtype", "`f33`"],
        ),
        (
            format!("{h}%1 = neg(%0) : f32[2,x]\n"),
            3,
            &["bad number", "`x`"],
        ),
        (
            format!("{h}%1 = neg(%0) : f32[2,-3]\n"),
            3,
            &["bad number", "`-3`"],
        ),
        (format!("{h}%1 = neg(%0) : f32[2,3] junk\n"), 3, &["`junk`"]),
        (
            format!("{h}%1 = neg(%0) : f32[99999999999999999999]\n"),
            3,
            &["bad number"],
        ),
        (
            format!("{h}%1 = neg(%0) : f32[4611686018427387904,8]\n"),
            3,
            &["too large"],
        ),
        (
            format!("{h}%1 = neg(%0) bogus=1 : f32[2,3]\n"),
            3,
            &["unknown attribute", "`bogus`", "`neg`"],
        ),
        (
            format!("{h}%1 = transpose(%0) perm=[1,0] axis=1 : f32[3,2]\n"),
            3,
            &["unknown attribute", "`axis`"],
        ),
        (
            format!("{h}%1 = transpose(%0) : f32[3,2]\n"),
            3,
            &["`transpose`", "`perm=`"],
        ),
        (
            format!("{h}%1 = transpose(%0) perm=1 : f32[3,2]\n"),
            3,
            &["`perm=`", "`1`"],
        ),
        (
            format!("{h}%1 = transpose(%0) perm=[1,0 : f32[3,2]\n"),
            3,
            &["`,` or `]`", "`:`"],
        ),
        (
            format!("{h}%1 = slice(%0) axis=0 start=0 : f32[1,3]\n"),
            3,
            &["`end=`"],
        ),
        (
            format!("{h}%1 = slice(%0) axis=0 start=0 end=1 end=1 : f32[1,3]\n"),
            3,
            &["`end`", "twice"],
        ),
        (
            format!("{h}%1 = full value=abc : f32[]\n"),
            3,
            &["bad number", "`abc`"],
        ),
        (
            format!("{h}%1 = full value=1.0.0 : f32[]\n"),
            3,
            &["bad number", "`1.0.0`"],
        ),
        (
            format!("{h}%1 = iota axis=-1 : i32[3]\n"),
            3,
            &["bad number", "`-1`"],
        ),
        (
            format!("{h}%1 = parameter init=zeros : f32[]\n"),
            3,
            &["name in quotes"],
        ),
        (
            format!("{h}%1 = parameter \"w\" : f32[]\n"),
            3,
            &["`init=`"],
        ),
        (
            format!("{h}%1 = parameter \"w\" init=laplace(1) : f32[]\n"),
            3,
            &["`init=`", "`laplace(1)`"],
        ),
        (
            format!("{h}%1 = parameter \"w\" init=normal(x) : f32[]\n"),
            3,
            &["bad number", "`x`"],
        ),
        (
            format!("{h}%1 = parameter \"x\" init=zeros : f32[]\n"),
            3,
            &["two leaves", "\"x\""],
        ),
        (
            format!("{h}%1 = parameter \"w : f32[]\n"),
            3,
            &["unterminated string"],
        ),
        (
            format!("{h}%1 = parameter \"w\\q\" init=zeros : f32[]\n"),
            3,
            &["unknown escape", "\\q"],
        ),
        (
            format!("{h}%1 = neg(%0) \"name\" : f32[2,3]\n"),
            3,
            &["`neg`", "no name"],
        ),
        (
            format!("{h}%1 = neg(%0 %0) : f32[2,3]\n"),
            3,
            &["`,` or `)`", "`%0`"],
        ),
        // Type errors from Graph::push keep their message and gain the line.
        (
            format!("{h}%1 = neg(%0) : f32[3,2]\n"),
            3,
            &["neg", "stated result f32[3,2]", "f32[2,3]"],
        ),
        (
            format!("{h}%1 = matmul(%0, %0) : f32[2,3]\n"),
            3,
            &["matmul", "inner dimensions"],
        ),
        (
            format!("{h}%1 = matmul_acc(%0, %0, %0) : f32[2,3]\n"),
            3,
            &["matmul_acc", "%1", "inner dimensions"],
        ),
        (format!("{h}%1 = neg : f32[2,3]\n"), 3, &["neg", "operand"]),
        (
            format!("{h}%1 = broadcast(%0) : f32[5,3]\n"),
            3,
            &["broadcast", "cannot broadcast"],
        ),
        (
            format!("{h}output \"y\" = %0\noutput \"y\" = %0\n"),
            4,
            &["\"y\"", "twice", "line 3"],
        ),
        (format!("{h}output y = %0\n"), 3, &["output's name", "`y`"]),
        (
            format!("{h}output \"y\" = %4\n"),
            3,
            &["`%4`", "not defined"],
        ),
        (format!("{h}output \"y\" %0\n"), 3, &["`=`", "`%0`"]),
        (
            format!("{h}update %0 = %0\n"),
            3,
            &["update target", "input"],
        ),
        (format!("{h}update %0 = %3\n"), 3, &["`%3`", "not defined"]),
        (
            format!(
                "{h}%1 = parameter \"w\" init=ones : f32[2,3]\nupdate %1 = %0\nupdate %1 = %0\n"
            ),
            5,
            &["twice", "line 4"],
        ),
        (
            format!("{h}frobnicate\n"),
            3,
            &["`frobnicate`", "`%1 = ...`"],
        ),
        (
            format!("{h}\n\n# comment\n%1 = neg(%0) : f32[2]\n"),
            6,
            &["neg"],
        ),
        (
            format!("{h}%1 = concat(%0, %0) axis=9 : f32[2,3]\n"),
            3,
            &["concat", "axis 9"],
        ),
        (
            format!("{h}%1 = attention(%0, %0, %0) scale=1 layout=sideways : f32[2,3]\n"),
            3,
            &["`layout=`", "`packed`"],
        ),
        (
            format!("{h}%1 = attention(%0) scale=1 layout=packed : f32[2,3]\n"),
            3,
            &[
                "attention",
                "qkv [batch, seq, 3, heads, head_dim]",
                "f32[2,3]",
            ],
        ),
        (
            format!("{h}%1 = attention(%0, %0, %0) scale=1 layout=tokens : f32[2,3]\n"),
            3,
            &["attention", "rank 4"],
        ),
        (
            format!("{h}%1 = attention(%0, %0, %0) scale=1 layout=packed : f32[2,3]\n"),
            3,
            &["attention", "takes 1 operand(s) (qkv), got 3"],
        ),
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
    let text = include_str!("../../../../docs/examples/tiny-mlp.ir");
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
            '%', '=', '(', ')', '[', ']', ',', ':', '"', '\\', '#', ' ', '\n', '0', '9', '-', 'e',
            'x'
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

/// Layer lines: each builds what the Rust API's layer builds, a file of them is the graph of
/// its primitives spelled out, and each wrong use is an error naming its line.
mod layer_lines {
    use crate::error::IrError;
    use crate::ir::text::layers::LAYERS;
    use crate::ir::text::{parse, Parsed};
    use crate::ir::{DType, Graph, Init, Mode, NodeId};
    use crate::trace::{conv, layers, nn};

    fn read(text: &str) -> Result<Parsed, IrError> {
        layers::parse(&format!("ingot-ir 1\n{text}\n"), Mode::Train)
    }

    /// The line and reason of the error `text` (after the header line) gives.
    fn read_err(text: &str) -> (usize, String) {
        match read(text) {
            Err(IrError::Parse { line, reason }) => (line, reason),
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    /// The layer line `line` after `inputs`, against `build` on a graph with the same inputs:
    /// equal graphs, printed (ops, attributes, names, inits and types).
    fn same_as_rust(inputs: &str, line: &str, build: impl FnOnce(&mut Graph, &[NodeId])) {
        let parsed = read(&format!(
            "{inputs}\n{line}\noutput \"out\" = %{}",
            inputs.lines().count()
        ))
        .unwrap_or_else(|e| panic!("{line}: {e}"));
        let mut g = parse(&format!("ingot-ir 1\n{inputs}\n")).unwrap();
        let ids: Vec<NodeId> = g.ids().collect();
        build(&mut g, &ids);
        let mut want = g.to_string();
        let mut got = parsed.graph.to_string();
        // The outputs differ only in being there; compare the nodes.
        got = got
            .lines()
            .filter(|l| !l.starts_with("output"))
            .collect::<Vec<_>>()
            .join("\n");
        want = want
            .lines()
            .filter(|l| !l.starts_with("output"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(got, want, "{line}");
    }

    #[test]
    fn each_layer_line_builds_what_the_rust_api_layer_builds() {
        let x = "%0 = input \"x\" : f32[4,8]";
        same_as_rust(x, "%1 = linear(%0) \"fc1\" out=16 : f32[4,16]", |g, i| {
            nn::linear(g, "fc1", i[0], 8, 16, true).unwrap();
        });
        same_as_rust(
            x,
            "%1 = linear(%0) \"fc1\" out=16 bias=false init=uniform(0.5) : f32[4,16]",
            |g, i| {
                nn::linear_with_init(g, "fc1", i[0], [8, 16], false, Init::Uniform { bound: 0.5 })
                    .unwrap();
            },
        );
        same_as_rust(
            x,
            "%1 = layer_norm(%0) \"ln\" eps=1e-6 : f32[4,8]",
            |g, i| {
                nn::layer_norm(g, "ln", i[0], 1e-6).unwrap();
            },
        );
        same_as_rust(x, "%1 = layer_norm(%0) \"ln\" : f32[4,8]", |g, i| {
            nn::layer_norm(g, "ln", i[0], 1e-5).unwrap();
        });
        same_as_rust(x, "%1 = relu(%0) : f32[4,8]", |g, i| {
            nn::relu(g, i[0]).unwrap();
        });
        same_as_rust(x, "%1 = gelu_tanh(%0) : f32[4,8]", |g, i| {
            nn::gelu_tanh(g, i[0]).unwrap();
        });
        same_as_rust(x, "%1 = softmax(%0) : f32[4,8]", |g, i| {
            nn::softmax(g, i[0]).unwrap();
        });
        same_as_rust(x, "%1 = log_softmax(%0) : f32[4,8]", |g, i| {
            nn::log_softmax(g, i[0]).unwrap();
        });
        same_as_rust(
            "%0 = input \"x\" : f32[4,8]\n%1 = input \"y\" init=ids(8) : i64[4]",
            "%2 = cross_entropy(%0, %1) : f32[]",
            |g, i| {
                nn::softmax_cross_entropy(g, i[0], i[1]).unwrap();
            },
        );
        same_as_rust(
            "%0 = input \"x\" init=ids(50) : i64[2,5]",
            "%1 = embedding(%0) \"wte\" rows=50 dim=6 : f32[2,5,6]",
            |g, i| {
                nn::embedding(g, "wte", i[0], 50, 6, DType::F32).unwrap();
            },
        );
        let img = "%0 = input \"x\" : f32[2,3,8,8]";
        same_as_rust(
            img,
            "%1 = conv2d(%0) \"conv1\" out=4 kernel=3 stride=2 padding=1 : f32[2,4,4,4]",
            |g, i| {
                conv::conv2d(g, "conv1", i[0], 3, 4, 3, 2, 1, 1, 1, true).unwrap();
            },
        );
        same_as_rust(
            img,
            "%1 = conv2d(%0) \"dw\" out=3 kernel=3 padding=2 dilation=2 groups=3 bias=false : f32[2,3,8,8]",
            |g, i| {
                conv::conv2d(g, "dw", i[0], 3, 3, 3, 1, 2, 2, 3, false).unwrap();
            },
        );
        same_as_rust(img, "%1 = flatten(%0) : f32[2,192]", |g, i| {
            conv::flatten(g, i[0]).unwrap();
        });
    }

    #[test]
    fn every_layer_of_the_table_is_tested_above_and_its_example_reads() {
        let tested = [
            "linear",
            "layer_norm",
            "relu",
            "gelu_tanh",
            "softmax",
            "log_softmax",
            "cross_entropy",
            "embedding",
            "conv2d",
            "flatten",
        ];
        for l in LAYERS {
            assert!(tested.contains(&l.name), "{} has no test above", l.name);
            let parsed = read(l.example).unwrap_or_else(|e| panic!("{}: {e}", l.name));
            assert!(
                parsed.graph.len() > l.example.lines().count() - 1,
                "{}",
                l.name
            );
        }
        assert_eq!(tested.len(), LAYERS.len());
    }

    /// The example file and its primitives spelled out by hand are one graph.
    #[test]
    fn a_file_of_layer_lines_is_the_graph_of_its_primitives_spelled_out() {
        let strip = |text: &str| {
            // The optimizer line is the model's, not the graph's (`Model::from_ir_text` reads it).
            text.lines()
                .map(|l| if l.starts_with("optimizer") { "" } else { l })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let layered = layers::parse(
            &strip(include_str!("../../../../docs/examples/tiny-classifier.ir")),
            Mode::Train,
        )
        .unwrap();
        let spelled = parse(&strip(include_str!(
            "../../../../cli/tests/models/tiny-classifier-primitives.ir"
        )))
        .unwrap();
        assert_eq!(layered.graph.to_string(), spelled.to_string());
        // Each node knows its line: the layer lines' nodes theirs (fc1 on line 11).
        let fc1 = layered.graph.leaf("fc1.weight").unwrap();
        assert_eq!(layered.lines[fc1.index()], 11);
        assert_eq!(layered.lines.len(), layered.graph.len());
    }

    #[test]
    fn a_layer_lines_result_is_named_by_its_id_and_later_lines_read_it() {
        let p = read(
            "%0 = input \"x\" : f32[4,8]\n%1 = linear(%0) \"fc1\" out=3 : f32[4,3]\n%2 = exp(%1) : f32[4,3]\noutput \"o\" = %2",
        )
        .unwrap();
        let out = p.graph.outputs["o"];
        let exp = &p.graph.node(out);
        assert_eq!(exp.op.name(), "exp");
        // Its operand is the linear layer's last node, not the file's `%1`.
        assert_eq!(p.graph.node(exp.inputs[0]).op.name(), "add");
        // A type error after a layer line names the file's id, not the graph's.
        let (line, reason) = read_err(
            "%0 = input \"x\" : f32[4,8]\n%1 = linear(%0) \"fc1\" out=3 : f32[4,3]\n%2 = exp(%1) : f32[4,4]",
        );
        assert_eq!(line, 4, "{reason}");
        assert!(reason.contains("%2"), "{reason}");
    }

    #[test]
    fn each_wrong_use_of_a_layer_line_is_an_error_naming_its_line_and_what_is_wrong() {
        let x = "%0 = input \"x\" : f32[4,8]\n";
        let cases: [(&str, &[&str]); 10] = [
            (
                "%1 = linear(%0) out=16 : f32[4,16]",
                &["`linear` needs the layer's name"],
            ),
            (
                "%1 = linear(%0) \"fc1\" : f32[4,16]",
                &["`linear` needs the attribute `out=`"],
            ),
            (
                "%1 = linear(%0) \"fc1\" out=16 width=3 : f32[4,16]",
                &["unknown attribute `width`", "`out=N`"],
            ),
            (
                "%1 = linear(%0, %0) \"fc1\" out=16 : f32[4,16]",
                &["takes 1 operand", "found 2"],
            ),
            (
                "%1 = relu(%0) \"r\" : f32[4,8]",
                &["`relu` takes no name string"],
            ),
            (
                "%1 = linear(%0) \"fc1\" out=16 : f32[4,32]",
                &["gives f32[4,16]", "states f32[4,32]"],
            ),
            (
                "%1 = conv2d(%0) \"c\" out=2 kernel=3 : f32[4,2,1,1]",
                &["`conv2d`", "NCHW image"],
            ),
            (
                "%1 = cross_entropy(%0, %0) : f32[]",
                &["`cross_entropy`", "integer targets"],
            ),
            (
                "%1 = linear(%0) \"fc1\" out=16 bias=maybe : f32[4,16]",
                &["`bias=` must be `true` or `false`"],
            ),
            (
                "%1 = linear(%0) \"fc1\" out=4 : f32[4,4]\n%2 = linear(%1) \"fc1\" out=4 : f32[4,4]",
                &["two leaves are named \"fc1.weight\""],
            ),
        ];
        for (text, wants) in cases {
            let (line, reason) = read_err(&format!("{x}{text}"));
            let expected_line = 2 + text.lines().count();
            assert_eq!(line, expected_line, "{text}: {reason}");
            for want in wants {
                assert!(reason.contains(want), "{text}: {reason:?} lacks {want:?}");
            }
        }
    }

    #[test]
    fn the_plain_parser_refuses_a_layer_line_naming_it_and_conv2d_without_a_name_is_the_primitive()
    {
        let text =
            "ingot-ir 1\n%0 = input \"x\" : f32[4,8]\n%1 = linear(%0) \"fc1\" out=16 : f32[4,16]\n";
        match parse(text) {
            Err(IrError::Parse { line: 3, reason }) => {
                assert!(reason.contains("`linear` is a layer line"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let prim = "%0 = input \"x\" : f32[1,1,4,4]\n%1 = input \"w\" : f32[2,1,3,3]\n%2 = conv2d(%0, %1) stride=[1,1] padding=[0,0] dilation=[1,1] groups=1 : f32[1,2,2,2]";
        let p = read(prim).unwrap();
        assert_eq!(p.graph.len(), 3);
    }

    #[test]
    fn a_model_files_layer_nodes_are_named_by_the_layer_and_the_others_by_their_line() {
        let text = include_str!("../../../../docs/examples/tiny-classifier.ir");
        let model = crate::model::Model::from_ir_text("tiny", text).unwrap();
        let g = &model.graph;
        let named = |op: &str| -> Vec<String> {
            g.ids()
                .filter(|&id| g.node(id).op.name() == op)
                .map(|id| g.origin(id).primary().unwrap_or("").to_string())
                .collect()
        };
        // The two linear layers' products, as `nn::linear` names them in Rust.
        assert_eq!(named("matmul"), ["fc1", "fc2"]);
        // relu (line 13) and cross_entropy (line 15) have no name: their line is their provenance.
        assert_eq!(named("select"), ["tiny:13", "tiny:15"]);
        assert!(named("sqrt").iter().all(|o| o == "ln1"));
    }
}
