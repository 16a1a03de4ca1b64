//! Logits processing in the decoder (`docs/semantics.md` §4c): speculative decoding emits exactly
//! the tokens of plain decoding with every parameter on — penalties, bad words, min_tokens, logit
//! bias, allowed ids, min_p and a runner bitmask — with the n-gram proposer and with a runner's
//! drafts that repeat tokens (so that the penalties bite within a step); and each parameter does
//! what it says.

mod common;

use common::{
    Arrival, Extras, Forward, Rng, RunResult, ToyModel, VOCAB, device, request, run_with,
};
use specula_backend_api::Strategy;
use specula_sampler::{FinishReason, NgramConfig, Request, SamplerConfig};

const END_TOKENS: [i32; 2] = [0, 17];

fn plain(strategy: Strategy, max_bsz: usize) -> SamplerConfig {
    SamplerConfig::new(strategy, max_bsz, VOCAB, 64, END_TOKENS.to_vec())
}

fn speculative(strategy: Strategy, max_bsz: usize, s: usize, ngram: bool) -> SamplerConfig {
    let config = plain(strategy, max_bsz);
    match ngram {
        true => config.with_ngram(s, NgramConfig::default()),
        false => SamplerConfig {
            max_step_tokens: s,
            ..config
        },
    }
}

/// A request with every parameter of §4c on, aimed at the toy model's favoured chain so that
/// each one changes what it emits.
fn processed_request(rng: &mut Rng, model: &ToyModel) -> Request {
    let base = request(rng, model, 12);
    let last = *base.prompt.last().expect("a prompt");
    let next = model.successor(last);
    let token = |rng: &mut Rng| rng.range(1, VOCAB - 1) as i32;
    let params = base
        .params()
        .with_repetition_penalty(rng.pick(&[1.3, 0.8, 1.1, 2.0]))
        .with_frequency_presence(rng.pick(&[0.0, 0.4, 1.5]), rng.pick(&[0.0, 0.3, -0.2]))
        .with_min_p(rng.pick(&[0.0, 0.05, 0.2]))
        .with_min_tokens(rng.range(0, 6));
    let mut request = base
        .with_params(params)
        .with_logit_bias(vec![(next, rng.pick(&[-3.0, 2.0])), (token(rng), 1.5)])
        .with_bad_words(vec![
            vec![token(rng)],
            vec![next, model.successor(next)],
            vec![last, next, model.successor(next)],
        ]);
    if rng.range(0, 2) == 0 {
        let allowed = (0..VOCAB as i32).filter(|v| v % 7 != 3).collect();
        request = request.with_allowed_token_ids(allowed);
    }
    request
}

/// The runner's structured-output mask: bans `v` when `(v + context length) % 11 == 0`.
fn bitmask(prefix: &[i32], vocab: usize) -> Vec<u32> {
    let mut mask = vec![0u32; vocab.div_ceil(32)];
    for v in (0..vocab).filter(|v| !(v + prefix.len()).is_multiple_of(11)) {
        mask[v / 32] |= 1 << (v % 32);
    }
    mask
}

/// A runner's drafts that repeat tokens: the last token twice, then its successor's chain.
fn repeating_drafts(context: &[i32]) -> Vec<i32> {
    let last = *context.last().unwrap_or(&1);
    let model = ToyModel { vocab: VOCAB };
    vec![
        last,
        last,
        model.successor(last),
        model.successor(model.successor(last)),
    ]
}

fn arrivals(rng: &mut Rng, model: &ToyModel, count: usize) -> Vec<Arrival> {
    (0..count)
        .map(|i| Arrival {
            step: i as u64,
            request: processed_request(rng, model),
        })
        .collect()
}

fn assert_same(label: &str, a: &RunResult, b: &RunResult) {
    assert_eq!(a.tokens, b.tokens, "{label}: tokens differ");
    assert_eq!(a.finished, b.finished, "{label}: finish reasons differ");
}

fn speculative_equals_plain(strategy: Strategy, runner_drafts: bool) {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let (mut proposed, mut accepted) = (0, 0);
    for case in 0..24u64 {
        let mut rng = Rng(0x9C0C_0000 + case * 31 + strategy as u64);
        let arrivals = arrivals(&mut rng, &model, 5);
        let extras = Extras {
            bitmask: (case % 2 == 0).then_some(bitmask as common::BitmaskFn),
            drafts: runner_drafts.then_some(repeating_drafts as common::DraftFn),
            ..Extras::default()
        };
        let plain_extras = Extras {
            drafts: None,
            ..extras
        };
        let spec = speculative(strategy, 3, 5, !runner_drafts);
        let a = run_with(
            &device,
            &plain(strategy, 3),
            &model,
            &arrivals,
            Forward::Prefix,
            plain_extras,
        );
        let b = run_with(&device, &spec, &model, &arrivals, Forward::Prefix, extras);
        assert_same(&format!("{strategy} case {case}"), &a, &b);
        proposed += b.stats.drafts_proposed;
        accepted += b.stats.drafts_accepted;
    }
    assert!(
        accepted > 0 && accepted < proposed,
        "drafts must be both right and wrong ({accepted}/{proposed})"
    );
}

