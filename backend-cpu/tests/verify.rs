//! Hand-computed cases of `verify_draft_tokens` (contract §4.5), one per rule.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, Device, DeviceExt};
use specula_backend_cpu::CpuDevice;

const V: usize = 100;
const EOS: i32 = 99;
const EOS2: i32 = 98;

#[derive(Clone)]
struct Slot {
    this_time: i32,
    encoder: i32,
    /// draft_tokens row: position 0 the last accepted token, then the drafts (padded to S).
    drafts: Vec<i32>,
    stop: bool,
    blocked: bool,
    reasoning: i32,
    step_idx: i32,
    max_dec_len: i32,
}

fn decode(drafts: &[i32]) -> Slot {
    Slot {
        this_time: drafts.len() as i32,
        encoder: 0,
        drafts: drafts.to_vec(),
        stop: false,
        blocked: false,
        reasoning: 0,
        step_idx: 10,
        max_dec_len: 1000,
    }
}

fn prefill(prompt_len: i32) -> Slot {
    Slot {
        this_time: prompt_len,
        encoder: prompt_len,
        drafts: vec![7],
        ..decode(&[7])
    }
}

/// TOPP candidate ids, scores, lens and C.
type Candidates = (Vec<i32>, Vec<f32>, Vec<i32>, usize);

struct Case {
    s: usize,
    max_bsz: usize,
    real_bsz: usize,
    slots: Vec<Slot>,
    /// One target token per output row (GREEDY).
    targets: Vec<i32>,
    accept_all: bool,
    reject_all: bool,
    /// TOPP instead of GREEDY: candidate ids, scores, lens and C.
    topp: Option<Candidates>,
}

impl Case {
    fn new(s: usize, slots: Vec<Slot>, targets: Vec<i32>) -> Self {
        Case {
            s,
            max_bsz: slots.len(),
            real_bsz: slots.len(),
            slots,
            targets,
            accept_all: false,
            reject_all: false,
            topp: None,
        }
    }

    /// Runs GREEDY verification and returns (emitted tokens per slot, accept_num per slot).
    fn run(&self) -> (Vec<Vec<i32>>, Vec<i32>) {
        let dev = CpuDevice::with_threads(2).unwrap();
        let (s, n) = (self.s, self.max_bsz);
        let mut drafts = vec![-1; n * s];
        let mut cu_out = vec![0i32];
        for (b, slot) in self.slots.iter().enumerate() {
            drafts[b * s..b * s + slot.drafts.len()].copy_from_slice(&slot.drafts);
            if b < self.real_bsz {
                let rows =
                    specula_backend_api::slots::slot_output_rows(slot.this_time, slot.encoder, s);
                cu_out.push(cu_out.last().unwrap() + rows as i32);
            }
        }
        let rows = *cu_out.last().unwrap() as usize;
        assert_eq!(self.targets.len(), rows, "one target per output row");
        let field = |f: &dyn Fn(&Slot) -> i32| -> Vec<i32> { self.slots.iter().map(f).collect() };
        let flag = |f: &dyn Fn(&Slot) -> bool| -> Vec<u8> {
            self.slots.iter().map(|x| f(x) as u8).collect()
        };
        let up = |v: &[i32]| -> Buffer { dev.upload(v).unwrap() };
        let draft_tokens = up(&drafts);
        let this_time = up(&field(&|x| x.this_time));
        let encoder = up(&field(&|x| x.encoder));
        let cu = up(&cu_out);
        let stop = dev.upload(&flag(&|x| x.stop)).unwrap();
        let blocked = dev.upload(&flag(&|x| x.blocked)).unwrap();
        let reasoning = up(&field(&|x| x.reasoning));
        let step_idx = up(&field(&|x| x.step_idx));
        let max_dec_len = up(&field(&|x| x.max_dec_len));
        let end_tokens = up(&[EOS, EOS2]);
        let seeds = dev.upload(&vec![1u64; rows]).unwrap();
        let targets = up(&self.targets);
        let topp = self
            .topp
            .as_ref()
            .map(|(ids, scores, lens, c)| (up(ids), dev.upload(scores).unwrap(), up(lens), *c));
        let strategy = match &topp {
            None => StrategyInputs::Greedy {
                target_tokens: &targets,
            },
            Some((ids, scores, lens, c)) => StrategyInputs::TopP {
                candidate_ids: ids,
                candidate_scores: scores,
                candidate_lens: lens,
                candidates: *c,
            },
        };
        let mut accept_tokens = dev.alloc::<i32>(n * s).unwrap();
        let mut accept_num = dev.alloc::<i32>(n).unwrap();
        dev.verify_draft_tokens(
            &VerifyInputs {
                draft_tokens: &draft_tokens,
                lens: SlotLens {
                    seq_lens_this_time: &this_time,
                    seq_lens_encoder: &encoder,
                },
                cu_seqlens_q_output: &cu,
                state: VerifySlotState {
                    stop_flags: &stop,
                    is_block_step: &blocked,
                    reasoning_status: &reasoning,
                    step_idx: &step_idx,
                    max_dec_len: &max_dec_len,
                    end_tokens: &end_tokens,
                },
                seeds: &seeds,
                strategy,
            },
            &mut VerifyOutputs {
                accept_tokens: &mut accept_tokens,
                accept_num: &mut accept_num,
            },
            &VerifyParams {
                dims: BatchDims {
                    max_bsz: n,
                    real_bsz: self.real_bsz,
                    max_step_tokens: s,
                },
                rows,
                vocab: V,
                accept_all: self.accept_all,
                reject_all: self.reject_all,
                host: None,
            },
        )
        .unwrap();
        let tokens = dev.download::<i32>(&accept_tokens).unwrap();
        let num = dev.download::<i32>(&accept_num).unwrap();
        // Entries beyond the count are -1.
        for b in 0..n {
            for k in num[b] as usize..s {
                assert_eq!(tokens[b * s + k], -1, "slot {b} position {k}");
            }
        }
        let emitted = (0..n)
            .map(|b| tokens[b * s..b * s + num[b] as usize].to_vec())
            .collect();
        (emitted, num)
    }
}

