//! Host-side harness shared by the tests: run an op on any device from host vectors.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses part of it; setup may panic

use specula_backend_api::ops::*;
use specula_backend_api::{Device, DeviceExt, Element};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;

/// The devices every known answer runs on: the reference, and the CPU backend (whose own tests
/// used to repeat these answers).
pub fn devices() -> Vec<Box<dyn Device>> {
    vec![
        Box::new(ReferenceDevice::new()),
        Box::new(CpuDevice::with_threads(2).unwrap()),
    ]
}

/// The device's name, for assertion messages.
pub fn name(dev: &dyn Device) -> &str {
    &dev.info().name
}

/// `top_k_top_p_sample` of rows of any float type.
pub fn sample<T: Element>(
    dev: &dyn Device,
    probs: &[T],
    vocab: usize,
    top_k: &[i32],
    top_p: &[f32],
    seed: &[u64],
) -> Vec<i32> {
    let rows = top_k.len();
    let (probs, k) = (dev.upload(probs).unwrap(), dev.upload(top_k).unwrap());
    let (p, s) = (dev.upload(top_p).unwrap(), dev.upload(seed).unwrap());
    let mut tokens = dev.alloc::<i32>(rows).unwrap();
    let inputs = SampleInputs::new(Scores::Probs(&probs), &k, &p, &s);
    let params = SampleParams {
        shape: RowShape { rows, vocab },
        host_top_p: None,
    };
    dev.top_k_top_p_sample(&inputs, &mut tokens, &params)
        .unwrap();
    dev.download(&tokens).unwrap()
}

/// `top_p_candidates` of rows of any float type: `(ids, scores, lens)`.
pub fn candidates<T: Element>(
    dev: &dyn Device,
    probs: &[T],
    vocab: usize,
    top_p: &[f32],
    c: usize,
) -> (Vec<i32>, Vec<f32>, Vec<i32>) {
    let rows = top_p.len();
    let (probs, p) = (dev.upload(probs).unwrap(), dev.upload(top_p).unwrap());
    let mut ids = dev.alloc::<i32>(rows * c).unwrap();
    let mut scores = dev.alloc::<f32>(rows * c).unwrap();
    let mut lens = dev.alloc::<i32>(rows).unwrap();
    let inputs = CandidatesInputs::new(Scores::Probs(&probs), &p);
    let mut out = CandidatesOutputs {
        ids: &mut ids,
        scores: &mut scores,
        lens: &mut lens,
    };
    let params = CandidatesParams {
        shape: RowShape { rows, vocab },
        candidates: c,
        host_top_p: None,
    };
    dev.top_p_candidates(&inputs, &mut out, &params).unwrap();
    (
        dev.download(&ids).unwrap(),
        dev.download(&scores).unwrap(),
        dev.download(&lens).unwrap(),
    )
}

/// `softmax` of rows of any float type, one device temperature per row.
pub fn softmax<T: Element>(
    dev: &dyn Device,
    logits: &[T],
    vocab: usize,
    temperature: &[f32],
) -> Vec<f32> {
    let (l, t) = (
        dev.upload(logits).unwrap(),
        dev.upload(temperature).unwrap(),
    );
    let mut probs = dev.alloc::<f32>(logits.len()).unwrap();
    let shape = RowShape {
        rows: temperature.len(),
        vocab,
    };
    let params = SoftmaxParams {
        shape,
        host_temperature: None,
    };
    dev.softmax(&l, &t, &mut probs, &params).unwrap();
    dev.download(&probs).unwrap()
}

/// What `accept_logprobs` wrote for the accepted tokens.
#[derive(Debug)]
pub struct Logprobs {
    pub logprobs: Vec<f32>,
    pub ranks: Vec<i32>,
    pub top_ids: Vec<i32>,
    pub top_logprobs: Vec<f32>,
}