#[test]
fn target_match_speculative_equals_plain_with_every_parameter() {
    speculative_equals_plain(Strategy::TargetMatch, false);
}

#[test]
fn greedy_speculative_equals_plain_with_every_parameter() {
    speculative_equals_plain(Strategy::Greedy, false);
}

#[test]
fn runner_drafts_that_repeat_tokens_keep_speculative_equal_to_plain() {
    speculative_equals_plain(Strategy::TargetMatch, true);
    speculative_equals_plain(Strategy::Greedy, true);
}

#[test]
fn every_parameter_does_what_it_says() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    let config = speculative(Strategy::TargetMatch, 4, 4, true);
    for case in 0..12u64 {
        let mut rng = Rng(0x0DD5_0000 + case);
        let arrivals = arrivals(&mut rng, &model, 6);
        let extras = Extras {
            bitmask: Some(bitmask),
            drafts: None,
            ..Extras::default()
        };
        let result = run_with(&device, &config, &model, &arrivals, Forward::Prefix, extras);
        for (arrival, tokens) in arrivals.iter().zip(&result.tokens) {
            let r = &arrival.request;
            let mut context = r.prompt.clone();
            for (n, &t) in tokens.iter().enumerate() {
                // Every token is the model's own (max_dec_len ends without a fabricated one).
                assert!(
                    bitmask(&context, VOCAB)[t as usize / 32] >> (t % 32) & 1 == 1,
                    "bitmask"
                );
                if let Some(allowed) = &r.allowed_token_ids {
                    assert!(allowed.contains(&t), "token {t} not allowed");
                }
                if n < r.min_tokens {
                    assert!(!END_TOKENS.contains(&t), "end token before min_tokens");
                }
                assert_ne!(t, r.bad_words[0][0], "banned token emitted");
                // The history is the generated tokens: a bad word never reaches into the
                // prompt.
                if n > 0 {
                    let tail = [tokens[n - 1], t];
                    assert_ne!(
                        tail.as_slice(),
                        r.bad_words[1].as_slice(),
                        "two-token bad word"
                    );
                }
                context.push(t);
            }
        }
    }
}

#[test]
fn a_row_with_every_token_masked_stops_its_request() {
    let device = device();
    let model = ToyModel { vocab: VOCAB };
    // The bitmask bans everything once a context reaches 9 tokens.
    fn closing(prefix: &[i32], vocab: usize) -> Vec<u32> {
        let words = vocab.div_ceil(32);
        if prefix.len() >= 9 {
            vec![0; words]
        } else {
            vec![u32::MAX; words]
        }
    }
    let request = Request::new(vec![3, 4, 5, 6]).with_max_dec_len(40);
    let arrivals = [Arrival { step: 0, request }];
    for config in [
        plain(Strategy::TargetMatch, 1),
        speculative(Strategy::TargetMatch, 1, 4, true),
    ] {
        let extras = Extras {
            bitmask: Some(closing),
            drafts: None,
            ..Extras::default()
        };
        let result = run_with(&device, &config, &model, &arrivals, Forward::Prefix, extras);
        let tokens = &result.tokens[0];
        assert_eq!(
            tokens.len(),
            6,
            "5 tokens, then the masked row's end token: {tokens:?}"
        );
        assert_eq!(tokens[5], END_TOKENS[0]);
        assert_eq!(result.finished[0], Some(FinishReason::Masked));
    }
}

/// The CPU device as a device without logits processing (every call forwarded).
#[derive(Debug)]
struct NoProcessing {
    inner: std::sync::Arc<dyn specula_backend_api::Device>,
    desc: specula_backend_api::backend::DeviceDesc,
}