#[test]
fn all_drafts_accepted_then_bonus() {
    let case = Case::new(4, vec![decode(&[5, 11, 12, 13])], vec![11, 12, 13, 14]);
    assert_eq!(case.run().0, vec![vec![11, 12, 13, 14]]);
}

#[test]
fn first_draft_rejected_emits_the_correction() {
    let case = Case::new(4, vec![decode(&[5, 11, 12, 13])], vec![20, 12, 13, 14]);
    assert_eq!(case.run().0, vec![vec![20]]);
}

#[test]
fn rejection_mid_way_keeps_the_accepted_prefix() {
    let case = Case::new(4, vec![decode(&[5, 11, 12, 13])], vec![11, 21, 13, 14]);
    assert_eq!(case.run().0, vec![vec![11, 21]]);
}

#[test]
fn end_token_accepted_mid_way_stops_without_bonus() {
    let case = Case::new(4, vec![decode(&[5, 11, EOS2, 13])], vec![11, EOS2, 13, 14]);
    assert_eq!(case.run().0, vec![vec![11, EOS2]]);
}

#[test]
fn max_dec_len_replaces_the_token_with_end_tokens_0() {
    // step_idx 10, max_dec_len 12: the second emitted token reaches it.
    let mut slot = decode(&[5, 11, 12, 13]);
    slot.max_dec_len = 12;
    let case = Case::new(4, vec![slot], vec![11, 12, 13, 14]);
    assert_eq!(case.run().0, vec![vec![11, EOS]]);
    // Reached by the phase-2 token.
    let mut slot = decode(&[5, 11]);
    slot.max_dec_len = 12;
    let case = Case::new(4, vec![slot], vec![11, 30]);
    assert_eq!(case.run().0, vec![vec![11, EOS]]);
}

#[test]
fn prefill_emits_one_token_from_its_row() {
    let case = Case::new(4, vec![decode(&[5, 11]), prefill(6)], vec![11, 40, 50]);
    assert_eq!(case.run().0, vec![vec![11, 40], vec![50]]);
}

#[test]
fn empty_stopped_and_blocked_slots_emit_nothing() {
    let mut empty = decode(&[5]);
    empty.this_time = 0;
    let mut stopped = decode(&[5, 11]);
    stopped.stop = true;
    let mut blocked = decode(&[5, 11]);
    blocked.blocked = true;
    let case = Case::new(
        4,
        vec![empty, stopped, blocked, decode(&[5, 11])],
        // stopped and blocked slots still own their output rows in the layout.
        vec![1, 2, 3, 4, 11, 60],
    );
    let (tokens, num) = case.run();
    assert_eq!(num, vec![0, 0, 0, 2]);
    assert_eq!(tokens[3], vec![11, 60]);
}

#[test]
fn reasoning_slot_skips_phase_1() {
    let mut slot = decode(&[5, 11, 12]);
    slot.reasoning = 1;
    let case = Case::new(4, vec![slot], vec![11, 12, 13]);
    assert_eq!(case.run().0, vec![vec![11]]);
}

#[test]
fn accept_all_accepts_every_in_vocabulary_draft() {
    let mut case = Case::new(4, vec![decode(&[5, 11, 12, 13])], vec![0, 0, 0, 77]);
    case.accept_all = true;
    assert_eq!(case.run().0, vec![vec![11, 12, 13, 77]]);
    // An accepted end token stops the slot (it is not replaced).
    let mut case = Case::new(4, vec![decode(&[5, 11, EOS, 13])], vec![0, 0, 0, 77]);
    case.accept_all = true;
    assert_eq!(case.run().0, vec![vec![11, EOS]]);
    // An out-of-vocabulary draft is never accepted.
    let mut case = Case::new(4, vec![decode(&[5, 11, 1000, 13])], vec![0, 55, 0, 77]);
    case.accept_all = true;
    assert_eq!(case.run().0, vec![vec![11, 55]]);
}

