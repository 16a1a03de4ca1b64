//! Sampling from logits (`docs/semantics.md` §4b): the decoder's targets are the ops' answers on
//! the logits rows at each request's temperature, and REJECTION verifies draft logits.

mod common;

use common::{Forward, Rng, ToyModel, VOCAB, argmax, device, forward, prompt};
use specula_backend_api::ops::{RowShape, SampleInputs, SampleParams, Scores};
use specula_backend_api::{Buffer, Device, DeviceExt, Strategy};
use specula_sampler::{
    Decoder, Request, SamplerConfig, SamplerError, SamplingParams, Scores as StepRows, StepPlan,
    StepScores, seeds,
};

/// What the ops say the step's output rows emit, one token per row of a plain (S = 1) step:
/// `top_k_top_p_sample` of the logits rows at each request's temperature, `top_k`, `top_p` and
/// next seed (TARGET_MATCH), or the first maximum of each row (GREEDY).
fn expected_tokens(
    device: &dyn Device,
    decoder: &Decoder,
    plan: &StepPlan,
    logits: &Buffer,
) -> Vec<i32> {
    let rows = plan.t_out();
    if decoder.config().strategy == Strategy::Greedy {
        let host: Vec<f32> = device.download(logits).expect("download");
        return host
            .chunks_exact(VOCAB)
            .map(|row| argmax(row) as i32)
            .collect();
    }
    let (mut temperature, mut top_k, mut top_p, mut seed) = (vec![], vec![], vec![], vec![]);
    for row in &plan.output_rows {
        let request = decoder.request(row.slot).expect("occupied");
        let emitted = decoder.generated(row.slot).expect("occupied").len() as u64;
        temperature.push(request.temperature);
        top_k.push(request.top_k as i32);
        top_p.push(request.top_p);
        seed.push(seeds::infer_seed_after(
            seeds::request_seed(request.seed),
            emitted,
        ));
    }
    let temperature = device.upload(&temperature).expect("upload");
    let mut tokens = device.alloc::<i32>(rows).expect("alloc");
    device
        .top_k_top_p_sample(
            &SampleInputs::new(
                Scores::logits(logits, &temperature),
                &device.upload(&top_k).expect("upload"),
                &device.upload(&top_p).expect("upload"),
                &device.upload(&seed).expect("upload"),
            ),
            &mut tokens,
            &SampleParams {
                shape: RowShape { rows, vocab: VOCAB },
                host_top_p: None,
            },
        )
        .expect("top_k_top_p_sample");
    device.download(&tokens).expect("download")
}

/// Plain decoding from logits, step by step: every emitted token is the ops' answer for its row,
/// at temperatures from 0 to 2.5 (so the rows are weighed at each request's own temperature).
fn plain_steps_emit_the_ops_tokens(strategy: Strategy) {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let config = SamplerConfig::new(strategy, 5, VOCAB, 40, vec![0]);
    let mut decoder = Decoder::new(device.clone(), config).expect("decoder");
    let mut rng = Rng(0x10_6175);
    for (i, temperature) in [0.0f32, 0.4, 1.0, 1.5, 2.5].into_iter().enumerate() {
        let request = Request::new(prompt(&mut rng, &model, 6))
            .with_params(
                SamplingParams::default()
                    .with_seed(rng.next_u64())
                    .with_top_p([1.0, 0.9, 0.7][i % 3])
                    .with_top_k([0, 5, 1000][i % 3])
                    .with_temperature(temperature),
            )
            .with_max_dec_len(20);
        decoder.insert(request).expect("insert");
    }
    let mut emitted = 0;
    while decoder.has_running() {
        let plan = decoder.plan().expect("plan");
        let logits =
            forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
        let expected = expected_tokens(device.as_ref(), &decoder, &plan, &logits);
        let output = decoder.finish(StepScores::logits(&logits)).expect("finish");
        for ((row, out), &token) in plan.output_rows.iter().zip(&output.slots).zip(&expected) {
            assert_eq!(row.slot, out.slot);
            // Every token is the model's own, the one that reaches max_dec_len too.
            assert_eq!(out.tokens, vec![token], "{strategy} step {}", plan.step);
            emitted += 1;
        }
    }
    assert!(emitted > 20, "{emitted} tokens");
}

#[test]
fn target_match_samples_each_logits_row_at_its_temperature() {
    plain_steps_emit_the_ops_tokens(Strategy::TargetMatch);
}

#[test]
fn greedy_takes_the_argmax_of_the_logits() {
    plain_steps_emit_the_ops_tokens(Strategy::Greedy);
}

/// A REJECTION decoder (S = 4, drafts from the test) holding a request past its prefill.
fn rejection_decoder(model: &ToyModel, temperature: f32) -> (Decoder, usize) {
    let config = SamplerConfig {
        max_step_tokens: 4,
        ..SamplerConfig::new(Strategy::Rejection, 2, VOCAB, 64, vec![0])
    };
    let mut decoder = Decoder::new(device(), config).expect("decoder");
    // The chain from 14 cycles through 12 ..= 17, away from the end token 0.
    let request = Request::new(vec![3, 9, 14]).with_params(
        SamplingParams::default()
            .with_seed(21)
            .with_temperature(temperature),
    );
    let slot = decoder.insert(request).expect("insert");
    let plan = decoder.plan().expect("plan");
    let device = decoder.device().clone();
    let logits = forward(device.as_ref(), &decoder, &plan, model, Forward::Prefix).expect("fwd");
    decoder
        .finish(StepScores::logits(&logits))
        .expect("prefill");
    (decoder, slot)
}

