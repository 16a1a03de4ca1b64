//! Scheduling, proposal and the plan: the first half of a step, up to the runner's forward pass.
//!
//! - `propose`: the scheduler gives a newly inserted request its whole prompt (a prefill) and every
//!   other running slot one token (the last accepted one), then the n-gram proposer (when
//!   configured, `S > 1` and some slot decodes) adds drafts on the device and the host mirrors are
//!   refreshed from it.
//! - `set_drafts`: a runner's own drafts for one decode slot, checked and written to the device
//!   and the mirrors.
//! - `host_plan`: the [`StepPlan`] from the host mirrors: the packed input tokens, their positions
//!   and what each output row predicts.
//! - `build_step`: the device side of the plan, `build_output_layout` then
//!   `build_sampling_params` into the step's scratch buffers.
//! - `gather` and `input_prefix`: what the runner reads of a planned step.

use specula_backend_api::ops::{
    GatherInputs, GatherParams, LayoutOutputs, LayoutParams, NgramInputs, NgramOutputs,
    NgramParams, OutputLayout, RowSamplingParams, SamplingParamsInputs, SamplingParamsParams,
    SlotSamplingParams,
};
use specula_backend_api::slots::{SlotKind, slot_kind};
use specula_backend_api::transfer::elements;
use specula_backend_api::{Buffer, Device, DeviceExt};

use super::StepContext;
use super::slots::SlotTable;
use crate::buffers::{Scratch, SlotBuffers, window, write_at};
use crate::config::{NgramConfig, SamplerConfig};
use crate::error::{Result, SamplerError};
use crate::step::{OutputRow, SlotPlan, SlotStepKind, StepPlan};

// ----- propose -----

/// Runs the scheduler and, when it applies, the n-gram proposer. Returns the step's `real_bsz`.
pub(super) fn propose(
    device: &dyn Device,
    config: &SamplerConfig,
    slots: &mut SlotTable,
    state: &mut SlotBuffers,
) -> Result<usize> {
    let (real_bsz, decode_slots) = schedule(slots);
    device.write(&mut state.seq_lens_this_time, slots.this_time())?;
    if let Some(ngram) = config.ngram
        && config.max_step_tokens > 1
        && decode_slots > 0
    {
        propose_ngram(device, config, ngram, real_bsz, slots, state)?;
    }
    Ok(real_bsz)
}

/// Sets every slot's lengths for the step in the host mirrors: a prefill feeds the whole prompt,
/// a decode slot one token (its last, put first in its draft row); slots at or past `real_bsz`,
/// stopped and empty slots feed nothing. Returns `real_bsz` and the number of decode slots.
fn schedule(slots: &mut SlotTable) -> (usize, usize) {
    let real_bsz = slots.real_bsz();
    let mut decode_slots = 0;
    for b in 0..slots.len() {
        let (this_time, encoder, last_token) = match slots.get(b) {
            Some(h) if b < real_bsz && h.is_running() => {
                if h.encoder > 0 {
                    (h.encoder, h.encoder, None)
                } else {
                    (1, 0, Some(h.last_token()))
                }
            }
            Some(h) => (0, h.encoder, None),
            None => (0, 0, None),
        };
        if let Some(token) = last_token {
            decode_slots += 1;
            slots.set_last_token(b, token);
        }
        slots.set_lens(b, this_time, encoder);
    }
    (real_bsz, decode_slots)
}

/// `ngram_match` over the scheduled slots, then the host mirrors of `seq_lens_this_time` and the
/// draft rows from the device, in one transfer.
fn propose_ngram(
    device: &dyn Device,
    config: &SamplerConfig,
    ngram: NgramConfig,
    real_bsz: usize,
    slots: &mut SlotTable,
    st: &mut SlotBuffers,
) -> Result<()> {
    device.ngram_match(
        &NgramInputs {
            token_ids_all: &st.token_ids_all,
            prompt_lens: &st.prompt_lens,
            step_idx: &st.step_idx,
            draft_token_num: &st.draft_token_num,
            seq_lens_encoder: &st.seq_lens_encoder,
            max_dec_len: &st.max_dec_len,
        },
        &mut NgramOutputs {
            draft_tokens: &mut st.draft_tokens,
            seq_lens_this_time: &mut st.seq_lens_this_time,
        },
        &NgramParams {
            dims: config.dims(real_bsz),
            max_model_len: config.max_model_len,
            max_ngram_size: ngram.max_ngram_size,
            min_ngram_size: ngram.min_ngram_size,
            threshold: ngram.threshold,
        },
    )?;
    // One transfer (one wait) for both mirrors.
    let pending = device.start_download(&[&st.seq_lens_this_time, &st.draft_tokens])?;
    let mut bytes = pending.wait()?.into_iter();
    slots.replace_this_time(elements(&bytes.next().unwrap_or_default()));
    slots.replace_drafts(elements(&bytes.next().unwrap_or_default()));
    Ok(())
}

