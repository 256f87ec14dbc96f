//! Deep synthetic models in the IR text form, for the tests of compile time and fusion at
//! depth (the same shapes as scripts/chain_ir.py and scripts/reduce_chain_ir.py write).

/// `n` layers over f32[rows, cols], each centring its rows (the row mean broadcast back and
/// subtracted, as a LayerNorm does), scaling by the one parameter `w` and squashing by tanh (so
/// that values stay finite at any depth); the loss is the sum of the last value. Every layer is a reduction feeding the next layer's elementwise ops.
pub fn reduce_chain(n: usize, rows: usize, cols: usize) -> String {
    let t = format!("f32[{rows},{cols}]");
    let mut s = format!(
        "ingot-ir 1\n%0 = parameter \"w\" init=normal(1.0) : {t}\n%1 = input \"x\" : {t}\n"
    );
    let (mut prev, mut node) = (1, 2);
    for _ in 0..n {
        let inv = 1.0 / cols as f64;
        s += &format!("%{node} = reduce_sum(%{prev}) axes=[1] : f32[{rows},1]\n");
        s += &format!("%{} = full value={inv:?} : f32[{rows},1]\n", node + 1);
        s += &format!(
            "%{} = mul(%{node}, %{}) : f32[{rows},1]\n",
            node + 2,
            node + 1
        );
        s += &format!("%{} = broadcast(%{}) : {t}\n", node + 3, node + 2);
        s += &format!("%{} = sub(%{prev}, %{}) : {t}\n", node + 4, node + 3);
        s += &format!("%{} = mul(%{}, %0) : {t}\n", node + 5, node + 4);
        s += &format!("%{} = tanh(%{}) : {t}\n", node + 6, node + 5);
        prev = node + 6;
        node += 7;
    }
    s += &format!("%{node} = reduce_sum(%{prev}) axes=[0,1] : f32[1,1]\n");
    s += &format!("%{} = reshape(%{node}) : f32[]\n", node + 1);
    s += &format!("output \"loss\" = %{}\n", node + 1);
    s
}