/// `accept_logprobs` of one decode slot that accepted `tokens`, token `i` scored on row `i` of the
/// f32 `logits` at `temperature[i]`, with the top `k`.
pub fn logprobs(
    dev: &dyn Device,
    logits: &[f32],
    vocab: usize,
    temperature: &[f32],
    tokens: &[i32],
    k: usize,
) -> Logprobs {
    let n = tokens.len();
    let dims = BatchDims::new(1, 1, n);
    let up_i32 = |v: &[i32]| dev.upload(v).unwrap();
    let (l, temperature) = (
        dev.upload(logits).unwrap(),
        dev.upload(temperature).unwrap(),
    );
    let (accept_tokens, accept_num) = (up_i32(tokens), up_i32(&[n as i32]));
    let (encoder, cu_out) = (up_i32(&[0]), up_i32(&[0, n as i32]));
    let mut out = LogprobsBuffers::alloc(dev, 1, n, k).unwrap();
    dev.accept_logprobs(
        &LogprobsInputs {
            logits: &l,
            temperature: &temperature,
            accept_tokens: &accept_tokens,
            accept_num: &accept_num,
            seq_lens_encoder: &encoder,
            cu_seqlens_q_output: &cu_out,
        },
        &mut out.outputs(),
        &LogprobsParams {
            dims,
            shape: RowShape { rows: n, vocab },
            top_k: k,
            host_temperature: None,
        },
    )
    .unwrap();
    Logprobs {
        logprobs: dev.download(&out.logprobs).unwrap(),
        ranks: dev.download(&out.ranks).unwrap(),
        top_ids: dev.download(&out.top_ids).unwrap(),
        top_logprobs: dev.download(&out.top_logprobs).unwrap(),
    }
}

/// One decode slot of `ngram_match` (S = 4, 3 drafts wanted, `min_ngram_size` 1) whose history
/// is `prompt` then `generated`: returns `(draft_tokens[1..], seq_lens_this_time)`.
pub fn ngram(
    dev: &dyn Device,
    (prompt, generated): (&[i32], &[i32]),
    max_ngram_size: usize,
    max_dec_len: i32,
) -> (Vec<i32>, i32) {
    let max_model_len = 16;
    let mut history = [prompt, generated].concat();
    history.resize(max_model_len, 0);
    let up_i32 = |v: &[i32]| dev.upload(v).unwrap();
    let token_ids_all = up_i32(&history);
    let (prompt_lens, step_idx) = (
        up_i32(&[prompt.len() as i32]),
        up_i32(&[generated.len() as i32]),
    );
    let (draft_token_num, encoder) = (up_i32(&[3]), up_i32(&[0]));
    let max_dec_len = up_i32(&[max_dec_len]);
    let mut draft_tokens = up_i32(&[7, -5, -5, -5]);
    let mut this_time = up_i32(&[1]);
    dev.ngram_match(
        &NgramInputs {
            token_ids_all: &token_ids_all,
            prompt_lens: &prompt_lens,
            step_idx: &step_idx,
            draft_token_num: &draft_token_num,
            seq_lens_encoder: &encoder,
            max_dec_len: &max_dec_len,
        },
        &mut NgramOutputs {
            draft_tokens: &mut draft_tokens,
            seq_lens_this_time: &mut this_time,
        },
        &NgramParams {
            dims: BatchDims::new(1, 1, 4),
            max_model_len,
            max_ngram_size,
            min_ngram_size: 1,
            threshold: specula_backend_api::abi::DEFAULT_NGRAM_THRESHOLD,
        },
    )
    .unwrap();
    let drafts = dev.download::<i32>(&draft_tokens).unwrap();
    assert_eq!(drafts[0], 7, "position 0 is left as it was");
    (
        drafts[1..].to_vec(),
        dev.download::<i32>(&this_time).unwrap()[0],
    )
}

/// A strategy's per-row inputs on the host.
#[derive(Clone, Debug)]
pub enum HostStrategy {
    /// GREEDY target tokens.
    Greedy(Vec<i32>),
    /// TOPP candidates: ids, scores, lens, C.
    TopP(Vec<i32>, Vec<f32>, Vec<i32>, usize),
    /// REJECTION: target rows, draft rows, top_k, top_p (f32 rows).
    Rejection(Vec<f32>, Vec<f32>, Vec<i32>, Vec<f32>),
}

/// Every input of one `verify_draft_tokens` call, on the host.
#[derive(Clone, Debug)]
pub struct VerifyBatch {
    pub dims: BatchDims,
    pub rows: usize,
    pub vocab: usize,
    pub this_time: Vec<i32>,
    pub encoder: Vec<i32>,
    pub cu_out: Vec<i32>,
    pub draft_tokens: Vec<i32>,
    pub stop_flags: Vec<u8>,
    pub is_block_step: Vec<u8>,
    pub reasoning: Vec<i32>,
    pub step_idx: Vec<i32>,
    pub max_dec_len: Vec<i32>,
    pub end_tokens: Vec<i32>,
    pub seeds: Vec<u64>,
    pub accept_all: bool,
    pub reject_all: bool,
    pub strategy: HostStrategy,
}