#[test]
fn reject_all_wins_over_accept_all() {
    let mut case = Case::new(4, vec![decode(&[5, 11, 12, 13])], vec![11, 12, 13, 14]);
    case.accept_all = true;
    case.reject_all = true;
    assert_eq!(case.run().0, vec![vec![11]]);
}

#[test]
fn slots_beyond_real_bsz_emit_nothing() {
    let mut case = Case::new(4, vec![decode(&[5, 11]), decode(&[5, 11])], vec![11, 12]);
    case.real_bsz = 1;
    let (tokens, num) = case.run();
    assert_eq!(num, vec![2, 0]);
    assert_eq!(tokens[0], vec![11, 12]);
}

#[test]
fn hostile_contents_fall_back_without_panicking() {
    // this_time above S is clamped to S; drafts outside the vocabulary never match.
    let mut slot = decode(&[5, -3, 12, 13]);
    slot.this_time = 1000;
    let case = Case::new(4, vec![slot], vec![-3, 12, 13, 14]);
    // Draft -3 is rejected; the phase-2 target -3 is outside the vocabulary: end_tokens[0], stop.
    assert_eq!(case.run().0, vec![vec![EOS]]);
    // Negative this_time is an empty slot; negative step_idx counts from 0.
    let mut slot = decode(&[5, 11]);
    slot.this_time = -7;
    slot.step_idx = -100;
    let case = Case::new(4, vec![slot, decode(&[5])], vec![42]);
    assert_eq!(case.run().1, vec![0, 1]);
}

#[test]
fn topp_accepts_members_of_the_top_p_prefix_and_draws_the_correction() {
    // Row 0 candidates [11, 12, 13] with lens 2: draft 12 accepted, draft 13 (beyond lens) rejected.
    // Row 1: the correction is drawn among its first lens = 1 candidate: 30.
    let c = 3;
    let ids = vec![11, 12, 13, 30, 31, 32, 0, 0, 0];
    let scores = vec![0.5, 0.3, 0.2, 0.6, 0.3, 0.1, 0.0, 0.0, 0.0];
    let mut case = Case::new(4, vec![decode(&[5, 12, 13])], vec![0, 0, 0]);
    case.topp = Some((ids, scores, vec![2, 1, 0], c));
    assert_eq!(case.run().0, vec![vec![12, 30]]);
}

#[test]
fn topp_with_no_weight_takes_candidate_0_and_an_invalid_id_stops() {
    let c = 2;
    // lens 0: candidate 0 is emitted.
    let mut case = Case::new(4, vec![decode(&[5])], vec![0]);
    case.topp = Some((vec![44, 45], vec![0.7, 0.3], vec![0], c));
    assert_eq!(case.run().0, vec![vec![44]]);
    // Candidate 0 outside the vocabulary (candidates a caller made): end_tokens[0], slot stops.
    let mut case = Case::new(4, vec![decode(&[5])], vec![0]);
    case.topp = Some((vec![-1, 45], vec![0.0, 0.0], vec![2], c));
    assert_eq!(case.run().0, vec![vec![EOS]]);
    // Hostile lens far above C is clamped to C.
    let mut case = Case::new(4, vec![decode(&[5, 45])], vec![0, 0]);
    case.topp = Some((
        vec![44, 45, 46, 47],
        vec![1.0, 0.0, 1.0, 0.0],
        vec![1000, 1000],
        c,
    ));
    assert_eq!(case.run().0, vec![vec![45, 46]]);
}

#[test]
fn topp_correction_follows_the_candidate_draw() {
    use specula_backend_api::fixed_point::{scale_draw, weight};
    use specula_backend_api::rng::{Purpose, draw};
    // Seeds are 1 for every row (see Case::run): the CANDIDATE draw of seed 1 picks by weight.
    let scores = [0.5f32, 0.25, 0.25];
    let total: u64 = scores.iter().map(|&s| weight(s)).sum();
    let t = scale_draw(draw(1, Purpose::Candidate), total);
    let mut cumulative = 0;
    let expected = [70, 71, 72][scores
        .iter()
        .position(|&s| {
            cumulative += weight(s);
            cumulative > t
        })
        .unwrap()];
    let mut case = Case::new(4, vec![decode(&[5])], vec![0]);
    case.topp = Some((vec![70, 71, 72], scores.to_vec(), vec![3], 3));
    assert_eq!(case.run().0, vec![vec![expected]]);
}