// ----- set_drafts -----

/// Sets the drafts of a running decode slot (checked by [`check_drafts`]) on the device and in
/// the mirrors.
pub(super) fn set_drafts(
    device: &dyn Device,
    config: &SamplerConfig,
    slots: &mut SlotTable,
    state: &mut SlotBuffers,
    slot: usize,
    drafts: &[i32],
) -> Result<()> {
    check_drafts(config, slots, slot, drafts)?;
    let s = config.max_step_tokens;
    let this_time = 1 + drafts.len() as i32;
    write_at(device, &mut state.draft_tokens, slot * s + 1, drafts)?;
    write_at(device, &mut state.seq_lens_this_time, slot, &[this_time])?;
    slots.set_drafts(slot, drafts, this_time);
    Ok(())
}

/// The slot decodes this step, and the drafts are at most `S − 1` tokens of the vocabulary.
fn check_drafts(
    config: &SamplerConfig,
    slots: &SlotTable,
    slot: usize,
    drafts: &[i32],
) -> Result<()> {
    let s = config.max_step_tokens;
    let bad = |reason: String| Err(SamplerError::Drafts { slot, reason });
    let (this_time, encoder) = slots.lens(slot);
    if this_time <= 0 || encoder > 0 {
        return bad("not a running decode slot this step".into());
    }
    if drafts.len() > s - 1 {
        return bad(format!("{} drafts > S - 1 = {}", drafts.len(), s - 1));
    }
    if let Some(t) = drafts.iter().find(|&&t| !config.in_vocab(t)) {
        return bad(format!("token {t} not in 0 .. {}", config.vocab));
    }
    Ok(())
}

// ----- the plan -----

/// What one slot feeds this step.
struct Feed<'a> {
    kind: SlotStepKind,
    tokens: &'a [i32],
    /// Sequence position of its first token.
    start_position: usize,
    /// Output rows: 1 for a prefill, one per fed token for a decode step.
    rows: usize,
}

/// The plan of step `step` over slots `0 .. real_bsz`, from the host mirrors of the slot lengths
/// (after the proposer).
pub(super) fn host_plan(
    slots: &SlotTable,
    step: u64,
    real_bsz: usize,
    max_step_tokens: usize,
) -> StepPlan {
    let mut plan = StepPlan {
        step,
        real_bsz,
        gather_rows: real_bsz * max_step_tokens,
        ..StepPlan::default()
    };
    for b in 0..real_bsz {
        if let Some(feed) = slot_feed(slots, b, max_step_tokens) {
            push_slot(&mut plan, b, &feed);
        }
    }
    plan
}

/// What slot `b` feeds, by its kind this step (`None` for a slot that feeds nothing).
fn slot_feed(slots: &SlotTable, b: usize, max_step_tokens: usize) -> Option<Feed<'_>> {
    let (this_time, encoder) = slots.lens(b);
    let host = slots.get(b)?;
    match slot_kind(this_time, encoder) {
        SlotKind::Empty => None,
        SlotKind::Prefill => Some(Feed {
            kind: SlotStepKind::Prefill,
            tokens: &host.tokens[..host.encoder],
            start_position: host.decoder,
            rows: 1,
        }),
        SlotKind::Decode => {
            let n = (this_time as usize).min(max_step_tokens);
            Some(Feed {
                kind: SlotStepKind::Decode,
                tokens: slots.step_tokens(b, n),
                start_position: host.decoder,
                rows: n,
            })
        }
    }
}