impl VerifyBatch {
    /// One decode slot of `draft_tokens.len()` tokens (position 0 the last token) with one output
    /// row per token, nothing stopped, `max_dec_len` 1000, end token 999.
    pub fn one_slot(draft_tokens: &[i32], vocab: usize, strategy: HostStrategy) -> Self {
        let s = draft_tokens.len();
        VerifyBatch {
            dims: BatchDims::new(1, 1, s),
            rows: s,
            vocab,
            this_time: vec![s as i32],
            encoder: vec![0],
            cu_out: vec![0, s as i32],
            draft_tokens: draft_tokens.to_vec(),
            stop_flags: vec![0],
            is_block_step: vec![0],
            reasoning: vec![0],
            step_idx: vec![0],
            max_dec_len: vec![1000],
            end_tokens: vec![999],
            seeds: (0..s as u64).map(|j| 1000 + 4 * j).collect(),
            accept_all: false,
            reject_all: false,
            strategy,
        }
    }

    /// Runs the batch on `dev`: `(accept_tokens, accept_num)`.
    pub fn run(&self, dev: &dyn Device) -> (Vec<i32>, Vec<i32>) {
        let d = self.dims;
        let up_i32 = |v: &[i32]| dev.upload(v).unwrap();
        let (draft_tokens, this_time) = (up_i32(&self.draft_tokens), up_i32(&self.this_time));
        let (encoder, cu_out) = (up_i32(&self.encoder), up_i32(&self.cu_out));
        let stop_flags = dev.upload(&self.stop_flags).unwrap();
        let is_block_step = dev.upload(&self.is_block_step).unwrap();
        let (reasoning, step_idx) = (up_i32(&self.reasoning), up_i32(&self.step_idx));
        let (max_dec_len, end_tokens) = (up_i32(&self.max_dec_len), up_i32(&self.end_tokens));
        let seeds = dev.upload(&self.seeds).unwrap();
        let extra: Vec<_> = match &self.strategy {
            HostStrategy::Greedy(t) => vec![up_i32(t)],
            HostStrategy::TopP(ids, scores, lens, _) => {
                vec![up_i32(ids), dev.upload(scores).unwrap(), up_i32(lens)]
            }
            HostStrategy::Rejection(target, draft, top_k, top_p) => vec![
                dev.upload(target).unwrap(),
                dev.upload(draft).unwrap(),
                up_i32(top_k),
                dev.upload(top_p).unwrap(),
            ],
        };
        let strategy = match &self.strategy {
            HostStrategy::Greedy(_) => StrategyInputs::Greedy {
                target_tokens: &extra[0],
            },
            HostStrategy::TopP(.., c) => StrategyInputs::TopP(CandidateInputs {
                candidate_ids: &extra[0],
                candidate_scores: &extra[1],
                candidate_lens: &extra[2],
                candidates: *c,
            }),
            HostStrategy::Rejection(..) => StrategyInputs::Rejection(RejectionInputs {
                target: Scores::Probs(&extra[0]),
                draft: &extra[1],
                top_k: &extra[2],
                top_p: &extra[3],
                fallback: None,
                draft_index: None,
            }),
        };
        let inputs = VerifyInputs {
            draft_tokens: &draft_tokens,
            lens: SlotLens {
                seq_lens_this_time: &this_time,
                seq_lens_encoder: &encoder,
            },
            cu_seqlens_q_output: &cu_out,
            state: VerifySlotState {
                stop_flags: &stop_flags,
                is_block_step: &is_block_step,
                reasoning_status: &reasoning,
                step_idx: &step_idx,
                max_dec_len: &max_dec_len,
                end_tokens: &end_tokens,
            },
            seeds: &seeds,
            strategy,
        };
        let mut accept_tokens = dev.alloc::<i32>(d.max_bsz * d.max_step_tokens).unwrap();
        let mut accept_num = dev.alloc::<i32>(d.max_bsz).unwrap();
        let mut out = VerifyOutputs {
            accept_tokens: &mut accept_tokens,
            accept_num: &mut accept_num,
        };
        let params = VerifyParams {
            dims: d,
            rows: self.rows,
            vocab: self.vocab,
            accept_all: self.accept_all,
            reject_all: self.reject_all,
            host: None,
        };
        dev.verify_draft_tokens(&inputs, &mut out, &params).unwrap();
        (
            dev.download(&accept_tokens).unwrap(),
            dev.download(&accept_num).unwrap(),
        )
    }
}
