//! The decoder's API: the seed schedule, slots, call order, external drafts, strategies and
//! log-probabilities.

mod common;

use common::{Forward, Rng, ToyModel, VOCAB, argmax, device, forward};
use specula_backend_api::{DeviceExt, Strategy};
use specula_sampler::seeds::{self, MAX_INFER_SEED};
use specula_sampler::{
    Decoder, NgramConfig, Request, SamplerConfig, SamplerError, SamplingParams, StepScores,
};

fn config(strategy: Strategy, max_bsz: usize, s: usize) -> SamplerConfig {
    let config = SamplerConfig::new(strategy, max_bsz, VOCAB, 64, vec![0]);
    if s > 1 {
        config.with_ngram(s, NgramConfig::default())
    } else {
        config
    }
}

/// A decoder of `strategy` (2 slots, S = `s`) without an n-gram proposer, so that the drafts come
/// from the test, holding `request` past its prefill step: the decoder and the request's slot.
fn prefilled_without_proposer(
    strategy: Strategy,
    s: usize,
    request: Request,
    model: &ToyModel,
) -> (Decoder, usize) {
    let mut c = config(strategy, 2, s);
    c.ngram = None;
    let mut decoder = Decoder::new(device(), c).expect("decoder");
    let slot = decoder.insert(request).expect("insert");
    step(&mut decoder, model); // prefill
    (decoder, slot)
}

/// One step with the toy model through `row_prefix`.
fn step(decoder: &mut Decoder, model: &ToyModel) -> specula_sampler::StepOutput {
    let device = decoder.device().clone();
    let plan = decoder.plan().expect("plan");
    let logits = forward(device.as_ref(), decoder, &plan, model, Forward::Prefix).expect("forward");
    decoder.finish(StepScores::logits(&logits)).expect("finish")
}

#[test]
fn infer_seed_advances_by_four_per_emitted_token() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let seeds_under_test = [
        0u64,
        12345,
        MAX_INFER_SEED - 1,
        MAX_INFER_SEED - 9,
        MAX_INFER_SEED,
        u64::MAX,
    ];
    for s in [1, 6] {
        let mut decoder =
            Decoder::new(device.clone(), config(Strategy::TargetMatch, 8, s)).expect("decoder");
        for (i, &seed) in seeds_under_test.iter().enumerate() {
            let prompt = common::prompt(&mut Rng(i as u64), &model, 5);
            decoder
                .insert(Request::new(prompt).with_seed(seed).with_max_dec_len(30))
                .expect("insert");
        }
        while decoder.has_running() {
            step(&mut decoder, &model);
            for (slot, &seed) in seeds_under_test.iter().enumerate() {
                let emitted = decoder.generated(slot).expect("occupied").len() as u64;
                let expected = seeds::infer_seed_after(seeds::request_seed(seed), emitted);
                assert_eq!(
                    decoder.infer_seed(slot).expect("seed"),
                    expected,
                    "S {s} slot {slot}"
                );
                assert_eq!(
                    expected,
                    ((seed % MAX_INFER_SEED) as u128 + 4 * emitted as u128) as u64 % MAX_INFER_SEED
                );
            }
        }
    }
}