/// Appends slot `b`'s inputs, output rows and [`SlotPlan`] to `plan`. A prefill's one row
/// predicts from its last input; a decode step's row `i` from its input `i`.
fn push_slot(plan: &mut StepPlan, b: usize, feed: &Feed<'_>) {
    let first_input = plan.input_tokens.len();
    let first_row = plan.output_rows.len();
    plan.input_tokens.extend_from_slice(feed.tokens);
    plan.input_positions
        .extend((0..feed.tokens.len()).map(|i| feed.start_position + i));
    let last_input = plan.input_tokens.len() - 1;
    let is_prefill = feed.kind == SlotStepKind::Prefill;
    for i in 0..feed.rows {
        let input_index = if is_prefill {
            last_input
        } else {
            first_input + i
        };
        plan.output_rows.push(OutputRow {
            slot: b,
            input_index,
            position: plan.input_positions[input_index],
        });
    }
    plan.slots.push(SlotPlan {
        slot: b,
        kind: feed.kind,
        inputs: first_input..plan.input_tokens.len(),
        start_position: feed.start_position,
        drafts: if is_prefill { 0 } else { feed.rows - 1 },
        rows: first_row..plan.output_rows.len(),
    });
}

// ----- the plan on the device -----

/// Narrows the scratch buffers to the step, then builds the output layout and the per-row
/// sampling parameters.
pub(super) fn build_step(
    cx: &StepContext<'_>,
    slots: &SlotTable,
    state: &SlotBuffers,
    sc: &mut Scratch,
) -> Result<()> {
    let real_bsz = cx.plan.real_bsz;
    window(&mut sc.cu_seqlens_q, real_bsz + 1)?;
    window(&mut sc.cu_seqlens_q_output, real_bsz + 1)?;
    window(&mut sc.batch_id_per_token_output, cx.plan.gather_rows)?;
    sc.window_rows(cx.plan.gather_rows, cx.config.vocab, cx.config.candidates)?;
    build_layout(cx, slots, state, sc)?;
    build_row_params(cx, slots, state, sc)
}

/// `build_output_layout`: where each slot's inputs and output rows are.
fn build_layout(
    cx: &StepContext<'_>,
    slots: &SlotTable,
    st: &SlotBuffers,
    sc: &mut Scratch,
) -> Result<()> {
    cx.device.build_output_layout(
        &st.lens(),
        &mut LayoutOutputs {
            seq_lens_output: &mut sc.seq_lens_output,
            cu_seqlens_q: &mut sc.cu_seqlens_q,
            cu_seqlens_q_output: &mut sc.cu_seqlens_q_output,
            batch_id_per_token_output: &mut sc.batch_id_per_token_output,
        },
        &LayoutParams {
            dims: cx.dims(),
            host: Some(slots.host_lens()),
        },
    )?;
    Ok(())
}

/// `build_sampling_params`: each output row's `top_p`, `top_k`, temperature and seed.
fn build_row_params(
    cx: &StepContext<'_>,
    slots: &SlotTable,
    st: &SlotBuffers,
    sc: &mut Scratch,
) -> Result<()> {
    cx.device.build_sampling_params(
        &SamplingParamsInputs {
            slots: SlotSamplingParams {
                top_p: &st.top_p,
                top_k: &st.top_k,
                temperature: &st.temperature,
                infer_seed: &st.infer_seed,
            },
            lens: st.lens(),
            // Field by field: the row parameters below are written while the layout is read.
            layout: OutputLayout {
                cu_seqlens_q_output: &sc.cu_seqlens_q_output,
                batch_id_per_token_output: &sc.batch_id_per_token_output,
            },
        },
        &mut RowSamplingParams {
            top_p: &mut sc.row_top_p,
            top_k: &mut sc.row_top_k,
            temperature: &mut sc.row_temperature,
            seed: &mut sc.row_seed,
        },
        &SamplingParamsParams {
            dims: cx.dims(),
            host: Some(slots.host_lens()),
            host_top_p: Some(slots.top_p()),
            host_temperature: Some(slots.temperature()),
        },
    )?;
    Ok(())
}

// ----- reading a planned step -----