impl specula_backend_api::Backend for NoProcessing {
    fn desc(&self) -> &specula_backend_api::backend::DeviceDesc {
        &self.desc
    }
    fn run_alloc_zeroed(
        &self,
        alloc: specula_backend_api::backend::Alloc,
    ) -> specula_backend_api::Result<specula_backend_api::Buffer> {
        self.inner.run_alloc_zeroed(alloc)
    }
    fn run_upload(
        &self,
        upload: specula_backend_api::backend::Upload<'_>,
    ) -> specula_backend_api::Result<specula_backend_api::Buffer> {
        self.inner.run_upload(upload)
    }
    fn run_write(
        &self,
        write: specula_backend_api::backend::Write<'_, '_>,
    ) -> specula_backend_api::Result<()> {
        self.inner.run_write(write)
    }
    fn run_download(
        &self,
        download: specula_backend_api::backend::Download<'_>,
    ) -> specula_backend_api::Result<Vec<u8>> {
        self.inner.run_download(download)
    }
    fn run_synchronize(&self) -> specula_backend_api::Result<()> {
        self.inner.run_synchronize()
    }
    fn run(
        &self,
        call: specula_backend_api::backend::AnyCall<'_, '_>,
    ) -> specula_backend_api::Result<()> {
        self.inner.run(call)
    }
}

/// A device without logits processing refuses a request that asks for it, and a step given a
/// bitmask, with a typed error, before anything changes.
#[test]
fn a_device_without_processing_refuses_such_requests() {
    let inner = device();
    let mut desc = inner.desc().clone();
    desc.capabilities.processing = false;
    let device: std::sync::Arc<dyn specula_backend_api::Device> =
        std::sync::Arc::new(NoProcessing { inner, desc });
    let mut decoder =
        specula_sampler::Decoder::new(device.clone(), plain(Strategy::TargetMatch, 2))
            .expect("decoder");
    let request = Request::new(vec![1, 2]).with_bad_words(vec![vec![3]]);
    assert!(matches!(
        decoder.insert(request),
        Err(specula_sampler::SamplerError::ProcessingUnsupported { .. })
    ));
    assert_eq!(decoder.free_slots(), 2, "the refused request holds no slot");
    decoder
        .insert(Request::new(vec![1, 2]))
        .expect("a plain request runs");
    let plan = decoder.plan().expect("plan");
    use specula_backend_api::DeviceExt;
    let logits = device
        .upload(&vec![0.5f32; plan.t_out() * VOCAB])
        .expect("upload");
    let bitmask = device
        .upload(&vec![u32::MAX; plan.t_out() * VOCAB.div_ceil(32)])
        .expect("upload");
    let scores = specula_sampler::StepScores::logits(&logits).with_bitmask(&bitmask);
    assert!(matches!(
        decoder.finish(scores),
        Err(specula_sampler::SamplerError::ProcessingUnsupported { .. })
    ));
    // The step is still planned: finishing without the bitmask works.
    decoder
        .finish(specula_sampler::StepScores::logits(&logits))
        .expect("the plain step finishes");
}

/// A CPU device that processes and samples `rows` rows at a time.
fn cpu_in_blocks(rows: Option<usize>) -> std::sync::Arc<dyn specula_backend_api::Device> {
    let cpu = specula_backend_cpu::CpuDevice::new().expect("cpu device");
    std::sync::Arc::new(cpu.with_row_block_bytes(rows.map(|r| r * VOCAB * 4)))
}

/// Processing and sampling a step's rows a block at a time (the CPU's default, a block held in
/// its caches) emits the tokens of whole steps, and those of the reference device, for every
/// strategy that samples its rows one by one; blocks of 1, 2 and 7 rows split the steps' rows
/// at every offset.
#[test]
fn steps_in_row_blocks_emit_the_tokens_of_whole_steps() {
    let model = ToyModel { vocab: VOCAB };
    let reference: std::sync::Arc<dyn specula_backend_api::Device> =
        std::sync::Arc::new(specula_reference::ReferenceDevice::new());
    let whole = cpu_in_blocks(None);
    for strategy in [Strategy::TargetMatch, Strategy::Greedy, Strategy::TopP] {
        for case in 0..4u64 {
            let mut rng = Rng(0xB10C_0000 + case * 7 + strategy as u64);
            let arrivals = arrivals(&mut rng, &model, 5);
            let extras = Extras {
                bitmask: (case % 2 == 0).then_some(bitmask as common::BitmaskFn),
                drafts: None,
                ..Extras::default()
            };
            let config = speculative(strategy, 3, 5, true);
            let run = |device: &std::sync::Arc<dyn specula_backend_api::Device>| {
                run_with(device, &config, &model, &arrivals, Forward::Prefix, extras)
            };
            let expected = run(&whole);
            assert_same(
                &format!("{strategy} case {case}: reference"),
                &expected,
                &run(&reference),
            );
            for rows in [1, 2, 7] {
                let label = format!("{strategy} case {case}: blocks of {rows} rows");
                assert_same(&label, &expected, &run(&cpu_in_blocks(Some(rows))));
            }
        }
    }
}
