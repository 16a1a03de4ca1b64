//! Per-request semantics (`docs/semantics.md` §8): `max_dec_len` ends with finish reason
//! `Length` after exactly that many real tokens (FastDeploy's replacement behind a flag), a
//! request's own stop tokens cut exactly at the first one, and each request gets log-probabilities
//! of its own width. Speculative decoding (n-gram, S = 4) still emits exactly the tokens of plain
//! decoding.

mod common;

use common::{Arrival, Forward, Rng, RunResult, ToyModel, VOCAB, device, forward, run};
use specula_backend_api::Strategy;
use specula_sampler::{
    Decoder, FinishReason, NgramConfig, Request, SamplerConfig, SamplerError, SamplingParams,
    StepScores,
};

const END_TOKENS: [i32; 2] = [0, 17];
const MAX_MODEL_LEN: usize = 48;

fn plain(strategy: Strategy) -> SamplerConfig {
    SamplerConfig::new(strategy, 4, VOCAB, MAX_MODEL_LEN, END_TOKENS.to_vec())
}

fn speculative(strategy: Strategy) -> SamplerConfig {
    plain(strategy).with_ngram(4, NgramConfig::default())
}

/// Requests without a limit: varied prompts, seeds and temperatures.
fn requests(seed: u64, count: usize) -> Vec<Request> {
    let model = ToyModel { vocab: VOCAB };
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let len = rng.range(2, 10);
            let temperature = rng.pick(&[0.0f32, 0.5, 1.0]);
            Request::new(common::prompt(&mut rng, &model, len)).with_params(
                SamplingParams::default()
                    .with_seed(rng.next_u64())
                    .with_temperature(temperature),
            )
        })
        .collect()
}

fn arrivals(requests: &[Request]) -> Vec<Arrival> {
    requests
        .iter()
        .enumerate()
        .map(|(i, request)| Arrival {
            step: i as u64,
            request: request.clone(),
        })
        .collect()
}

fn run_both(strategy: Strategy, arrivals: &[Arrival], fastdeploy: bool) -> RunResult {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let (mut p, mut s) = (plain(strategy), speculative(strategy));
    p.fastdeploy_max_dec_len = fastdeploy;
    s.fastdeploy_max_dec_len = fastdeploy;
    let a = run(&device, &p, &model, arrivals, Forward::Prefix);
    let b = run(&device, &s, &model, arrivals, Forward::Prefix);
    assert_eq!(a.tokens, b.tokens, "{strategy}: speculative == plain");
    assert_eq!(a.finished, b.finished, "{strategy}: finish reasons");
    b
}

#[test]
fn max_dec_len_yields_exactly_that_many_real_tokens_and_length() {
    for strategy in [Strategy::TargetMatch, Strategy::Greedy] {
        let unlimited = requests(0x00DE_C1E4, 8);
        let free = run_both(strategy, &arrivals(&unlimited), false);
        assert!(
            free.stats.drafts_accepted > 0,
            "{strategy}: drafts accepted"
        );
        for limit in [1, 4, 7] {
            let limited: Vec<Request> = unlimited
                .iter()
                .map(|r| r.clone().with_max_dec_len(limit))
                .collect();
            let cut = run_both(strategy, &arrivals(&limited), false);
            let mut lengths = 0;
            for (i, (tokens, reason)) in cut.tokens.iter().zip(&cut.finished).enumerate() {
                let full = &free.tokens[i];
                let n = full.len().min(limit);
                assert_eq!(tokens, &full[..n], "{strategy} request {i}: a prefix");
                if full.len() > limit {
                    assert_eq!(*reason, Some(FinishReason::Length), "{strategy} {i}");
                    lengths += 1;
                } else {
                    assert_eq!(*reason, free.finished[i], "{strategy} {i}");
                }
            }
            assert!(lengths > 0, "{strategy}: no request reached {limit}");
        }
    }
}

