//! `verify_draft_tokens`: one slot-walk dispatch; REJECTION first samples the target rows and tests
//! every (target row, draft row) pair, all recorded in the same submission.

use specula_backend_api::ops::*;
use specula_backend_api::{DType, Op, Result};

use super::rows::sample_dispatches;
use super::{Binder, groups_for, u};
use crate::WgpuDevice;
use crate::kernels::{Kernel, SLOT_WG, entry, float_code};

pub(crate) fn verify_draft_tokens(
    device: &WgpuDevice,
    dtypes: Option<(DType, DType)>,
    inputs: &VerifyInputs<'_>,
    out: &mut VerifyOutputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<()> {
    let op = Op::VerifyDraftTokens;
    let dims = &params.dims;
    let s = dims.max_step_tokens;
    let gpu = &device.gpu;
    let mut dispatches = Vec::new();
    let strategy_code = match inputs.strategy.strategy() {
        specula_backend_api::Strategy::Greedy => 0,
        specula_backend_api::Strategy::TargetMatch => 1,
        specula_backend_api::Strategy::TopP => 2,
        specula_backend_api::Strategy::Rejection => 3,
    };
    let accept_all = params.accept_all && !params.reject_all;

    // REJECTION: targets = the rows sampled as 4.3, pairs = the test of every draft.
    let mut rejection = None;
    if let (
        StrategyInputs::Rejection {
            target_probs,
            draft_probs,
            top_k,
            top_p,
        },
        Some((target_dtype, draft_dtype)),
    ) = (inputs.strategy, dtypes)
    {
        let rows = params.rows;
        let vocab = params.vocab;
        let draft_rows = dims.max_bsz * (s - 1);
        let targets = device.scratch("verify targets", (rows.max(1) * 4) as u64)?;
        let aux = device.scratch("verify kept sets", (rows.max(1) * 32) as u64)?;
        let pairs = device.scratch("verify pairs", (draft_rows.max(1) * 8) as u64)?;
        let shape = RowShape { rows, vocab };
        dispatches.extend(sample_dispatches(
            device,
            op,
            target_dtype,
            target_probs,
            top_k,
            top_p,
            inputs.seeds,
            gpu.bind_scratch(&targets),
            Some(gpu.bind_scratch(&aux)),
            &shape,
        )?);
        if !accept_all && !params.reject_all && draft_rows > 0 {
            for tc in gpu.row_chunks(target_probs, rows, vocab) {
                for dc in gpu.row_chunks(draft_probs, draft_rows, vocab) {
                    let mut b = Binder::new(device, op);
                    let target = gpu.bind_rows(op, target_probs, vocab, tc)?;
                    let draft = gpu.bind_rows(op, draft_probs, vocab, dc)?;
                    let (target_off, draft_off) = (target.index, draft.index);
                    b.bindings.push((21, target));
                    b.bindings.push((22, draft));
                    b.buffer(23, inputs.draft_tokens)?;
                    b.buffer(24, inputs.lens.seq_lens_this_time)?;
                    b.buffer(25, inputs.cu_seqlens_q_output)?;
                    b.buffer(26, inputs.seeds)?;
                    b.bindings.push((27, gpu.bind_scratch(&aux)));
                    b.bindings.push((28, gpu.bind_scratch(&pairs)));
                    let o = b.offsets.clone();
                    let p = vec![
                        u(dims.max_bsz),
                        u(dims.real_bsz),
                        u(s),
                        u(rows),
                        u(vocab),
                        u(tc.0),
                        u(tc.1),
                        target_off,
                        u(dc.0),
                        draft_off,
                        float_code(draft_dtype),
                        u(dc.1 - dc.0),
                        o[0],
                        o[1],
                        o[2],
                        o[3],
                    ];
                    dispatches.push(b.dispatch(
                        Kernel::VerifyDraftTokens,
                        entry(op, Some("pair"), target_dtype),
                        20,
                        p,
                        u(dc.1 - dc.0),
                    ));
                }
            }
        }
        rejection = Some((targets, pairs));
    }

    let mut b = Binder::new(device, op);
    b.buffer(1, inputs.draft_tokens)?;
    b.buffer(2, inputs.lens.seq_lens_this_time)?;
    b.buffer(3, inputs.lens.seq_lens_encoder)?;
    b.buffer(4, inputs.cu_seqlens_q_output)?;
    b.buffer(5, inputs.state.stop_flags)?;
    b.buffer(6, inputs.state.is_block_step)?;
    b.buffer(7, inputs.state.reasoning_status)?;
    b.buffer(8, inputs.state.step_idx)?;
    b.buffer(9, inputs.state.max_dec_len)?;
    b.buffer(10, inputs.state.end_tokens)?;
    b.buffer(11, inputs.seeds)?;
    let mut candidates = 1;
    match inputs.strategy {
        StrategyInputs::Greedy { target_tokens }
        | StrategyInputs::TargetMatch { target_tokens } => {
            b.buffer(12, target_tokens)?;
            for binding in [13, 14, 15] {
                b.dummy(binding);
                b.offsets.push(0);
            }
            b.dummy(16);
        }
        StrategyInputs::TopP {
            candidate_ids,
            candidate_scores,
            candidate_lens,
            candidates: c,
        } => {
            candidates = c;
            b.dummy(12);
            b.offsets.push(0);
            b.buffer(13, candidate_ids)?;
            b.buffer(14, candidate_scores)?;
            b.buffer(15, candidate_lens)?;
            b.dummy(16);
        }
        StrategyInputs::Rejection { .. } => {
            let Some((targets, pairs)) = &rejection else {
                return Err(crate::error::unsupported(
                    op,
                    "REJECTION without float inputs",
                ));
            };
            b.bound(12, gpu.bind_scratch(targets));
            for binding in [13, 14, 15] {
                b.dummy(binding);
                b.offsets.push(0);
            }
            b.bindings.push((16, gpu.bind_scratch(pairs)));
        }
    }
    b.buffer(17, out.accept_tokens)?;
    b.buffer(18, out.accept_num)?;
    let mut p = vec![
        u(dims.max_bsz),
        u(dims.real_bsz),
        u(s),
        u(params.rows),
        u(params.vocab),
        u32::from(accept_all),
        u32::from(params.reject_all),
        strategy_code,
        u(candidates),
        u(inputs.state.end_tokens.len()),
    ];
    p.extend(&b.offsets);
    dispatches.push(b.dispatch(
        Kernel::VerifyDraftTokens,
        entry(op, None, DType::I32),
        0,
        p,
        groups_for(dims.max_bsz, SLOT_WG),
    ));
    gpu.run(op, dispatches)
}
