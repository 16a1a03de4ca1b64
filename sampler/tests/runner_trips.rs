//! What a runner writing against the docs tripped on at run time (issue 29): a seed undone by
//! `with_params`, and step errors that named the decoder's internal ops instead of what the
//! runner passed. (What did not compile is in `runner_api.rs`.)

use specula_backend_api::{DeviceExt, Strategy};
use specula_sampler::{
    Decoder, Request, SamplerConfig, SamplerError, SamplingParams, StepScores, registry,
};

const V: usize = 16;

/// A decoder of one running request, planned: its step waits for `t_out` rows of `V`.
fn planned(config: SamplerConfig) -> (std::sync::Arc<dyn specula_backend_api::Device>, Decoder) {
    let device = registry::open("cpu").expect("cpu");
    let mut decoder = Decoder::new(device.clone(), config).expect("decoder");
    decoder
        .insert(Request::new(vec![3, 4]).with_max_dec_len(4))
        .expect("insert");
    decoder.plan().expect("plan");
    (device, decoder)
}

/// Rows that favour token `favoured`, `rows` of them.
fn rows_favouring(favoured: usize, rows: usize) -> Vec<f32> {
    (0..rows * V)
        .map(|i| if i % V == favoured { 5.0 } else { 0.0 })
        .collect()
}

#[test]
fn sampling_params_without_a_seed_keep_the_requests_seed() {
    let request = Request::new(vec![1])
        .with_seed(7)
        .with_params(SamplingParams::greedy().with_top_p(0.9));
    assert_eq!(
        (request.seed, request.temperature, request.top_p),
        (7, 0.0, 0.9)
    );
    // A seed in the parameters is the request's seed.
    let reseeded = Request::new(vec![1])
        .with_seed(7)
        .with_params(SamplingParams::default().with_seed(11));
    assert_eq!(reseeded.seed, 11);
    // The parameters of a request carry its seed, and give it back.
    assert_eq!(
        Request::new(vec![1]).with_params(reseeded.params()),
        reseeded
    );
    assert_eq!(Request::new(vec![1]).seed, 0);
}

/// The message of a step error, which must name what the runner passed.
fn message(result: Result<impl std::fmt::Debug, SamplerError>) -> String {
    match result {
        Ok(output) => panic!("the step ran: {output:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn step_errors_name_what_the_runner_passed() {
    let config = SamplerConfig::plain(Strategy::TargetMatch, 1, V, 32, vec![0]);
    let (device, mut decoder) = planned(config);
    let other = registry::open("cpu").expect("another cpu device");
    let foreign = other.upload(&rows_favouring(3, 1)).expect("upload");
    let refused = message(decoder.finish(StepScores::logits(&foreign)));
    assert!(
        refused.starts_with("StepScores::logits: the buffer belongs to device"),
        "{refused}"
    );
    assert!(!refused.contains("top_k_top_p_sample"), "{refused}");
    let ints = device.upload(&[1i32; V]).expect("upload");
    let refused = message(decoder.finish(StepScores::probs(&ints)));
    assert!(
        refused.starts_with("StepScores::probs: a i32 buffer, expected f32 or f16 or bf16"),
        "{refused}"
    );
    // The bitmask: one row of ceil(V / 32) u32 words per score row.
    let logits = device.upload(&rows_favouring(3, 1)).expect("upload");
    let floats = device.upload(&[0.0f32; 1]).expect("upload");
    let refused = message(decoder.finish(StepScores::logits(&logits).with_bitmask(&floats)));
    assert!(
        refused.starts_with("StepScores::with_bitmask: a f32 buffer, expected u32"),
        "{refused}"
    );
    let long = device.upload(&[u32::MAX; 2]).expect("upload");
    let refused = message(decoder.finish(StepScores::logits(&logits).with_bitmask(&long)));
    assert!(
        refused.starts_with("StepScores::with_bitmask: 2 elements, expected 1"),
        "{refused}"
    );
    // Every refusal left the step planned: the right scores finish it.
    let output = decoder.finish(StepScores::logits(&logits)).expect("finish");
    assert_eq!(output.slots[0].tokens.len(), 1);
}

#[test]
fn rejection_draft_rows_are_checked_under_their_own_name() {
    let s = 3;
    let device = registry::open("cpu").expect("cpu");
    let config = SamplerConfig::new(Strategy::Rejection, 1, V, 32, vec![0]).with_runner_drafts(s);
    let mut decoder = Decoder::new(device.clone(), config).expect("decoder");
    decoder
        .insert(Request::new(vec![3]).with_max_dec_len(8))
        .expect("insert");
    // The prefill step has no drafts; the next one drafts two tokens.
    decoder.plan().expect("plan");
    let target = device.upload(&rows_favouring(5, 1)).expect("upload");
    decoder
        .finish(StepScores::logits(&target))
        .expect("prefill");
    decoder.propose().expect("propose");
    decoder.set_drafts(0, &[6, 7]).expect("drafts");
    let plan = decoder.plan().expect("plan");
    let target = device
        .upload(&rows_favouring(6, plan.t_out()))
        .expect("upload");
    // Dense draft rows are `[max_bsz · (S − 1), V]`: one row short is refused by name.
    let short = device.upload(&rows_favouring(6, 1)).expect("upload");
    let refused = message(decoder.finish(StepScores::logits(&target).with_draft(&short)));
    assert!(
        refused.starts_with("StepScores::with_draft: 16 elements, expected 32"),
        "{refused}"
    );
    let other = registry::open("cpu").expect("another cpu device");
    let foreign = other.upload(&rows_favouring(6, 2)).expect("upload");
    let refused = message(decoder.finish(StepScores::logits(&target).with_draft_rows(&foreign)));
    assert!(
        refused.starts_with("StepScores::with_draft_rows: the buffer belongs to device"),
        "{refused}"
    );
    let draft = device.upload(&rows_favouring(6, 2)).expect("upload");
    decoder
        .finish(StepScores::logits(&target).with_draft_rows(&draft))
        .expect("finish");
}