#[test]
fn slots_and_call_order_are_checked() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let mut decoder =
        Decoder::new(device.clone(), config(Strategy::Greedy, 2, 4)).expect("decoder");
    assert!(matches!(
        decoder.finish(StepScores::logits(
            &device.alloc::<f32>(VOCAB).expect("alloc")
        )),
        Err(SamplerError::Phase { call: "finish", .. })
    ));
    // No request: the plan is empty and the decoder stays idle.
    assert!(decoder.plan().expect("plan").is_empty());

    let bad = |r: Request| {
        Decoder::new(device.clone(), config(Strategy::Greedy, 2, 4))
            .expect("decoder")
            .insert(r)
    };
    assert!(matches!(
        bad(Request::new(vec![])),
        Err(SamplerError::Request {
            field: "prompt",
            ..
        })
    ));
    assert!(matches!(
        bad(Request::new(vec![VOCAB as i32])),
        Err(SamplerError::Request {
            field: "prompt",
            ..
        })
    ));
    assert!(matches!(
        bad(Request::new(vec![1; 64])),
        Err(SamplerError::Request {
            field: "prompt",
            ..
        })
    ));
    assert!(matches!(
        bad(Request::new(vec![1]).with_params(SamplingParams::default().with_top_p(0.0))),
        Err(SamplerError::Request { field: "top_p", .. })
    ));
    assert!(matches!(
        bad(Request::new(vec![1]).with_params(SamplingParams::default().with_temperature(f32::NAN))),
        Err(SamplerError::Request {
            field: "temperature",
            ..
        })
    ));
    assert!(matches!(
        bad(Request::new(vec![1]).with_max_dec_len(0)),
        Err(SamplerError::Request {
            field: "max_dec_len",
            ..
        })
    ));

    assert_eq!(decoder.insert(Request::new(vec![5, 6])).expect("insert"), 0);
    assert!(matches!(
        decoder.insert_at(0, Request::new(vec![5])),
        Err(SamplerError::SlotOccupied { slot: 0 })
    ));
    assert!(matches!(
        decoder.insert_at(2, Request::new(vec![5])),
        Err(SamplerError::SlotOutOfRange {
            slot: 2,
            max_bsz: 2
        })
    ));
    assert!(matches!(
        decoder.remove(1),
        Err(SamplerError::SlotEmpty { slot: 1 })
    ));

    let plan = decoder.plan().expect("plan");
    assert_eq!(plan.t_out(), 1);
    assert_eq!(plan.input_tokens, vec![5, 6]);
    assert_eq!(plan.input_positions, vec![0, 1]);
    assert_eq!(decoder.row_prefix(0).expect("prefix"), vec![5, 6]);
    assert_eq!(decoder.plan().expect("same plan"), plan);
    assert!(matches!(
        decoder.insert(Request::new(vec![1])),
        Err(SamplerError::Phase { call: "insert", .. })
    ));
    // A wrong shape leaves the step planned: finishing again with the right scores works.
    let wrong = device.alloc::<f32>(VOCAB + 1).expect("alloc");
    assert!(matches!(
        decoder.finish(StepScores::logits(&wrong)),
        Err(SamplerError::ScoresShape { .. })
    ));
    let too_many = device
        .alloc::<f32>(VOCAB * (plan.gather_rows + 1))
        .expect("alloc");
    assert!(matches!(
        decoder.finish(StepScores::logits(&too_many)),
        Err(SamplerError::ScoresShape { .. })
    ));
    let logits =
        forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
    let output = decoder.finish(StepScores::logits(&logits)).expect("finish");
    assert_eq!(output.slots.len(), 1);
    assert_eq!(output.slots[0].tokens.len(), 1);
    assert_eq!(
        decoder.generated(0).expect("slot 0"),
        output.slots[0].tokens.as_slice()
    );
    let removed = decoder.remove(0).expect("remove");
    assert_eq!(removed.generated, output.slots[0].tokens);
    assert_eq!(removed.finished, None);
    assert_eq!(decoder.free_slots(), 2);
}

#[test]
fn config_is_validated() {
    let device = device();
    let mut c = config(Strategy::Rejection, 2, 4);
    assert!(matches!(
        Decoder::new(device.clone(), c.clone()),
        Err(SamplerError::Config {
            field: "strategy",
            ..
        })
    ));
    c.strategy = Strategy::Greedy;
    c.end_tokens.clear();
    assert!(matches!(
        Decoder::new(device.clone(), c.clone()),
        Err(SamplerError::Config {
            field: "end_tokens",
            ..
        })
    ));
    c.end_tokens = vec![0];
    c.candidates = 129;
    assert!(matches!(
        Decoder::new(device.clone(), c.clone()),
        Err(SamplerError::Config {
            field: "candidates",
            ..
        })
    ));
    c.candidates = 8;
    c.logprobs = Some(65);
    assert!(matches!(
        Decoder::new(device, c),
        Err(SamplerError::Config {
            field: "logprobs",
            ..
        })
    ));
}