#[test]
fn fastdeploy_max_dec_len_still_replaces_the_last_token() {
    let strategy = Strategy::TargetMatch;
    let unlimited = requests(0x0FA5_7DE9, 8);
    let free = run_both(strategy, &arrivals(&unlimited), false);
    let limited: Vec<Request> = unlimited
        .iter()
        .map(|r| r.clone().with_max_dec_len(4))
        .collect();
    let fd = run_both(strategy, &arrivals(&limited), true);
    let mut replaced = 0;
    for (i, tokens) in fd.tokens.iter().enumerate() {
        let full = &free.tokens[i];
        if full.len() < 4 || full[..3].iter().any(|t| END_TOKENS.contains(t)) {
            continue;
        }
        assert_eq!(tokens.len(), 4, "request {i}");
        assert_eq!(tokens[..3], full[..3], "request {i}");
        let last = match END_TOKENS.contains(&full[3]) {
            true => full[3],
            false => END_TOKENS[0],
        };
        assert_eq!(tokens[3], last, "request {i}: the 4th token is replaced");
        assert_eq!(fd.finished[i], Some(FinishReason::Length), "request {i}");
        replaced += usize::from(last != full[3]);
    }
    assert!(replaced > 0, "no token was replaced");
}

#[test]
fn stop_tokens_cut_at_the_first_one() {
    for strategy in [Strategy::TargetMatch, Strategy::Greedy] {
        let unlimited = requests(0x5709, 8);
        let free = run_both(strategy, &arrivals(&unlimited), false);
        // Each request stops at the token it generated third (and at one it never generates).
        let stops: Vec<Option<i32>> = free.tokens.iter().map(|t| t.get(2).copied()).collect();
        let stopping: Vec<Request> = unlimited
            .iter()
            .zip(&stops)
            .map(|(r, stop)| match stop {
                Some(t) => r.clone().with_stop_tokens(vec![VOCAB as i32 - 1, *t]),
                None => r.clone(),
            })
            .collect();
        let cut = run_both(strategy, &arrivals(&stopping), false);
        let mut stopped = 0;
        for (i, stop) in stops.iter().enumerate() {
            let Some(stop) = stop else { continue };
            let full = &free.tokens[i];
            let never = VOCAB as i32 - 1;
            let first = full
                .iter()
                .position(|t| t == stop || *t == never)
                .expect("generated")
                + 1;
            let first_end = full.iter().position(|t| END_TOKENS.contains(t));
            if first_end.is_some_and(|e| e + 1 < first) {
                continue;
            }
            assert_eq!(cut.tokens[i], full[..first], "{strategy} request {i}");
            assert_eq!(
                cut.finished[i],
                Some(FinishReason::EndToken),
                "{strategy} {i}"
            );
            stopped += 1;
        }
        assert!(
            stopped > 2,
            "{strategy}: {stopped} requests stopped by a stop token"
        );
    }
}

#[test]
fn a_stop_token_within_min_tokens_does_not_stop() {
    let unlimited = requests(0x313, 6);
    let free = run_both(Strategy::Greedy, &arrivals(&unlimited), false);
    let with_min: Vec<Request> = unlimited
        .iter()
        .zip(&free.tokens)
        .map(|(r, tokens)| {
            let params = r.params().with_min_tokens(1);
            r.clone()
                .with_params(params)
                .with_stop_tokens(tokens.first().copied().into_iter().collect())
        })
        .collect();
    let result = run_both(Strategy::Greedy, &arrivals(&with_min), false);
    for (i, tokens) in result.tokens.iter().enumerate() {
        let first = free.tokens[i][0];
        if END_TOKENS.contains(&first) {
            continue;
        }
        // min_tokens only bans the decoder's end tokens, so the first token is the same; it is
        // a stop token but the first, so the request goes on.
        assert_eq!(tokens[0], first, "request {i}");
        assert!(tokens.len() > 1 || result.finished[i] != Some(FinishReason::EndToken));
    }
}

#[test]
fn a_host_stopped_slot_never_steps_again() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let mut decoder = Decoder::new(device.clone(), speculative(Strategy::Greedy)).expect("decoder");
    let short = decoder
        .insert(Request::new(vec![1, 2, 3, 1, 2]).with_max_dec_len(2))
        .expect("insert");
    let long = decoder
        .insert(Request::new(vec![4, 5, 6, 4, 5]).with_max_dec_len(30))
        .expect("insert");
    while decoder.has_running() {
        let stopped = decoder.finish_reason(short).is_some();
        let plan = decoder.plan().expect("plan");
        let logits =
            forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
        let output = decoder.finish(StepScores::logits(&logits)).expect("finish");
        if stopped {
            assert!(plan.slots.iter().all(|s| s.slot != short));
            assert!(output.slots.iter().all(|s| s.slot != short));
        }
    }
    assert_eq!(decoder.generated(short).map(<[i32]>::len), Some(2));
    assert_eq!(decoder.finish_reason(short), Some(FinishReason::Length));
    assert!(decoder.generated(long).is_some_and(|g| !g.is_empty()));
}

