//! What a runner writing against the docs could not write (issue 29): REJECTION built from
//! another strategy, the natural `borrow_host` line, and the `half` types of half-precision rows.

use specula_backend_api::{DeviceExt, Strategy};
use specula_sampler::{
    Decoder, NgramConfig, Request, SamplerConfig, SamplerError, StepScores, half, registry,
};

const V: usize = 16;

/// Rows that favour token `favoured`, `rows` of them.
fn rows_favouring(favoured: usize, rows: usize) -> Vec<f32> {
    (0..rows * V)
        .map(|i| if i % V == favoured { 5.0 } else { 0.0 })
        .collect()
}

#[test]
fn rejection_has_its_own_constructor() {
    let config = SamplerConfig::rejection(2, V, 32, vec![0], 4);
    assert_eq!(config.strategy, Strategy::Rejection);
    assert_eq!((config.max_step_tokens, config.ngram), (4, None));
    config.validate().expect("valid");
    // The deprecated builder replaces the strategy it is given; the constructor has none to
    // replace.
    #[allow(deprecated)]
    let replaced = SamplerConfig::plain(Strategy::Greedy, 2, V, 32, vec![0])
        .with_ngram(4, NgramConfig::default())
        .with_rejection(4);
    assert_eq!(replaced, config);
}

#[test]
fn a_borrowed_host_slice_goes_straight_into_the_step() -> Result<(), SamplerError> {
    let device = registry::open("cpu")?;
    let config = SamplerConfig::plain(Strategy::Greedy, 1, V, 32, vec![0]);
    let mut decoder = Decoder::new(device.clone(), config)?;
    decoder.insert(Request::new(vec![3, 4]).with_max_dec_len(4))?;
    decoder.plan()?;
    let rows = rows_favouring(9, 1);
    // The natural line: the borrow lives for the call.
    let output = decoder.finish(StepScores::logits(&device.borrow_host(&rows)?))?;
    assert_eq!(output.slots[0].tokens, [9]);
    // Half-precision rows through the re-exported `half`.
    decoder.plan()?;
    let rows: Vec<half::bf16> = rows_favouring(11, 1)
        .into_iter()
        .map(half::bf16::from_f32)
        .collect();
    let output = decoder.finish(StepScores::logits(&device.borrow_host(&rows)?))?;
    assert_eq!(output.slots[0].tokens, [11]);
    decoder.plan()?;
    let rows: Vec<half::f16> = rows_favouring(12, 1)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let borrowed = device.borrow_host(&rows)?;
    let output = decoder.finish(StepScores::probs(&borrowed))?;
    assert_eq!(output.slots[0].tokens, [12]);
    Ok(())
}
