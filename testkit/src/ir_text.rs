//! Models written in the IR text form (docs/ir-format.md) that more than one test suite reads:
//! the compiler's tests parse them, the command line's train them from a file.

/// A model with one dropout, in the IR text form: `loss = sum(dropout(p - x)²)` over `n`
/// elements (`p` a parameter, `x` and `y` inputs, the dropout's seed the input
/// `dropout_seed`), trained by SGD at lr 0.1. `keep` is the dropout's `p`, written as given.
pub fn dropout_model(n: usize, keep: &str, salt: u64) -> String {
    format!(
        "ingot-ir 1\n\
         optimizer sgd lr=0.1\n\
         %0 = parameter \"p\" init=normal(1.0) : f32[{n}]\n\
         %1 = input \"x\" : f32[{n}]\n\
         %2 = input \"y\" : f32[{n}]\n\
         %3 = input \"dropout_seed\" : i64[]\n\
         %4 = sub(%0, %1) : f32[{n}]\n\
         %5 = dropout(%4, %3) p={keep} salt={salt} : f32[{n}]\n\
         %6 = mul(%5, %5) : f32[{n}]\n\
         %7 = reduce_sum(%6) axes=[0] : f32[1]\n\
         %8 = reshape(%7) : f32[]\n\
         output \"loss\" = %8\n"
    )
}
