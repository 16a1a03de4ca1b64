//! Running a case on a device: upload the inputs, surround every output with guard regions, run the
//! op, download the outputs and check the guards.

use std::collections::BTreeMap;

use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, DType, Device, Strategy};

use crate::case::{Case, CaseParams};
use crate::tensor::HostTensor;
use crate::{ConformanceError, Result};

/// Bytes of guard region on each side of an output (a multiple of every binding-offset alignment
/// the GPU backends need).
pub const GUARD_BYTES: usize = 256;
/// The byte every guard region (and every output, before the op) is filled with.
pub const CANARY: u8 = 0xA5;

/// A write outside an output's window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardViolation {
    /// The output tensor.
    pub tensor: String,
    /// Element offset relative to the window start (negative: before it).
    pub element: i64,
}

/// What a device produced for a case.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// Output tensors by name (in/out buffers included, with their final contents).
    pub tensors: BTreeMap<String, HostTensor>,
    /// Writes outside the outputs' windows.
    pub guard_violations: Vec<GuardViolation>,
}

/// An output buffer inside a larger allocation, between two canary-filled guard regions.
struct Guarded {
    name: String,
    shape: Vec<usize>,
    guard: usize,
    buffer: Buffer,
}

struct Runner<'a> {
    device: &'a dyn Device,
    case: &'a Case,
    guarded: Vec<Guarded>,
}

impl<'a> Runner<'a> {
    fn tensor(&self, name: &str) -> Result<&'a HostTensor> {
        self.case.inputs.get(name).ok_or_else(|| {
            ConformanceError::Format(format!(
                "case {} ({}) has no input tensor `{name}`",
                self.case.name,
                self.case.op()
            ))
        })
    }

    /// Uploads an input tensor as a plain buffer.
    fn input(&self, name: &str) -> Result<Buffer> {
        let t = self.tensor(name)?;
        Ok(self.device.upload_bytes(t.dtype, &t.bytes)?)
    }

    /// Uploads an optional input tensor.
    fn optional(&self, name: &str) -> Result<Option<Buffer>> {
        match self.case.inputs.contains_key(name) {
            true => self.input(name).map(Some),
            false => Ok(None),
        }
    }

    fn guarded(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Option<&[u8]>,
    ) -> Result<usize> {
        let size = dtype.size_bytes();
        let guard = GUARD_BYTES / size;
        let len: usize = shape.iter().product();
        let mut bytes = vec![CANARY; (len + 2 * guard) * size];
        if let Some(init) = init {
            bytes[guard * size..guard * size + init.len()].copy_from_slice(init);
        }
        let mut buffer = self.device.upload_bytes(dtype, &bytes)?;
        buffer.set_window(guard, len)?;
        self.guarded.push(Guarded {
            name: name.to_owned(),
            shape: shape.to_vec(),
            guard,
            buffer,
        });
        Ok(self.guarded.len() - 1)
    }

    /// A guarded output, filled with the canary before the op.
    fn output(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<usize> {
        self.guarded(name, dtype, shape, None)
    }

    /// A guarded in/out buffer holding the input tensor of the same name.
    fn inout(&mut self, name: &str) -> Result<usize> {
        let t = self.tensor(name)?;
        self.guarded(name, t.dtype, &t.shape.clone(), Some(&t.bytes.clone()))
    }

    /// Downloads every guarded buffer and checks its guards.
    fn finish(self) -> Result<Outputs> {
        let mut outputs = Outputs::default();
        self.device.synchronize()?;
        for mut g in self.guarded {
            let len = g.buffer.len();
            let dtype = g.buffer.dtype();
            g.buffer.reset_window();
            let all = self.device.download_bytes(&g.buffer)?;
            let size = dtype.size_bytes();
            let window = &all[g.guard * size..(g.guard + len) * size];
            for (i, chunk) in all.chunks_exact(size).enumerate() {
                let inside = i >= g.guard && i < g.guard + len;
                if !inside && chunk.iter().any(|&b| b != CANARY) {
                    outputs.guard_violations.push(GuardViolation {
                        tensor: g.name.clone(),
                        element: i as i64 - g.guard as i64,
                    });
                }
            }
            outputs.tensors.insert(
                g.name,
                HostTensor::from_bytes(dtype, g.shape, window.to_vec())?,
            );
        }
        Ok(outputs)
    }
}