/// Sets `n` drafts that follow the toy model's chain from the slot's context and returns the
/// draft model's logits rows for them: the target model's own logits.
fn drafts_with_logits(decoder: &mut Decoder, slot: usize, model: &ToyModel, n: usize) -> Vec<f32> {
    decoder.propose().expect("propose");
    let s = decoder.config().max_step_tokens;
    let mut context = decoder.context(slot).expect("slot").to_vec();
    let mut drafts = Vec::new();
    let mut draft_logits = vec![0.0f32; decoder.config().max_bsz * (s - 1) * VOCAB];
    for i in 0..n {
        let logits = model.logits(&context);
        let d = model.successor(*context.last().expect("non-empty"));
        draft_logits[(slot * (s - 1) + i) * VOCAB..][..VOCAB].copy_from_slice(&logits);
        drafts.push(d);
        context.push(d);
    }
    decoder.set_drafts(slot, &drafts).expect("set drafts");
    draft_logits
}

/// With draft logits equal to the target's, every draft is accepted (`wq = wp` and `Wq = Wp`:
/// the acceptance test `U · wq · Wp < 2^32 · wp · Wq` always holds), whether the runner gives
/// the `T_out` rows or all `gather_rows` rows (2 drafts with S = 4: one padding row).
#[test]
fn rejection_accepts_every_draft_when_draft_logits_equal_the_target() {
    let model = ToyModel { vocab: VOCAB };
    for (mode, temperature, drafts) in [(Forward::Prefix, 1.0, 3), (Forward::Gather, 0.7, 2)] {
        let (mut decoder, slot) = rejection_decoder(&model, temperature);
        let device = decoder.device().clone();
        let mut accepted = 0;
        while decoder.is_running(slot) {
            let draft_logits = drafts_with_logits(&mut decoder, slot, &model, drafts);
            let plan = decoder.plan().expect("plan");
            let logits = forward(device.as_ref(), &decoder, &plan, &model, mode).expect("fwd");
            let draft_logits = device.upload(&draft_logits).expect("upload");
            let output = decoder
                .finish(StepScores::logits(&logits).with_draft(&draft_logits))
                .expect("finish");
            let out = &output.slots[0];
            if out.finished.is_none() {
                assert_eq!(out.drafts_accepted, drafts, "{mode:?}: {out:?}");
                assert_eq!(out.tokens.len(), drafts + 1);
            }
            accepted += out.drafts_accepted;
        }
        assert!(
            accepted >= 3 * drafts,
            "{mode:?}: {accepted} drafts accepted"
        );
    }
}

/// A REJECTION decoder past its prefill with `n` drafts of the toy chain set and planned: the
/// step's target logits (`T_out` rows) and the dense draft logits.
fn drafted_step(model: &ToyModel, n: usize) -> (Decoder, Buffer, Vec<f32>) {
    let (mut decoder, slot) = rejection_decoder(model, 1.0);
    let device = decoder.device().clone();
    let draft_logits = drafts_with_logits(&mut decoder, slot, model, n);
    let plan = decoder.plan().expect("plan");
    let logits = forward(device.as_ref(), &decoder, &plan, model, Forward::Prefix).expect("fwd");
    (decoder, logits, draft_logits)
}

/// Draft logits need target logits; draft probabilities still go with target logits.
#[test]
fn draft_rows_follow_the_target_kind() {
    let model = ToyModel { vocab: VOCAB };
    let (mut decoder, logits, draft_logits) = drafted_step(&model, 3);
    let device = decoder.device().clone();
    let softmax = |rows: &[f32]| -> Vec<f32> {
        rows.chunks_exact(VOCAB)
            .flat_map(|row| model.softmax(row, 1.0))
            .collect()
    };
    let target_logits: Vec<f32> = device.download(&logits).expect("download");
    let probs = device.upload(&softmax(&target_logits)).expect("upload");
    let draft_probs = device.upload(&softmax(&draft_logits)).expect("upload");
    let draft_logits = device.upload(&draft_logits).expect("upload");
    let mixed = StepScores {
        target: StepRows::Probs(&probs),
        draft: Some(StepRows::Logits(&draft_logits)),
        compact_draft: false,
        bitmask: None,
    };
    assert!(matches!(
        decoder.finish(mixed),
        Err(SamplerError::DraftLogitsNeedLogits)
    ));
    let output = decoder
        .finish(StepScores::logits(&logits).with_draft_probs(&draft_probs))
        .expect("finish");
    assert!(!output.slots[0].tokens.is_empty());
}