/// Runs `requests` to the end with a decoder computing `k_max` log-probabilities, one request per
/// slot; returns each slot's outputs (tokens, log-probabilities) over the steps.
type Emitted = Vec<(Vec<i32>, Option<Vec<specula_sampler::TokenLogprob>>)>;

fn run_logprobs(config: SamplerConfig, requests: &[Request]) -> Vec<Emitted> {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let mut decoder = Decoder::new(device.clone(), config).expect("decoder");
    for r in requests {
        decoder.insert(r.clone()).expect("insert");
    }
    let mut emitted = vec![Vec::new(); requests.len()];
    while decoder.has_running() {
        let plan = decoder.plan().expect("plan");
        let logits =
            forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
        for out in decoder
            .finish(StepScores::logits(&logits))
            .expect("finish")
            .slots
        {
            emitted[out.slot].push((out.tokens, out.logprobs));
        }
    }
    emitted
}

#[test]
fn each_request_gets_logprobs_of_its_own_width() {
    let k_max = 5;
    let base = requests(0x0010_9806, 4);
    let widths = [Some(2), Some(0), None, Some(k_max)];
    let asked: Vec<Request> = base
        .iter()
        .zip(widths)
        .map(|(r, k)| {
            let r = r.clone().with_max_dec_len(9).with_stop_tokens(vec![30]);
            match k {
                Some(k) => r.with_logprobs(k),
                None => r,
            }
        })
        .collect();
    let every: Vec<Request> = asked
        .iter()
        .map(|r| r.clone().with_logprobs(k_max))
        .collect();
    for config in [
        plain(Strategy::TargetMatch),
        speculative(Strategy::TargetMatch),
    ] {
        let config = SamplerConfig {
            logprobs: Some(k_max),
            ..config
        };
        let got = run_logprobs(config.clone(), &asked);
        let full = run_logprobs(config, &every);
        for (slot, k) in widths.iter().enumerate() {
            for ((tokens, lp), (full_tokens, full_lp)) in got[slot].iter().zip(&full[slot]) {
                assert_eq!(tokens, full_tokens);
                let full_lp = full_lp.as_ref().expect("asked for K");
                assert_eq!(full_lp.len(), tokens.len(), "cut with the tokens");
                let Some(k) = k else {
                    assert!(lp.is_none(), "slot {slot} asked for none");
                    continue;
                };
                let lp = lp.as_ref().expect("asked");
                assert_eq!(lp.len(), tokens.len());
                for (a, b) in lp.iter().zip(full_lp) {
                    assert_eq!((a.token, a.logprob, a.rank), (b.token, b.logprob, b.rank));
                    assert_eq!(a.top, b.top[..*k], "slot {slot}: the top {k} of K");
                }
            }
        }
    }
}

#[test]
fn per_request_fields_are_validated_on_insert() {
    let device = device();
    let field = |config: SamplerConfig, request: Request| {
        let mut decoder = Decoder::new(device.clone(), config).expect("decoder");
        match decoder.insert(request) {
            Err(SamplerError::Request { field, .. }) => Some(field),
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => None,
        }
    };
    let k3 = SamplerConfig {
        logprobs: Some(3),
        ..plain(Strategy::Greedy)
    };
    let r = || Request::new(vec![1, 2]);
    assert_eq!(field(k3.clone(), r().with_logprobs(3)), None);
    assert_eq!(field(k3.clone(), r().with_logprobs(4)), Some("logprobs"));
    assert_eq!(
        field(plain(Strategy::Greedy), r().with_logprobs(0)),
        Some("logprobs")
    );
    assert_eq!(field(k3.clone(), r().with_stop_tokens(vec![5, 60])), None);
    for bad in [-1, VOCAB as i32] {
        assert_eq!(
            field(k3.clone(), r().with_stop_tokens(vec![5, bad])),
            Some("stop_tokens")
        );
    }
}