/// Splits the guarded buffers into disjoint `&mut` borrows by index.
fn pick<const N: usize>(guarded: &mut [Guarded], indices: [usize; N]) -> [&mut Buffer; N] {
    let mut refs: Vec<Option<&mut Buffer>> =
        guarded.iter_mut().map(|g| Some(&mut g.buffer)).collect();
    indices.map(|i| {
        refs[i]
            .take()
            .unwrap_or_else(|| unreachable!("each guarded buffer is picked once"))
    })
}

/// Runs `case` on `device` and returns its outputs and any guard violation.
pub fn run_case(device: &dyn Device, case: &Case) -> Result<Outputs> {
    let mut r = Runner {
        device,
        case,
        guarded: Vec::new(),
    };
    let i32s = DType::I32;
    match &case.params {
        CaseParams::BuildOutputLayout { dims, rows } => {
            let (this_time, encoder) =
                (r.input("seq_lens_this_time")?, r.input("seq_lens_encoder")?);
            let a = r.output("seq_lens_output", i32s, &[dims.max_bsz])?;
            let b = r.output("cu_seqlens_q", i32s, &[dims.real_bsz + 1])?;
            let c = r.output("cu_seqlens_q_output", i32s, &[dims.real_bsz + 1])?;
            let d = r.output("batch_id_per_token_output", i32s, &[*rows])?;
            let [a, b, c, d] = pick(&mut r.guarded, [a, b, c, d]);
            device.build_output_layout(
                &SlotLens {
                    seq_lens_this_time: &this_time,
                    seq_lens_encoder: &encoder,
                },
                &mut LayoutOutputs {
                    seq_lens_output: a,
                    cu_seqlens_q: b,
                    cu_seqlens_q_output: c,
                    batch_id_per_token_output: d,
                },
                &LayoutParams {
                    dims: (*dims).into(),
                    host: None,
                },
            )?;
        }
        CaseParams::GatherNextToken {
            dims,
            token_num,
            hidden,
            is_speculative,
        } => {
            let x = r.input("hidden_states")?;
            let cu_q = r.input("cu_seqlens_q")?;
            let (this_time, encoder) =
                (r.input("seq_lens_this_time")?, r.input("seq_lens_encoder")?);
            let (cu_out, batch_id) = (
                r.input("cu_seqlens_q_output")?,
                r.input("batch_id_per_token_output")?,
            );
            let rows = if *is_speculative {
                batch_id.len()
            } else {
                dims.max_bsz
            };
            let o = r.output("out", x.dtype(), &[rows, *hidden])?;
            let [o] = pick(&mut r.guarded, [o]);
            device.gather_next_token(
                &GatherInputs {
                    hidden_states: &x,
                    cu_seqlens_q: &cu_q,
                    lens: SlotLens {
                        seq_lens_this_time: &this_time,
                        seq_lens_encoder: &encoder,
                    },
                    layout: OutputLayout {
                        cu_seqlens_q_output: &cu_out,
                        batch_id_per_token_output: &batch_id,
                    },
                },
                o,
                &GatherParams {
                    dims: (*dims).into(),
                    token_num: *token_num,
                    hidden: *hidden,
                    is_speculative: *is_speculative,
                    host: None,
                },
            )?;
        }
        CaseParams::BuildSamplingParams { dims } => {
            let (top_p, top_k) = (r.input("top_p")?, r.input("top_k")?);
            let (temperature, infer_seed) = (r.input("temperature")?, r.input("infer_seed")?);
            let (this_time, encoder) =
                (r.input("seq_lens_this_time")?, r.input("seq_lens_encoder")?);
            let (cu_out, batch_id) = (
                r.input("cu_seqlens_q_output")?,
                r.input("batch_id_per_token_output")?,
            );
            let rows = batch_id.len();
            let a = r.output("row_top_p", DType::F32, &[rows])?;
            let b = r.output("row_top_k", i32s, &[rows])?;
            let c = r.output("row_temperature", DType::F32, &[rows])?;
            let d = r.output("row_seed", DType::U64, &[rows])?;
            let [a, b, c, d] = pick(&mut r.guarded, [a, b, c, d]);
            device.build_sampling_params(
                &SamplingParamsInputs {
                    slots: SlotSamplingParams {
                        top_p: &top_p,
                        top_k: &top_k,
                        temperature: &temperature,
                        infer_seed: &infer_seed,
                    },
                    lens: SlotLens {
                        seq_lens_this_time: &this_time,
                        seq_lens_encoder: &encoder,
                    },
                    layout: OutputLayout {
                        cu_seqlens_q_output: &cu_out,
                        batch_id_per_token_output: &batch_id,
                    },
                },
                &mut RowSamplingParams {
                    top_p: a,
                    top_k: b,
                    temperature: c,
                    seed: d,
                },
                &SamplingParamsParams {
                    dims: (*dims).into(),
                    host: None,
                    host_top_p: None,
                    host_temperature: None,
                },
            )?;
        }
        CaseParams::Argmax { rows, vocab } => {
            let input = r.input("input")?;
            let o = r.output("out", i32s, &[*rows])?;
            let [o] = pick(&mut r.guarded, [o]);
            device.argmax(
                &input,
                o,
                &RowShape {
                    rows: *rows,
                    vocab: *vocab,
                },
            )?;
        }
        CaseParams::Softmax { rows, vocab } => {
            let (logits, temperature) = (r.input("logits")?, r.input("temperature")?);
            let o = r.output("probs", DType::F32, &[*rows, *vocab])?;
            let [o] = pick(&mut r.guarded, [o]);
            let params = SoftmaxParams {
                shape: RowShape {
                    rows: *rows,
                    vocab: *vocab,
                },
                host_temperature: None,
            };
            device.softmax(&logits, &temperature, o, &params)?;
        }
        CaseParams::TopKTopPSample { rows, vocab } => {
            let (probs, top_k) = (r.input("probs")?, r.input("top_k")?);
            let (top_p, seed) = (r.input("top_p")?, r.input("seed")?);
            let o = r.output("tokens", i32s, &[*rows])?;
            let [o] = pick(&mut r.guarded, [o]);
            device.top_k_top_p_sample(
                &SampleInputs {
                    probs: &probs,
                    top_k: &top_k,
                    top_p: &top_p,
                    seed: &seed,
                },
                o,
                &SampleParams {
                    shape: RowShape {
                        rows: *rows,
                        vocab: *vocab,
                    },
                    host_top_p: None,
                },
            )?;
        }
        CaseParams::TopPCandidates {
            rows,
            vocab,
            candidates,
        } => {
            let (probs, top_p) = (r.input("probs")?, r.input("top_p")?);
            let batch_id = r.optional("batch_id_per_token_output")?;
            let a = r.output("ids", i32s, &[*rows, *candidates])?;
            let b = r.output("scores", DType::F32, &[*rows, *candidates])?;
            let c = r.output("lens", i32s, &[*rows])?;
            let [a, b, c] = pick(&mut r.guarded, [a, b, c]);
            device.top_p_candidates(
                &CandidatesInputs {
                    probs: &probs,
                    top_p: &top_p,
                    batch_id_per_token_output: batch_id.as_ref(),
                },
                &mut CandidatesOutputs {
                    ids: a,
                    scores: b,
                    lens: c,
                },
                &CandidatesParams {
                    shape: RowShape {
                        rows: *rows,
                        vocab: *vocab,
                    },
                    candidates: *candidates,
                    host_top_p: None,
                },
            )?;
        }
        CaseParams::VerifyDraftTokens {
            dims,
            rows,
            vocab,
            strategy,
            candidates,
            accept_all,
            reject_all,
        } => {
            let strategy: Strategy = strategy.parse()?;
            let draft_tokens = r.input("draft_tokens")?;
            let (this_time, encoder) =
                (r.input("seq_lens_this_time")?, r.input("seq_lens_encoder")?);
            let cu_out = r.input("cu_seqlens_q_output")?;
            let (stop, blocked) = (r.input("stop_flags")?, r.input("is_block_step")?);
            let (reasoning, step_idx) = (r.input("reasoning_status")?, r.input("step_idx")?);
            let (max_dec_len, end_tokens) = (r.input("max_dec_len")?, r.input("end_tokens")?);
            let seeds = r.input("seeds")?;
            let names: &[&str] = match strategy {
                Strategy::Greedy | Strategy::TargetMatch => &["target_tokens"],
                Strategy::TopP => &["candidate_ids", "candidate_scores", "candidate_lens"],
                Strategy::Rejection => &["target_probs", "draft_probs", "top_k", "top_p"],
            };
            let extra = names
                .iter()
                .map(|n| r.input(n))
                .collect::<Result<Vec<_>>>()?;
            let strategy_inputs = match strategy {
                Strategy::Greedy => StrategyInputs::Greedy {
                    target_tokens: &extra[0],
                },
                Strategy::TargetMatch => StrategyInputs::TargetMatch {
                    target_tokens: &extra[0],
                },
                Strategy::TopP => StrategyInputs::TopP {
                    candidate_ids: &extra[0],
                    candidate_scores: &extra[1],
                    candidate_lens: &extra[2],
                    candidates: *candidates,
                },
                Strategy::Rejection => StrategyInputs::Rejection {
                    target_probs: &extra[0],
                    draft_probs: &extra[1],
                    top_k: &extra[2],
                    top_p: &extra[3],
                },
            };
            let a = r.output("accept_tokens", i32s, &[dims.max_bsz, dims.max_step_tokens])?;
            let b = r.output("accept_num", i32s, &[dims.max_bsz])?;
            let [a, b] = pick(&mut r.guarded, [a, b]);
            device.verify_draft_tokens(
                &VerifyInputs {
                    draft_tokens: &draft_tokens,
                    lens: SlotLens {
                        seq_lens_this_time: &this_time,
                        seq_lens_encoder: &encoder,
                    },
                    cu_seqlens_q_output: &cu_out,
                    state: VerifySlotState {
                        stop_flags: &stop,
                        is_block_step: &blocked,
                        reasoning_status: &reasoning,
                        step_idx: &step_idx,
                        max_dec_len: &max_dec_len,
                        end_tokens: &end_tokens,
                    },
                    seeds: &seeds,
                    strategy: strategy_inputs,
                },
                &mut VerifyOutputs {
                    accept_tokens: a,
                    accept_num: b,
                },
                &VerifyParams {
                    dims: (*dims).into(),
                    rows: *rows,
                    vocab: *vocab,
                    accept_all: *accept_all,
                    reject_all: *reject_all,
                    host: None,
                },
            )?;
        }
        CaseParams::UpdateState {
            dims,
            max_model_len,
        } => {
            let accept_tokens = r.input("accept_tokens")?;
            let (blocked, prompt_lens) = (r.input("is_block_step")?, r.input("prompt_lens")?);
            let (max_dec_len, end_tokens) = (r.input("max_dec_len")?, r.input("end_tokens")?);
            let names = [
                "accept_num",
                "stop_flags",
                "token_ids_all",
                "step_idx",
                "infer_seed",
                "draft_tokens",
                "seq_lens_encoder",
                "seq_lens_decoder",
            ];
            let mut idx = [0; 8];
            for (slot, name) in idx.iter_mut().zip(names) {
                *slot = r.inout(name)?;
            }
            let [a, b, c, d, e, f, g, h] = pick(&mut r.guarded, idx);
            device.update_state(
                &UpdateStateInputs {
                    accept_tokens: &accept_tokens,
                    is_block_step: &blocked,
                    prompt_lens: &prompt_lens,
                    max_dec_len: &max_dec_len,
                    end_tokens: &end_tokens,
                },
                &mut DecodeState {
                    accept_num: a,
                    stop_flags: b,
                    token_ids_all: c,
                    step_idx: d,
                    infer_seed: e,
                    draft_tokens: f,
                    seq_lens_encoder: g,
                    seq_lens_decoder: h,
                },
                &UpdateStateParams {
                    dims: (*dims).into(),
                    max_model_len: *max_model_len,
                },
            )?;
        }
        CaseParams::NgramMatch {
            dims,
            max_model_len,
            max_ngram_size,
            min_ngram_size,
            threshold,
        } => {
            let token_ids_all = r.input("token_ids_all")?;
            let (prompt_lens, step_idx) = (r.input("prompt_lens")?, r.input("step_idx")?);
            let (draft_token_num, encoder) =
                (r.input("draft_token_num")?, r.input("seq_lens_encoder")?);
            let max_dec_len = r.input("max_dec_len")?;
            let a = r.inout("draft_tokens")?;
            let b = r.inout("seq_lens_this_time")?;
            let [a, b] = pick(&mut r.guarded, [a, b]);
            device.ngram_match(
                &NgramInputs {
                    token_ids_all: &token_ids_all,
                    prompt_lens: &prompt_lens,
                    step_idx: &step_idx,
                    draft_token_num: &draft_token_num,
                    seq_lens_encoder: &encoder,
                    max_dec_len: &max_dec_len,
                },
                &mut NgramOutputs {
                    draft_tokens: a,
                    seq_lens_this_time: b,
                },
                &NgramParams {
                    dims: (*dims).into(),
                    max_model_len: *max_model_len,
                    max_ngram_size: *max_ngram_size,
                    min_ngram_size: *min_ngram_size,
                    threshold: *threshold,
                },
            )?;
        }
        CaseParams::AcceptLogprobs {
            dims,
            rows,
            vocab,
            top_k,
        } => {
            let (logits, temperature) = (r.input("logits")?, r.input("temperature")?);
            let (accept_tokens, accept_num) = (r.input("accept_tokens")?, r.input("accept_num")?);
            let (encoder, cu_out) = (
                r.input("seq_lens_encoder")?,
                r.input("cu_seqlens_q_output")?,
            );
            let packed = dims.max_bsz * dims.max_step_tokens;
            let a = r.output("cu_accept", i32s, &[dims.max_bsz + 1])?;
            let b = r.output("token_ids", i32s, &[packed])?;
            let c = r.output("logprobs", DType::F32, &[packed])?;
            let d = r.output("ranks", i32s, &[packed])?;
            let e = r.output("top_ids", i32s, &[packed, *top_k])?;
            let f = r.output("top_logprobs", DType::F32, &[packed, *top_k])?;
            let [a, b, c, d, e, f] = pick(&mut r.guarded, [a, b, c, d, e, f]);
            device.accept_logprobs(
                &LogprobsInputs {
                    logits: &logits,
                    temperature: &temperature,
                    accept_tokens: &accept_tokens,
                    accept_num: &accept_num,
                    seq_lens_encoder: &encoder,
                    cu_seqlens_q_output: &cu_out,
                },
                &mut LogprobsOutputs {
                    cu_accept: a,
                    token_ids: b,
                    logprobs: c,
                    ranks: d,
                    top_ids: e,
                    top_logprobs: f,
                },
                &LogprobsParams {
                    dims: (*dims).into(),
                    shape: RowShape {
                        rows: *rows,
                        vocab: *vocab,
                    },
                    top_k: *top_k,
                    host_temperature: None,
                },
            )?;
        }
    }
    r.finish()
}