/// Drafts from the runner: right drafts are all accepted plus a bonus token, a wrong draft is
/// replaced by the correction token.
#[test]
fn external_drafts_are_verified() {
    let model = ToyModel { vocab: VOCAB };
    let request = Request::new(vec![3, 9, 4]).with_params(SamplingParams::greedy());
    let (mut decoder, slot) = prefilled_without_proposer(Strategy::Greedy, 5, request, &model);
    let greedy_next = |prefix: &[i32]| argmax(&model.logits(prefix)) as i32;
    for wrong_at in [None, Some(0), Some(2)] {
        decoder.propose().expect("propose");
        let mut context = decoder.context(slot).expect("slot").to_vec();
        let mut drafts = Vec::new();
        for i in 0..4 {
            let next = greedy_next(&context);
            let draft = if Some(i) == wrong_at {
                (next + 1) % VOCAB as i32
            } else {
                next
            };
            drafts.push(draft);
            context.push(draft);
        }
        assert!(matches!(
            decoder.set_drafts(slot, &[1, 2, 3, 4, 5]),
            Err(SamplerError::Drafts { .. })
        ));
        decoder.set_drafts(slot, &drafts).expect("set drafts");
        let before = decoder.context(slot).expect("slot").to_vec();
        let output = step(&mut decoder, &model);
        let out = &output.slots[0];
        assert_eq!(out.drafts_proposed, 4);
        let accepted = wrong_at.unwrap_or(4);
        assert_eq!(out.drafts_accepted, accepted, "wrong at {wrong_at:?}");
        assert_eq!(&out.tokens[..accepted], &drafts[..accepted]);
        assert_eq!(out.tokens.len(), accepted + 1);
        // The last token is the greedy continuation of what was accepted.
        let mut prefix = before;
        prefix.extend_from_slice(&drafts[..accepted]);
        assert_eq!(out.tokens[accepted], greedy_next(&prefix));
    }
    assert!(matches!(
        decoder.set_drafts(slot, &[1]),
        Err(SamplerError::Phase {
            call: "set_drafts",
            ..
        })
    ));
}

#[test]
fn rejection_needs_draft_probabilities_when_there_are_drafts() {
    let model = ToyModel { vocab: VOCAB };
    let s = 4;
    // The prefill step has no drafts: it needs no draft probabilities.
    let request = Request::new(vec![3, 9, 4]).with_seed(5);
    let (mut decoder, slot) = prefilled_without_proposer(Strategy::Rejection, s, request, &model);
    let device = decoder.device().clone();
    let mut total_accepted = 0;
    for _ in 0..6 {
        decoder.propose().expect("propose");
        // The draft model is the target model itself (host softmax), drafting its own argmax.
        let mut context = decoder.context(slot).expect("slot").to_vec();
        let mut drafts = Vec::new();
        let mut draft_probs = vec![0.0f32; 2 * (s - 1) * VOCAB];
        for i in 0..s - 1 {
            let probs = model.softmax(&model.logits(&context), 1.0);
            let d = argmax(&probs) as i32;
            draft_probs[(slot * (s - 1) + i) * VOCAB..][..VOCAB].copy_from_slice(&probs);
            drafts.push(d);
            context.push(d);
        }
        decoder.set_drafts(slot, &drafts).expect("set drafts");
        let plan = decoder.plan().expect("plan");
        let logits =
            forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
        assert!(matches!(
            decoder.finish(StepScores::logits(&logits)),
            Err(SamplerError::MissingDraftProbs)
        ));
        let draft_probs = device.upload(&draft_probs).expect("upload");
        let output = decoder
            .finish(StepScores::logits(&logits).with_draft_probs(&draft_probs))
            .expect("finish");
        total_accepted += output.slots[0].drafts_accepted;
        if !decoder.is_running(slot) {
            break;
        }
    }
    // With q = p, drafts are accepted with probability ~1.
    assert!(total_accepted > 0);
}

