//! Property (a): GREEDY and TARGET_MATCH speculative decoding emit exactly the tokens of
//! non-speculative decoding; property (d): a request's tokens do not depend on its batch.

mod common;

use common::{
    Arrival, Extras, Forward, Rng, RunResult, ToyModel, VOCAB, device, request, run, run_with,
};
use specula_backend_api::Strategy;
use specula_sampler::{FinishReason, NgramConfig, SamplerConfig};

const END_TOKENS: [i32; 2] = [0, 17];

fn plain_config(strategy: Strategy, max_bsz: usize, max_model_len: usize) -> SamplerConfig {
    SamplerConfig::new(strategy, max_bsz, VOCAB, max_model_len, END_TOKENS.to_vec())
}

fn spec_config(
    strategy: Strategy,
    max_bsz: usize,
    max_model_len: usize,
    s: usize,
    rng: &mut Rng,
) -> SamplerConfig {
    let max_ngram_size = rng.range(1, 4);
    let ngram = NgramConfig {
        max_ngram_size,
        min_ngram_size: rng.range(1, max_ngram_size),
        // Sometimes a tight global budget, so some slots get fewer drafts than they could.
        threshold: if rng.range(0, 3) == 0 {
            rng.range(NgramConfig::MIN_THRESHOLD, 12)
        } else {
            128
        },
    };
    plain_config(strategy, max_bsz, max_model_len).with_ngram(s, ngram)
}

fn arrivals(rng: &mut Rng, model: &ToyModel, count: usize, max_prompt: usize) -> Vec<Arrival> {
    let mut step = 0;
    (0..count)
        .map(|_| {
            step += rng.range(0, 4) as u64;
            Arrival {
                step,
                request: request(rng, model, max_prompt),
            }
        })
        .collect()
}

fn assert_same_tokens(case: &str, arrivals: &[Arrival], a: &RunResult, b: &RunResult) {
    for (i, arrival) in arrivals.iter().enumerate() {
        assert_eq!(
            a.tokens[i], b.tokens[i],
            "{case}: request {i} ({:?}) differs",
            arrival.request
        );
        assert_eq!(
            a.finished[i], b.finished[i],
            "{case}: request {i} finish reason"
        );
    }
}

fn speculative_equals_plain(strategy: Strategy, cases: u64) {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let (mut plain_steps, mut spec_steps) = (0, 0);
    let (mut proposed, mut accepted) = (0, 0);
    let mut reasons = std::collections::HashSet::new();
    for case in 0..cases {
        let mut rng = Rng(0x5EED_0000 + case * 7919 + strategy as u64);
        let max_bsz = rng.range(1, 5);
        let max_model_len = rng.range(16, 100);
        let s = rng.range(4, 8);
        let count = rng.range(2, 9);
        let arrivals = arrivals(&mut rng, &model, count, 14);
        let spec = spec_config(strategy, max_bsz, max_model_len, s, &mut rng);
        let plain = plain_config(strategy, max_bsz, max_model_len);
        let mode = rng.pick(&[Forward::Prefix, Forward::Gather]);
        let a = run(&device, &plain, &model, &arrivals, mode);
        let b = run(&device, &spec, &model, &arrivals, mode);
        let label = format!("{strategy} case {case} (bsz {max_bsz}, S {s}, len {max_model_len})");
        assert_same_tokens(&label, &arrivals, &a, &b);
        assert_eq!(
            a.stats.drafts_proposed, 0,
            "{label}: plain decoding has no drafts"
        );
        assert_eq!(a.stats.tokens_emitted, b.stats.tokens_emitted);
        plain_steps += a.stats.steps;
        spec_steps += b.stats.steps;
        proposed += b.stats.drafts_proposed;
        accepted += b.stats.drafts_accepted;
        reasons.extend(a.finished.iter().flatten().copied());
    }
    eprintln!(
        "{strategy}: plain {plain_steps} steps, speculative {spec_steps} steps, \
         {accepted}/{proposed} drafts accepted"
    );
    assert!(
        spec_steps < plain_steps,
        "speculation must take fewer steps ({spec_steps} vs {plain_steps})"
    );
    assert!(
        accepted > 0 && accepted < proposed,
        "drafts must be both right and wrong"
    );
    for reason in [
        FinishReason::EndToken,
        FinishReason::Length,
        FinishReason::MaxModelLen,
    ] {
        assert!(
            reasons.contains(&reason),
            "no request stopped by {reason:?}"
        );
    }
}