/// `gather_next_token` over the planned step's layout: `hidden_states` `[token_num, hidden]` to
/// `out` `[gather_rows, hidden]`.
pub(super) fn gather(
    cx: &StepContext<'_>,
    slots: &SlotTable,
    st: &SlotBuffers,
    sc: &Scratch,
    hidden_states: &Buffer,
    hidden: usize,
    out: &mut Buffer,
) -> Result<()> {
    cx.device.gather_next_token(
        &GatherInputs {
            hidden_states,
            cu_seqlens_q: &sc.cu_seqlens_q,
            lens: st.lens(),
            layout: sc.layout(),
        },
        out,
        &GatherParams {
            dims: cx.dims(),
            token_num: cx.plan.token_num(),
            hidden,
            is_speculative: true,
            host: Some(slots.host_lens()),
        },
    )?;
    Ok(())
}

/// The tokens up to and including packed input token `input_index` of `plan`.
pub(super) fn input_prefix(
    plan: &StepPlan,
    slots: &SlotTable,
    input_index: usize,
) -> Result<Vec<i32>> {
    let slot_plan = plan
        .slots
        .iter()
        .find(|p| p.inputs.contains(&input_index))
        .ok_or(SamplerError::IndexOutOfRange {
            argument: "input_index",
            index: input_index,
            len: plan.token_num(),
            bound: "token_num",
        })?;
    let context = slots
        .get(slot_plan.slot)
        .map(|h| h.tokens.as_slice())
        .ok_or(SamplerError::SlotEmpty {
            slot: slot_plan.slot,
        })?;
    let mut prefix = context[..slot_plan.start_position].to_vec();
    prefix.extend_from_slice(&plan.input_tokens[slot_plan.inputs.start..=input_index]);
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use specula_backend_api::Strategy;

    use super::*;
    use crate::config::Request;

    /// Slot 0 prefills `[1, 2, 3]`; slot 1 (prompt `[7, 8]`, then 4 emitted) decodes 4 with the
    /// drafts `[5, 6]`; slot 2 is empty; slot 3 has stopped.
    fn scheduled_table() -> (SlotTable, (usize, usize)) {
        let config = SamplerConfig::new(Strategy::Greedy, 4, 16, 32, vec![0]);
        let mut table = SlotTable::new(4, 3);
        table.insert(0, Request::new(vec![1, 2, 3]));
        table.insert(1, Request::new(vec![7, 8]));
        table.insert(3, Request::new(vec![9]));
        if let Some(host) = table.get_mut(1) {
            host.accept(&[4], false, false, &config);
        }
        if let Some(host) = table.get_mut(3) {
            host.accept(&[0], true, false, &config);
        }
        let scheduled = schedule(&mut table);
        table.set_drafts(1, &[5, 6], 3);
        (table, scheduled)
    }

    #[test]
    fn the_scheduler_prefills_new_requests_and_decodes_running_ones() {
        let (table, (real_bsz, decode_slots)) = scheduled_table();
        assert_eq!((real_bsz, decode_slots), (2, 1));
        assert_eq!(table.lens(0), (3, 3));
        assert_eq!(table.lens(2), (0, 0));
        assert_eq!(table.lens(3), (0, 0));
        assert_eq!(table.step_tokens(1, 3), &[4, 5, 6]);
    }

    #[test]
    fn the_host_plan_packs_inputs_and_rows_in_slot_order() {
        let (table, (real_bsz, _)) = scheduled_table();
        let plan = host_plan(&table, 7, real_bsz, 3);
        assert_eq!((plan.step, plan.real_bsz, plan.gather_rows), (7, 2, 6));
        assert_eq!(plan.input_tokens, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(plan.input_positions, vec![0, 1, 2, 2, 3, 4]);
        let rows: Vec<_> = plan
            .output_rows
            .iter()
            .map(|r| (r.slot, r.input_index, r.position))
            .collect();
        assert_eq!(rows, vec![(0, 2, 2), (1, 3, 2), (1, 4, 3), (1, 5, 4)]);
        let prefill = SlotPlan {
            slot: 0,
            kind: SlotStepKind::Prefill,
            inputs: 0..3,
            start_position: 0,
            drafts: 0,
            rows: 0..1,
        };
        let decode = SlotPlan {
            slot: 1,
            kind: SlotStepKind::Decode,
            inputs: 3..6,
            start_position: 2,
            drafts: 2,
            rows: 1..4,
        };
        assert_eq!(plan.slots, vec![prefill, decode]);
        assert_eq!(
            input_prefix(&plan, &table, 4).expect("in range"),
            vec![7, 8, 4, 5]
        );
        assert!(input_prefix(&plan, &table, 6).is_err());
    }
}
