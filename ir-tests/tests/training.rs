//! Whole training steps on the CPU: the reference models learn on a fixed batch, and a small
//! GPT starts from the loss of a uniform guess, as a correctly initialised model must.

use ingot_ir_tests::losses::session_losses;

#[test]
fn mlp_loss_falls_on_a_fixed_batch() {
    let m = ingot_models::by_name("mlp").unwrap();
    let losses = session_losses(&m, 7, 8);
    assert!(
        (losses[0] - 10f64.ln()).abs() < 0.05 * 10f64.ln(),
        "first loss {} is far from ln 10",
        losses[0]
    );
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "loss must fall every step on a fixed batch: {losses:?}"
    );
}

#[test]
fn a_small_gpt_starts_at_ln_vocab_and_trains() {
    let vocab = 256usize;
    let spec = format!("gpt:vocab={vocab},d_model=64,layers=2,heads=4,d_ff=256,seq=32,batch=4");
    let m = ingot_models::by_name(&spec).unwrap();
    let losses = session_losses(&m, 1, 10);
    let uniform = (vocab as f64).ln();
    assert!(
        (losses[0] - uniform).abs() <= 0.02 * uniform,
        "first loss {} is not within 2% of ln({vocab}) = {uniform}",
        losses[0]
    );
    assert!(
        losses[9] < losses[0] - 0.3,
        "ten AdamW steps on one batch should lower the loss: {losses:?}"
    );
}