/// Logits handed over with `borrow_host` (on the CPU: the runner's slice itself, no copy) give
/// exactly the tokens, finish reasons and step counts of uploaded logits, plain and speculative,
/// for every strategy that samples the target alone.
#[test]
fn borrowed_host_logits_equal_uploaded_logits() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let borrowed = Extras {
        borrow_host: true,
        ..Extras::default()
    };
    let mut tokens = 0;
    for strategy in [Strategy::TargetMatch, Strategy::Greedy, Strategy::TopP] {
        for case in 0..8u64 {
            let mut rng = Rng(0xB0_0000 + case * 7919 + strategy as u64);
            let (max_bsz, max_model_len) = (rng.range(1, 5), rng.range(16, 100));
            let count = rng.range(2, 9);
            let arrivals = arrivals(&mut rng, &model, count, 14);
            let config = if case % 2 == 0 {
                plain_config(strategy, max_bsz, max_model_len)
            } else {
                spec_config(strategy, max_bsz, max_model_len, 4, &mut rng)
            };
            let a = run(&device, &config, &model, &arrivals, Forward::Prefix);
            let b = run_with(
                &device,
                &config,
                &model,
                &arrivals,
                Forward::Prefix,
                borrowed,
            );
            assert_same_tokens(&format!("{strategy} case {case}"), &arrivals, &a, &b);
            assert_eq!(a.stats.steps, b.stats.steps, "{strategy} case {case}");
            tokens += a.stats.tokens_emitted;
        }
    }
    assert!(tokens > 200, "{tokens} tokens compared");
}

#[test]
fn target_match_speculative_equals_plain() {
    speculative_equals_plain(Strategy::TargetMatch, 120);
}

#[test]
fn greedy_speculative_equals_plain() {
    speculative_equals_plain(Strategy::Greedy, 120);
}

#[test]
fn speculative_equals_plain_with_runner_probabilities() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    for case in 0..6 {
        let mut rng = Rng(0xABCD + case);
        let arrivals = arrivals(&mut rng, &model, 5, 10);
        let spec = spec_config(Strategy::TargetMatch, 3, 50, 5, &mut rng);
        let plain = plain_config(Strategy::TargetMatch, 3, 50);
        let a = run(&device, &plain, &model, &arrivals, Forward::Probs);
        let b = run(&device, &spec, &model, &arrivals, Forward::Probs);
        assert_same_tokens(&format!("probs case {case}"), &arrivals, &a, &b);
    }
}

#[test]
fn rejection_without_drafts_is_target_match() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let mut rng = Rng(99);
    let arrivals = arrivals(&mut rng, &model, 6, 10);
    let [a, b] = [Strategy::TargetMatch, Strategy::Rejection].map(|strategy| {
        let config = plain_config(strategy, 4, 50);
        run(&device, &config, &model, &arrivals, Forward::Prefix)
    });
    assert_same_tokens("rejection S=1", &arrivals, &a, &b);
}

/// Property (d): each request alone gives the tokens it gets in a mixed batch.
#[test]
fn tokens_do_not_depend_on_the_batch() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    for case in 0..10u64 {
        let mut rng = Rng(0xBA7C_0000 + case);
        let strategy = if case % 2 == 0 {
            Strategy::TargetMatch
        } else {
            Strategy::Greedy
        };
        let max_model_len = 48;
        let arrivals = arrivals(&mut rng, &model, 6, 12);
        let config = if case % 3 == 0 {
            plain_config(strategy, 4, max_model_len)
        } else {
            spec_config(strategy, 4, max_model_len, 6, &mut rng)
        };
        let batched = run(&device, &config, &model, &arrivals, Forward::Gather);
        for (i, arrival) in arrivals.iter().enumerate() {
            let alone = Arrival {
                step: 0,
                request: arrival.request.clone(),
            };
            let single = SamplerConfig {
                max_bsz: 1,
                ..config.clone()
            };
            let solo = run(&device, &single, &model, &[alone], Forward::Prefix);
            assert_eq!(
                solo.tokens[0], batched.tokens[i],
                "case {case}: request {i} alone vs batched"
            );
        }
    }
}