#[test]
fn topp_strategy_decodes() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let mut c = config(Strategy::TopP, 3, 5);
    c.candidates = 4;
    let mut decoder = Decoder::new(device.clone(), c).expect("decoder");
    let mut rng = Rng(3);
    for _ in 0..3 {
        let prompt = common::prompt(&mut rng, &model, 8);
        decoder
            .insert(
                Request::new(prompt)
                    .with_params(SamplingParams::default().with_top_p(0.8))
                    .with_max_dec_len(20),
            )
            .expect("insert");
    }
    while decoder.has_running() {
        step(&mut decoder, &model);
    }
    let stats = decoder.stats();
    assert!(stats.drafts_accepted > 0, "{stats:?}");
    for slot in 0..3 {
        let generated = decoder.generated(slot).expect("slot");
        assert!(!generated.is_empty() && generated.len() <= 20);
        assert!(generated.iter().all(|&t| (0..VOCAB as i32).contains(&t)));
        assert!(decoder.finish_reason(slot).is_some());
    }
}

#[test]
fn logprobs_are_reported_per_emitted_token() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let k = 3;
    let mut c = config(Strategy::TargetMatch, 2, 4);
    c.logprobs = Some(k);
    let mut decoder = Decoder::new(device.clone(), c).expect("decoder");
    decoder
        .insert(
            Request::new(vec![4, 31, 12])
                .with_seed(1)
                .with_max_dec_len(12)
                .with_logprobs(k),
        )
        .expect("insert");
    decoder
        .insert(
            Request::new(vec![7])
                .with_params(SamplingParams::greedy())
                .with_max_dec_len(12)
                .with_logprobs(k),
        )
        .expect("insert");
    let mut checked = 0;
    while decoder.has_running() {
        let output = step(&mut decoder, &model);
        for out in &output.slots {
            let logprobs = out.logprobs.as_ref().expect("configured");
            assert_eq!(logprobs.len(), out.tokens.len());
            for lp in logprobs {
                assert!(lp.logprob <= 0.0, "{lp:?}");
                assert_eq!(lp.top.len(), k);
                assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "{lp:?}");
                if lp.rank == 1 {
                    assert_eq!(lp.top[0].0, lp.token);
                }
                if lp.rank >= 1 && lp.rank as usize <= k {
                    assert_eq!(lp.top[lp.rank as usize - 1].0, lp.token, "{lp:?}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
    assert!(decoder.finish_reason(0).is_some() && decoder.finish_reason(1).is_some());
}

/// A request removed before its prefill leaves nothing behind: the slot can be reused and the
/// other requests' tokens are unchanged.
#[test]
fn removing_before_prefill_frees_the_slot() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let run_one = |with_ghost: bool| {
        let mut decoder =
            Decoder::new(device.clone(), config(Strategy::TargetMatch, 3, 5)).expect("decoder");
        if with_ghost {
            let ghost = decoder.insert(Request::new(vec![9; 40])).expect("insert");
            assert_eq!(
                decoder.remove(ghost).expect("remove").generated,
                Vec::<i32>::new()
            );
        }
        let slot = 1;
        decoder
            .insert_at(
                slot,
                Request::new(vec![1, 2, 3, 4, 5, 6, 1, 2])
                    .with_seed(11)
                    .with_max_dec_len(25),
            )
            .expect("insert");
        while decoder.has_running() {
            step(&mut decoder, &model);
        }
        decoder.generated(slot).expect("slot").to_vec()
    };
    assert_eq!(run_one(true), run_one(false));
}

#[test]
fn decode_slots_lists_the_slots_that_take_drafts() {
    let model = ToyModel { vocab: VOCAB };
    let mut c = config(Strategy::Greedy, 4, 3);
    c.ngram = None;
    let mut decoder = Decoder::new(device(), c).expect("decoder");
    let a = decoder
        .insert(Request::new(vec![1, 2, 3]).with_max_dec_len(2))
        .expect("insert");
    let b = decoder.insert(Request::new(vec![7, 8])).expect("insert");
    assert!(decoder.decode_slots().is_empty(), "both prefill next");
    step(&mut decoder, &model);
    let c = decoder.insert(Request::new(vec![6])).expect("insert");
    assert_eq!(
        decoder.decode_slots(),
        vec![a, b],
        "between steps: the next step's"
    );
    decoder.propose().expect("propose");
    assert_eq!(decoder.decode_slots(), vec![a, b]);
    for slot in decoder.decode_slots() {
        decoder
            .set_drafts(slot, &[7])
            .expect("a decode slot takes drafts");
    }
    assert!(matches!(
        decoder.set_drafts(c, &[7]),
        Err(SamplerError::Drafts { .. })
    ));
    let plan = decoder.plan().expect("plan");
    assert_eq!(decoder.decode_slots(), vec![a, b], "while planned");
    let logits = forward(
        decoder.device().as_ref(),
        &decoder,
        &plan,
        &model,
        Forward::Prefix,
    )
    .expect("fwd");
    decoder.finish(StepScores::logits(&logits)).expect("finish");
    // `a` reached max_dec_len 2 (a prefill token, then at least one more): it stopped.
    assert!(!decoder.is_running(a));
    assert_eq!(decoder.decode_slots(), vec![b, c]);
}

/// A runner's own error type for [`Decoder::step`].
#[derive(Debug, PartialEq)]
enum RunnerError {
    OutOfMemory,
    Sampler(String),
}

impl std::fmt::Display for RunnerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for RunnerError {}

#[test]
fn step_carries_the_runners_error_type() {
    use specula_sampler::StepError;
    use std::error::Error as _;

    let model = ToyModel { vocab: VOCAB };
    let device = device();
    let mut decoder = Decoder::new(device.clone(), config(Strategy::Greedy, 2, 4)).expect("new");
    decoder
        .insert(Request::new(vec![7, 8]).with_max_dec_len(6))
        .expect("insert");
    // The forward pass fails with the runner's own error: returned unchanged, with a source.
    let error = decoder
        .step(|_, _| Err(RunnerError::OutOfMemory))
        .expect_err("forward failed");
    assert!(matches!(
        error,
        StepError::Forward(RunnerError::OutOfMemory)
    ));
    assert!(error.to_string().contains("OutOfMemory"), "{error}");
    let source = error.source().expect("a source");
    assert_eq!(
        source.downcast_ref::<RunnerError>(),
        Some(&RunnerError::OutOfMemory)
    );
    // The step stayed planned: the next call finishes it.
    let mut emitted = 0;
    while decoder.has_running() {
        let output = decoder
            .step(|decoder, plan| {
                let sampler = |e: SamplerError| RunnerError::Sampler(e.to_string());
                let mut rows = Vec::new();
                for t in 0..plan.t_out() {
                    rows.extend(model.logits(&decoder.row_prefix(t).map_err(sampler)?));
                }
                device
                    .upload(&rows)
                    .map_err(|e| RunnerError::Sampler(e.to_string()))
            })
            .expect("step")
            .expect("something to run");
        emitted += output.tokens_emitted();
    }
    assert_eq!(emitted, 6);
    assert_eq!(
        decoder.step(|_, _| Err(RunnerError::OutOfMemory)).ok(),
        Some(None)
    );
    // The sampler's own errors are `Sampler`, with the sampler error as the source; a forward
    // pass returning the sampler's `Result` converts back into a `SamplerError`.
    decoder.insert(Request::new(vec![9])).expect("insert");
    let bad = decoder.step(|_, _| device.alloc::<f32>(3).map_err(SamplerError::from));
    let Err(StepError::Sampler(SamplerError::ScoresShape { .. })) = bad else {
        panic!("expected a shape error, got {bad:?}");
    };
    let back: SamplerError = decoder
        .step(|_, _| Err(SamplerError::MissingDraftProbs))
        .map(|_| ())
        .expect_err("the forward error")
        .into();
    assert!(matches!(back, SamplerError::MissingDraftProbs));
}