/// One REJECTION step on two decoders in lockstep (the same requests and drafts): `dense` is
/// given the dense `[max_bsz · (S − 1), V]` draft logits, `compact` only the drafted rows in the
/// plan's order (`StepScores::with_draft_rows`). Slot `b` drafts `(step + b) mod S` tokens
/// (0 ..= S − 1), now and then off the model's chain; the draft logits are the target's with
/// noise. Returns the two outputs and the number of drafts.
fn lockstep_rejection_step(
    [dense, compact]: [&mut Decoder; 2],
    model: &ToyModel,
    rng: &mut Rng,
    step: usize,
) -> [specula_sampler::StepOutput; 2] {
    let device = dense.device().clone();
    let s = dense.config().max_step_tokens;
    dense.propose().expect("propose");
    compact.propose().expect("propose");
    let mut dense_rows = vec![0.0f32; dense.config().max_bsz * (s - 1) * VOCAB];
    for slot in dense.decode_slots() {
        let mut context = dense.context(slot).expect("slot").to_vec();
        let mut drafts = Vec::new();
        for i in 0..(step + slot) % s {
            let row = &mut dense_rows[(slot * (s - 1) + i) * VOCAB..][..VOCAB];
            row.copy_from_slice(&model.logits(&context));
            row.iter_mut()
                .for_each(|x| *x += rng.range(0, 200) as f32 / 100.0 - 1.0);
            let last = *context.last().expect("non-empty");
            let d = match rng.range(0, 4) {
                0 => rng.range(0, VOCAB - 1) as i32,
                _ => model.successor(last),
            };
            drafts.push(d);
            context.push(d);
        }
        dense.set_drafts(slot, &drafts).expect("set drafts");
        compact.set_drafts(slot, &drafts).expect("set drafts");
    }
    let plan = dense.plan().expect("plan");
    assert_eq!(compact.plan().expect("plan"), plan);
    let compact_rows: Vec<f32> = plan
        .slots
        .iter()
        .flat_map(|p| (0..p.drafts).map(move |i| p.slot * (s - 1) + i))
        .flat_map(|q| dense_rows[q * VOCAB..(q + 1) * VOCAB].to_vec())
        .collect();
    let logits = forward(device.as_ref(), dense, &plan, model, Forward::Prefix).expect("fwd");
    let dense_rows = device.upload(&dense_rows).expect("upload");
    let dense_out = dense
        .finish(StepScores::logits(&logits).with_draft(&dense_rows))
        .expect("dense finish");
    let compact_out = match plan.drafts() {
        0 => compact.finish(StepScores::logits(&logits)),
        _ => {
            let rows = device.upload(&compact_rows).expect("upload");
            compact.finish(StepScores::logits(&logits).with_draft_rows(&rows))
        }
    };
    [dense_out, compact_out.expect("compact finish")]
}

/// REJECTION given only the drafted rows emits exactly the tokens of the dense draft rows, step
/// by step, with three requests drafting 0 ..= S − 1 tokens each; compact rows that are not one
/// per draft are refused.
#[test]
fn compact_draft_rows_emit_the_dense_tokens() {
    let model = ToyModel { vocab: VOCAB };
    let config = SamplerConfig {
        max_step_tokens: 4,
        ..SamplerConfig::new(Strategy::Rejection, 3, VOCAB, 64, vec![0])
    };
    let device = device();
    let mut decoders =
        [0, 1].map(|_| Decoder::new(device.clone(), config.clone()).expect("decoder"));
    let mut rng = Rng(77);
    let prompts = [vec![3, 9, 14], vec![5, 2], vec![11, 12, 13, 7]];
    for decoder in &mut decoders {
        for (k, prompt) in prompts.iter().enumerate() {
            let params = SamplingParams::default()
                .with_seed(5 + k as u64)
                .with_temperature(0.8);
            let request = Request::new(prompt.clone()).with_params(params);
            decoder.insert(request).expect("insert");
        }
    }
    let [dense, compact] = &mut decoders;
    let (mut drafts, mut accepted, mut rejected) = (0, 0, 0);
    for step in 0..12 {
        if !dense.has_running() {
            break;
        }
        let [a, b] = lockstep_rejection_step([dense, compact], &model, &mut rng, step);
        assert_eq!(a.slots, b.slots, "step {step}");
        for out in &a.slots {
            drafts += out.drafts_proposed;
            accepted += out.drafts_accepted;
            rejected += usize::from(out.drafts_accepted < out.drafts_proposed);
        }
    }
    // Both outcomes happened, over steps with drafts.
    assert!(
        drafts > 0 && accepted > 0 && rejected > 0,
        "{drafts} {accepted} {rejected}"
    );
}

/// Compact draft rows must be one row of V per draft of the plan.
#[test]
fn compact_draft_rows_are_one_per_draft() {
    let model = ToyModel { vocab: VOCAB };
    let (mut decoder, logits, dense_rows) = drafted_step(&model, 2);
    let device = decoder.device().clone();
    let dense_rows = device.upload(&dense_rows).expect("upload");
    let result = decoder.finish(StepScores::logits(&logits).with_draft_rows(&dense_rows));
    assert!(matches!(
        result,
        Err(SamplerError::DraftRows { expected, actual })
            if expected == 2 * VOCAB && actual == 2 * 3 * VOCAB
    ));
}
