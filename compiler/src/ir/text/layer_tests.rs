//! Layer lines: each builds what the Rust API's layer builds, a file of them is the graph of
//! its primitives spelled out, and each wrong use is an error naming its line.

use super::layers::LAYERS;
use super::{parse, Parsed};
use crate::error::IrError;
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
fn the_plain_parser_refuses_a_layer_line_naming_it_and_conv2d_without_a_name_is_the_primitive() {
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
    let model = crate::models::Model::from_ir_text("tiny", text).unwrap();
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
