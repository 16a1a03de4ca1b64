//! Contract tests of the batch-level ops of the CPU backend: `build_output_layout`,
//! `build_sampling_params`, `gather_next_token`, `update_state` and `ngram_match`.
//!
//! Expected values are worked out by hand from the contract (§1, §2, §4.1, §4.6, §4.7) and the
//! decisions note; the hostile cases feed garbage device contents and check the documented
//! fallbacks (and that nothing panics).

// Helpers outside `#[test]` functions unwrap too: a failed setup is a failed test.
#![allow(clippy::unwrap_used)]

use half::bf16;
use specula_backend_api::abi::MAX_INFER_SEED;
use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, Device, DeviceExt};
use specula_backend_cpu::CpuDevice;

fn cpu() -> CpuDevice {
    CpuDevice::with_threads(2).unwrap()
}

fn dims(max_bsz: usize, real_bsz: usize, s: usize) -> BatchDims {
    BatchDims {
        max_bsz,
        real_bsz,
        max_step_tokens: s,
    }
}

/// Device buffers of the slot lengths and of the layout `build_output_layout` wrote.
struct Layout {
    this_time: Buffer,
    encoder: Buffer,
    seq_lens_output: Buffer,
    cu_q: Buffer,
    cu_out: Buffer,
    batch_id: Buffer,
}

impl Layout {
    fn lens(&self) -> SlotLens<'_> {
        SlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        }
    }

    fn output(&self) -> OutputLayout<'_> {
        OutputLayout {
            cu_seqlens_q_output: &self.cu_out,
            batch_id_per_token_output: &self.batch_id,
        }
    }
}

/// Runs `build_output_layout` (without host lengths, so garbage contents are allowed) with a
/// `batch_id` buffer of `cap` rows.
fn layout(cpu: &CpuDevice, this_time: &[i32], encoder: &[i32], d: BatchDims, cap: usize) -> Layout {
    let mut l = Layout {
        this_time: cpu.upload(this_time).unwrap(),
        encoder: cpu.upload(encoder).unwrap(),
        seq_lens_output: cpu.upload(&vec![99i32; d.max_bsz]).unwrap(),
        cu_q: cpu.upload(&vec![99i32; d.real_bsz + 1]).unwrap(),
        cu_out: cpu.upload(&vec![99i32; d.real_bsz + 1]).unwrap(),
        batch_id: cpu.upload(&vec![99i32; cap]).unwrap(),
    };
    let lens = SlotLens {
        seq_lens_this_time: &l.this_time,
        seq_lens_encoder: &l.encoder,
    };
    cpu.build_output_layout(
        &lens,
        &mut LayoutOutputs {
            seq_lens_output: &mut l.seq_lens_output,
            cu_seqlens_q: &mut l.cu_q,
            cu_seqlens_q_output: &mut l.cu_out,
            batch_id_per_token_output: &mut l.batch_id,
        },
        &LayoutParams {
            dims: d,
            host: None,
        },
    )
    .unwrap();
    l
}

fn get<T: specula_backend_api::Element>(cpu: &CpuDevice, b: &Buffer) -> Vec<T> {
    cpu.download::<T>(b).unwrap()
}

// ---------------------------------------------------------------------------------------------
// build_output_layout

#[test]
fn layout_mixed_slot_kinds_padding_and_slots_beyond_real_bsz() {
    let cpu = cpu();
    // slot 0 decode (2 rows), 1 prefill (4 tokens, 1 row), 2 empty, 3 decode (1 row), 4 is beyond
    // real_bsz and must produce nothing even though it has lengths.
    let d = dims(5, 4, 3);
    let this_time = [2, 4, 0, 1, 3];
    let encoder = [0, 4, 0, 0, 0];
    let l = layout(&cpu, &this_time, &encoder, d, 14);
    assert_eq!(get::<i32>(&cpu, &l.seq_lens_output), [2, 1, 0, 1, 0]);
    assert_eq!(get::<i32>(&cpu, &l.cu_q), [0, 2, 6, 6, 7]);
    assert_eq!(get::<i32>(&cpu, &l.cu_out), [0, 2, 3, 3, 4]);
    let mut expected = vec![0, 0, 1, 3];
    expected.resize(14, -1);
    assert_eq!(get::<i32>(&cpu, &l.batch_id), expected);

    // The same through the host-validated path gives the same answer.
    let (lens_b, enc_b) = (
        cpu.upload(&this_time).unwrap(),
        cpu.upload(&encoder).unwrap(),
    );
    let mut seq_lens_output = cpu.alloc::<i32>(5).unwrap();
    let mut cu_q = cpu.alloc::<i32>(5).unwrap();
    let mut cu_out = cpu.alloc::<i32>(5).unwrap();
    let mut batch_id = cpu.alloc::<i32>(12).unwrap();
    cpu.build_output_layout(
        &SlotLens {
            seq_lens_this_time: &lens_b,
            seq_lens_encoder: &enc_b,
        },
        &mut LayoutOutputs {
            seq_lens_output: &mut seq_lens_output,
            cu_seqlens_q: &mut cu_q,
            cu_seqlens_q_output: &mut cu_out,
            batch_id_per_token_output: &mut batch_id,
        },
        &LayoutParams {
            dims: d,
            host: Some(HostSlotLens {
                seq_lens_this_time: &this_time,
                seq_lens_encoder: &encoder,
            }),
        },
    )
    .unwrap();
    assert_eq!(get::<i32>(&cpu, &cu_out), [0, 2, 3, 3, 4]);
    assert_eq!(get::<i32>(&cpu, &batch_id), expected[..12]);
}

#[test]
fn layout_all_decode_non_speculative_is_one_row_per_slot() {
    let cpu = cpu();
    let l = layout(&cpu, &[1, 1, 1], &[0, 0, 0], dims(3, 3, 1), 3);
    assert_eq!(get::<i32>(&cpu, &l.cu_out), [0, 1, 2, 3]);
    assert_eq!(get::<i32>(&cpu, &l.batch_id), [0, 1, 2]);
}

#[test]
fn layout_hostile_lengths_are_clamped_not_wrapped() {
    let cpu = cpu();
    // Negative this_time: empty. Huge decode this_time: S rows. Negative encoder: decode.
    let d = dims(4, 4, 4);
    let l = layout(&cpu, &[-5, i32::MAX, i32::MAX, 100], &[0, 0, 7, -3], d, 16);
    assert_eq!(get::<i32>(&cpu, &l.seq_lens_output), [0, 4, 1, 4]);
    // Packed input sums saturate instead of wrapping negative.
    assert_eq!(
        get::<i32>(&cpu, &l.cu_q),
        [0, 0, i32::MAX, i32::MAX, i32::MAX]
    );
    assert_eq!(get::<i32>(&cpu, &l.cu_out), [0, 0, 4, 5, 9]);
    let mut expected = vec![1, 1, 1, 1, 2, 3, 3, 3, 3];
    expected.resize(16, -1);
    assert_eq!(get::<i32>(&cpu, &l.batch_id), expected);
}

// ---------------------------------------------------------------------------------------------
// build_sampling_params

struct RowParams {
    top_p: Vec<f32>,
    top_k: Vec<i32>,
    temperature: Vec<f32>,
    seed: Vec<u64>,
}

fn sampling_params(
    cpu: &CpuDevice,
    l: &Layout,
    d: BatchDims,
    top_p: &[f32],
    top_k: &[i32],
    temperature: &[f32],
    seed: &[u64],
) -> RowParams {
    let rows = l.batch_id.len();
    let slots = (
        cpu.upload(top_p).unwrap(),
        cpu.upload(top_k).unwrap(),
        cpu.upload(temperature).unwrap(),
        cpu.upload(seed).unwrap(),
    );
    let mut out = (
        cpu.upload(&vec![-7.0f32; rows]).unwrap(),
        cpu.upload(&vec![-7i32; rows]).unwrap(),
        cpu.upload(&vec![-7.0f32; rows]).unwrap(),
        cpu.upload(&vec![7u64; rows]).unwrap(),
    );
    cpu.build_sampling_params(
        &SamplingParamsInputs {
            slots: SlotSamplingParams {
                top_p: &slots.0,
                top_k: &slots.1,
                temperature: &slots.2,
                infer_seed: &slots.3,
            },
            lens: l.lens(),
            layout: l.output(),
        },
        &mut RowSamplingParams {
            top_p: &mut out.0,
            top_k: &mut out.1,
            temperature: &mut out.2,
            seed: &mut out.3,
        },
        &SamplingParamsParams {
            dims: d,
            host: None,
            host_top_p: None,
            host_temperature: None,
        },
    )
    .unwrap();
    RowParams {
        top_p: get(cpu, &out.0),
        top_k: get(cpu, &out.1),
        temperature: get(cpu, &out.2),
        seed: get(cpu, &out.3),
    }
}

#[test]
fn sampling_params_golden_case_of_contract_section_2() {
    let cpu = cpu();
    let d = dims(4, 4, 3);
    let l = layout(&cpu, &[3, 5, 0, 2], &[0, 5, 0, 0], d, 12);
    let p = sampling_params(
        &cpu,
        &l,
        d,
        &[0.9, 0.8, 0.7, 1.0],
        &[10, 20, 30, 40],
        &[0.5, 1.5, 2.5, 0.0],
        &[100, 200, 300, 400],
    );
    let pad = 12 - 6;
    let with_pad = |v: &[f32], fill: f32| -> Vec<f32> {
        v.iter()
            .copied()
            .chain(std::iter::repeat_n(fill, pad))
            .collect()
    };
    assert_eq!(p.top_p, with_pad(&[0.9, 0.9, 0.9, 0.8, 1.0, 1.0], 1.0));
    let mut top_k = vec![10, 10, 10, 20, 40, 40];
    top_k.resize(12, 0);
    assert_eq!(p.top_k, top_k);
    assert_eq!(
        p.temperature,
        with_pad(&[0.5, 0.5, 0.5, 1.5, 0.0, 0.0], 1.0)
    );
    let mut seed = vec![100, 104, 108, 200, 400, 404];
    seed.resize(12, 0);
    assert_eq!(p.seed, seed);
}

#[test]
fn sampling_params_seeds_wrap_and_values_are_copied_raw() {
    let cpu = cpu();
    let d = dims(2, 2, 3);
    let l = layout(&cpu, &[3, 1], &[0, 0], d, 6);
    // Device-side top_p 7.0 and a negative temperature are copied raw (consumers sanitise them).
    let p = sampling_params(
        &cpu,
        &l,
        d,
        &[7.0, 0.5],
        &[-3, 2],
        &[-1.0, 1.0],
        &[MAX_INFER_SEED - 4, u64::MAX],
    );
    assert_eq!(
        &p.seed[..4],
        [MAX_INFER_SEED - 4, 0, 4, u64::MAX % MAX_INFER_SEED]
    );
    assert_eq!(&p.top_p[..4], [7.0, 7.0, 7.0, 0.5]);
    assert_eq!(&p.top_k[..4], [-3, -3, -3, 2]);
    assert_eq!(&p.temperature[..4], [-1.0, -1.0, -1.0, 1.0]);
    assert_eq!(&p.seed[4..], [0, 0]);
}

#[test]
fn sampling_params_garbage_layout_gives_padding_rows() {
    let cpu = cpu();
    let d = dims(2, 2, 2);
    let mut l = layout(&cpu, &[2, 1], &[0, 0], d, 4);
    // batch_id: out of range, negative, a slot whose cu_out puts the row before its start, and
    // a position beyond the slot's rows.
    cpu.write(&mut l.batch_id, &[7, -1, 1, 0]).unwrap();
    cpu.write(&mut l.cu_out, &[2, 3, i32::MIN]).unwrap();
    let p = sampling_params(&cpu, &l, d, &[0.5, 0.6], &[1, 2], &[1.0, 1.0], &[10, 20]);
    // row 2: slot 1, k = 2 - 3 < 0 -> padding; row 3: slot 0, k = 3 - 2 = 1 < 2 rows -> valid.
    assert_eq!(p.top_p, [1.0, 1.0, 1.0, 0.5]);
    assert_eq!(p.top_k, [0, 0, 0, 1]);
    assert_eq!(p.seed, [0, 0, 0, 14]);
}

// ---------------------------------------------------------------------------------------------
// gather_next_token

fn gather<T: specula_backend_api::Element>(
    cpu: &CpuDevice,
    l: &Layout,
    d: BatchDims,
    hidden_states: &[T],
    hidden: usize,
    is_speculative: bool,
    garbage: T,
) -> Vec<T> {
    let x = cpu.upload(hidden_states).unwrap();
    let rows = if is_speculative {
        l.batch_id.len()
    } else {
        d.max_bsz
    };
    let mut out = cpu.upload(&vec![garbage; rows * hidden]).unwrap();
    cpu.gather_next_token(
        &GatherInputs {
            hidden_states: &x,
            cu_seqlens_q: &l.cu_q,
            lens: l.lens(),
            layout: l.output(),
        },
        &mut out,
        &GatherParams {
            dims: d,
            token_num: hidden_states.len() / hidden,
            hidden,
            is_speculative,
            host: None,
        },
    )
    .unwrap();
    get(cpu, &out)
}

/// `hidden_states` with row r = [10r + 1, 10r + 2].
fn rows_f32(n: usize) -> Vec<f32> {
    (0..n)
        .flat_map(|r| [10.0 * r as f32 + 1.0, 10.0 * r as f32 + 2.0])
        .collect()
}

#[test]
fn gather_speculative_rows_and_zero_padding() {
    let cpu = cpu();
    // slot 0 decode 2 tokens (packed 0, 1), slot 1 prefill 3 (packed 2..5), slot 2 empty,
    // slot 3 decode 1 (packed 5).
    let d = dims(4, 4, 2);
    let l = layout(&cpu, &[2, 3, 0, 1], &[0, 3, 0, 0], d, 8);
    let out = gather(&cpu, &l, d, &rows_f32(6), 2, true, f32::NAN);
    let expected = [
        1.0, 2.0, 11.0, 12.0, 41.0, 42.0, 51.0, 52.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ];
    assert_eq!(out, expected);
}

#[test]
fn gather_non_speculative_last_token_per_slot_and_zeros() {
    let cpu = cpu();
    // slot 0 decode 1 (packed 0), slot 1 prefill 3 (packed 1..4), slot 2 empty, slot 3 decode 1
    // (packed 4), slot 4 beyond real_bsz.
    let d = dims(5, 4, 1);
    let l = layout(&cpu, &[1, 3, 0, 1, 1], &[0, 3, 0, 0, 0], d, 4);
    let out = gather(&cpu, &l, d, &rows_f32(5), 2, false, f32::NAN);
    assert_eq!(out, [1.0, 2.0, 31.0, 32.0, 0.0, 0.0, 41.0, 42.0, 0.0, 0.0]);
}

#[test]
fn gather_bf16_is_bit_exact() {
    let cpu = cpu();
    let d = dims(2, 2, 2);
    let l = layout(&cpu, &[2, 1], &[0, 0], d, 4);
    // NaN payloads, negative zero, a subnormal, -inf: any value conversion would disturb some.
    let bits: [u16; 9] = [
        0x7fc1, 0x8000, 0x0001, 0xff80, 0x3f80, 0xffff, 0x7f81, 0x1234, 0xabcd,
    ];
    let x: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
    let out = gather(&cpu, &l, d, &x, 3, true, bf16::from_bits(0x5555));
    let got: Vec<u16> = out.iter().map(|v| v.to_bits()).collect();
    assert_eq!(
        got,
        [
            0x7fc1, 0x8000, 0x0001, 0xff80, 0x3f80, 0xffff, 0x7f81, 0x1234, 0xabcd, 0, 0, 0
        ]
    );
}

#[test]
fn gather_garbage_offsets_give_zero_rows() {
    let cpu = cpu();
    let d = dims(3, 3, 2);
    let mut l = layout(&cpu, &[2, 1, 1], &[0, 0, 0], d, 6);
    // cu_seqlens_q pointing before and past the input, batch ids out of range.
    cpu.write(&mut l.cu_q, &[-1, 1000, 2, 3]).unwrap();
    cpu.write(&mut l.batch_id, &[0, 0, 1, 2, 99, -5]).unwrap();
    let out = gather(&cpu, &l, d, &rows_f32(4), 2, true, 7.0);
    // row 0: slot 0 k 0 -> packed -1 (zeros); row 1: packed 0; row 2: slot 1 -> 1000 (zeros);
    // row 3: slot 2 -> packed 2; rows 4, 5: invalid slot.
    assert_eq!(
        out,
        [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 21.0, 22.0, 0.0, 0.0, 0.0, 0.0]
    );
    let out = gather(&cpu, &l, d, &rows_f32(4), 2, false, 7.0);
    // slot 0: last = -1 + 2 - 1 = 0; slot 1: 1000 (zeros); slot 2: packed 2.
    assert_eq!(out, [1.0, 2.0, 0.0, 0.0, 21.0, 22.0]);
}

// ---------------------------------------------------------------------------------------------
// update_state

/// A whole decode state on the host, uploaded for one `update_state` call and read back.
#[derive(Clone, Debug, PartialEq)]
struct State {
    accept_num: Vec<i32>,
    stop_flags: Vec<u8>,
    token_ids_all: Vec<i32>,
    step_idx: Vec<i32>,
    infer_seed: Vec<u64>,
    draft_tokens: Vec<i32>,
    encoder: Vec<i32>,
    decoder: Vec<i32>,
}

struct Step<'a> {
    accept_tokens: &'a [i32],
    is_block_step: &'a [u8],
    prompt_lens: &'a [i32],
    max_dec_len: &'a [i32],
    end_tokens: &'a [i32],
}

fn update(
    cpu: &CpuDevice,
    d: BatchDims,
    max_model_len: usize,
    step: &Step<'_>,
    state: &State,
) -> State {
    let accept_tokens = cpu.upload(step.accept_tokens).unwrap();
    let is_block_step = cpu.upload(step.is_block_step).unwrap();
    let prompt_lens = cpu.upload(step.prompt_lens).unwrap();
    let max_dec_len = cpu.upload(step.max_dec_len).unwrap();
    let end_tokens = cpu.upload(step.end_tokens).unwrap();
    let mut b = (
        cpu.upload(&state.accept_num).unwrap(),
        cpu.upload(&state.stop_flags).unwrap(),
        cpu.upload(&state.token_ids_all).unwrap(),
        cpu.upload(&state.step_idx).unwrap(),
        cpu.upload(&state.infer_seed).unwrap(),
        cpu.upload(&state.draft_tokens).unwrap(),
        cpu.upload(&state.encoder).unwrap(),
        cpu.upload(&state.decoder).unwrap(),
    );
    cpu.update_state(
        &UpdateStateInputs {
            accept_tokens: &accept_tokens,
            is_block_step: &is_block_step,
            prompt_lens: &prompt_lens,
            max_dec_len: &max_dec_len,
            end_tokens: &end_tokens,
        },
        &mut DecodeState {
            accept_num: &mut b.0,
            stop_flags: &mut b.1,
            token_ids_all: &mut b.2,
            step_idx: &mut b.3,
            infer_seed: &mut b.4,
            draft_tokens: &mut b.5,
            seq_lens_encoder: &mut b.6,
            seq_lens_decoder: &mut b.7,
        },
        &UpdateStateParams {
            dims: d,
            max_model_len,
        },
    )
    .unwrap();
    State {
        accept_num: get(cpu, &b.0),
        stop_flags: get(cpu, &b.1),
        token_ids_all: get(cpu, &b.2),
        step_idx: get(cpu, &b.3),
        infer_seed: get(cpu, &b.4),
        draft_tokens: get(cpu, &b.5),
        encoder: get(cpu, &b.6),
        decoder: get(cpu, &b.7),
    }
}

#[test]
fn update_state_per_slot_rules() {
    let cpu = cpu();
    const S: usize = 3;
    const L: usize = 10;
    // 8 slots, real_bsz 7: slot 7 is beyond it and must stay untouched.
    let d = dims(8, 7, S);
    #[rustfmt::skip]
    let accept_tokens = [
        7, 8, -1,    // 0: plain decode, 2 tokens
        1, 2, 3,     // 1: 3 tokens but room for 2 -> clamp + stop
        5, 98, -1,   // 2: second token is an end token -> stop
        4, 4, -1,    // 3: reaches max_dec_len -> stop
        42, -1, -1,  // 4: prefill becomes decode
        9, 9, -1,    // 5: stopped: untouched
        9, 9, -1,    // 6: blocked: untouched
        9, 9, -1,    // 7: beyond real_bsz: untouched
    ];
    let step = Step {
        accept_tokens: &accept_tokens,
        is_block_step: &[0, 0, 0, 0, 0, 0, 1, 0],
        prompt_lens: &[3, 6, 2, 2, 4, 2, 2, 2],
        max_dec_len: &[100, 100, 100, 5, 100, 100, 100, 100],
        end_tokens: &[99, 98],
    };
    let before = State {
        accept_num: vec![2, 3, 2, 2, 1, 2, 2, 2],
        stop_flags: vec![0, 0, 0, 0, 0, 1, 0, 0],
        token_ids_all: vec![-9; 8 * L],
        step_idx: vec![2, 2, 0, 3, 0, 1, 1, 1],
        infer_seed: vec![100, MAX_INFER_SEED - 4, 0, 0, 50, 1, 1, 1],
        draft_tokens: vec![-5; 8 * S],
        encoder: vec![0, 0, 0, 0, 4, 0, 0, 0],
        decoder: vec![5, 8, 2, 5, 0, 3, 3, 3],
    };
    let after = update(&cpu, d, L, &step, &before);

    let mut want = before.clone();
    want.accept_num[1] = 2;
    want.stop_flags = vec![0, 1, 1, 1, 0, 1, 0, 0];
    let row = |b: usize, at: usize| b * L + at;
    want.token_ids_all[row(0, 5)..row(0, 7)].copy_from_slice(&[7, 8]);
    want.token_ids_all[row(1, 8)..row(1, 10)].copy_from_slice(&[1, 2]);
    want.token_ids_all[row(2, 2)..row(2, 4)].copy_from_slice(&[5, 98]);
    want.token_ids_all[row(3, 5)..row(3, 7)].copy_from_slice(&[4, 4]);
    want.token_ids_all[row(4, 4)] = 42;
    want.step_idx[..5].copy_from_slice(&[4, 4, 2, 5, 1]);
    // +4 per emitted token, modulo MAX_INFER_SEED.
    want.infer_seed[..5].copy_from_slice(&[108, 4, 8, 8, 54]);
    for (b, last) in [(0, 8), (1, 2), (2, 98), (3, 4), (4, 42)] {
        want.draft_tokens[b * S] = last;
    }
    want.encoder[4] = 0;
    want.decoder[..5].copy_from_slice(&[7, 10, 4, 7, 4]);
    assert_eq!(after, want);
}

#[test]
fn update_state_no_room_only_stops() {
    let cpu = cpu();
    let d = dims(2, 2, 2);
    let step = Step {
        accept_tokens: &[1, 2, 3, 4],
        is_block_step: &[0, 0],
        prompt_lens: &[4, 2],
        max_dec_len: &[100, 100],
        end_tokens: &[0],
    };
    // slot 0: prompt 4 + step 0 = max_model_len: no room. slot 1: step_idx past the end.
    let before = State {
        accept_num: vec![2, 1],
        stop_flags: vec![0, 0],
        token_ids_all: vec![-9; 8],
        step_idx: vec![0, 5],
        infer_seed: vec![10, 20],
        draft_tokens: vec![-5; 4],
        encoder: vec![0, 0],
        decoder: vec![4, 7],
    };
    let after = update(&cpu, d, 4, &step, &before);
    let mut want = before.clone();
    want.accept_num = vec![0, 0];
    want.stop_flags = vec![1, 1];
    assert_eq!(after, want);
}

#[test]
fn update_state_hostile_contents() {
    let cpu = cpu();
    const S: usize = 2;
    let d = dims(5, 5, S);
    let step = Step {
        accept_tokens: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        is_block_step: &[0, 0, 0, 0, 0],
        // slot 1: negative prompt (counts as 0); slot 2: prompt far past max_model_len.
        prompt_lens: &[1, -7, i32::MAX, 1, 1],
        max_dec_len: &[i32::MIN, 100, 100, 100, 100],
        end_tokens: &[-100],
    };
    let before = State {
        // slot 0: huge accept_num -> S; slot 3: negative -> nothing; slot 4: step_idx i32::MAX.
        accept_num: vec![i32::MAX, 1, 1, -4, 1],
        stop_flags: vec![0, 0, 0, 0, 0],
        token_ids_all: vec![-9; 5 * 6],
        step_idx: vec![-3, 0, 0, 0, i32::MAX],
        infer_seed: vec![0, 0, 0, 0, 0],
        draft_tokens: vec![-5; 5 * S],
        encoder: vec![0, 0, 0, 0, 0],
        decoder: vec![i32::MAX, 0, 0, 0, 0],
    };
    let after = update(&cpu, d, 6, &step, &before);
    let mut want = before.clone();
    // slot 0: step_idx -3 counts as 0, 2 tokens at 1..3, max_dec_len negative -> stop,
    // decoder saturates.
    want.accept_num[0] = 2;
    want.token_ids_all[1..3].copy_from_slice(&[1, 2]);
    want.step_idx[0] = 2;
    want.infer_seed[0] = 8;
    want.draft_tokens[0] = 2;
    want.stop_flags[0] = 1;
    // slot 1: prompt 0, token at 0.
    want.token_ids_all[6] = 3;
    want.step_idx[1] = 1;
    want.infer_seed[1] = 4;
    want.draft_tokens[2] = 3;
    want.decoder[1] = 1;
    // slot 2: prompt clamps to max_model_len: no room -> stop only.
    want.accept_num[2] = 0;
    want.stop_flags[2] = 1;
    // slot 4: no room.
    want.accept_num[4] = 0;
    want.stop_flags[4] = 1;
    assert_eq!(after, want);
}

// ---------------------------------------------------------------------------------------------
// ngram_match

struct Ngram<'a> {
    max_model_len: usize,
    token_ids_all: &'a [i32],
    prompt_lens: &'a [i32],
    step_idx: &'a [i32],
    draft_token_num: &'a [i32],
    encoder: &'a [i32],
    max_dec_len: &'a [i32],
    this_time: &'a [i32],
    draft_tokens: &'a [i32],
    max_ngram: usize,
    min_ngram: usize,
    threshold: usize,
}

/// Runs `ngram_match`; returns (draft_tokens, seq_lens_this_time).
fn ngram(cpu: &CpuDevice, d: BatchDims, n: &Ngram<'_>) -> (Vec<i32>, Vec<i32>) {
    let inputs = (
        cpu.upload(n.token_ids_all).unwrap(),
        cpu.upload(n.prompt_lens).unwrap(),
        cpu.upload(n.step_idx).unwrap(),
        cpu.upload(n.draft_token_num).unwrap(),
        cpu.upload(n.encoder).unwrap(),
        cpu.upload(n.max_dec_len).unwrap(),
    );
    let mut draft_tokens = cpu.upload(n.draft_tokens).unwrap();
    let mut this_time = cpu.upload(n.this_time).unwrap();
    cpu.ngram_match(
        &NgramInputs {
            token_ids_all: &inputs.0,
            prompt_lens: &inputs.1,
            step_idx: &inputs.2,
            draft_token_num: &inputs.3,
            seq_lens_encoder: &inputs.4,
            max_dec_len: &inputs.5,
        },
        &mut NgramOutputs {
            draft_tokens: &mut draft_tokens,
            seq_lens_this_time: &mut this_time,
        },
        &NgramParams {
            dims: d,
            max_model_len: n.max_model_len,
            max_ngram_size: n.max_ngram,
            min_ngram_size: n.min_ngram,
            threshold: n.threshold,
        },
    )
    .unwrap();
    (get(cpu, &draft_tokens), get(cpu, &this_time))
}

/// A one-slot history row: prompt then generated, padded with -9 to `len`.
fn history(prompt: &[i32], generated: &[i32], len: usize) -> Vec<i32> {
    let mut row: Vec<i32> = prompt.iter().chain(generated).copied().collect();
    row.resize(len, -9);
    row
}

fn one_slot<'a>(
    row: &'a [i32],
    prompt_len: &'a [i32],
    step: &'a [i32],
    max_dec_len: &'a [i32],
) -> Ngram<'a> {
    Ngram {
        max_model_len: row.len(),
        token_ids_all: row,
        prompt_lens: prompt_len,
        step_idx: step,
        draft_token_num: &[3],
        encoder: &[0],
        max_dec_len,
        this_time: &[1],
        draft_tokens: &[-5, -5, -5, 77],
        max_ngram: 3,
        min_ngram: 1,
        threshold: 128,
    }
}

#[test]
fn ngram_golden_cases_of_contract_section_4_7() {
    let cpu = cpu();
    let d = dims(1, 1, 4);
    let row = history(&[10, 20, 30, 40, 50, 60], &[10, 20, 30, 40], 16);
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[6], &[4], &[10]));
    // Position 0 is not written; position 3 is beyond the new drafts and left as it was.
    assert_eq!(drafts, [-5, 50, 60, 77]);
    assert_eq!(this_time, [3]);

    let row = history(&[10, 20, 30, 40, 50, 10, 20, 30], &[40, 50, 10], 16);
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[8], &[3], &[10]));
    assert_eq!(drafts, [-5, 20, 30, 77]);
    assert_eq!(this_time, [3]);
}

#[test]
fn ngram_max_dec_len_clips_the_drafts() {
    let cpu = cpu();
    let d = dims(1, 1, 4);
    let row = history(&[1, 2, 3, 4, 5, 6, 7], &[1, 2], 16);
    // max_dec_len - step_idx - 1 = 1 draft.
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[7], &[2], &[4]));
    assert_eq!((drafts, this_time), (vec![-5, 3, -5, 77], vec![2]));
    // No draft at all when the next token is the last one allowed.
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[7], &[2], &[3]));
    assert_eq!((drafts, this_time), (vec![-5, -5, -5, 77], vec![1]));
}

#[test]
fn ngram_no_match_gives_no_drafts() {
    let cpu = cpu();
    let d = dims(1, 1, 4);
    // Only the self-match exists for every n: nothing.
    let row = history(&[9, 9], &[1, 2, 3], 8);
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[2], &[3], &[100]));
    assert_eq!((drafts, this_time), (vec![-5, -5, -5, 77], vec![1]));
}

#[test]
fn ngram_history_match_excludes_the_self_match() {
    let cpu = cpu();
    let d = dims(1, 1, 4);
    // [9, 7, 8] is not found; [7, 8] is in the prompt nowhere, and in the history at 0 (its
    // self-match at 3 is excluded): drafts are what follows, [9, 7, 8].
    let row = history(&[1, 2, 3], &[7, 8, 9, 7, 8], 12);
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[3], &[5], &[100]));
    assert_eq!((drafts, this_time), (vec![-5, 9, 7, 8], vec![4]));
}

#[test]
fn ngram_prompt_match_without_follower_falls_back_to_history() {
    let cpu = cpu();
    let d = dims(1, 1, 4);
    // [5, 6] ends the prompt (no token after it there), so the history match at 1 is used.
    let row = history(&[4, 5, 6], &[1, 5, 6, 9, 5, 6], 12);
    let mut case = one_slot(&row, &[3], &[6], &[100]);
    case.max_ngram = 2;
    let (drafts, this_time) = ngram(&cpu, d, &case);
    assert_eq!((drafts, this_time), (vec![-5, 9, 5, 6], vec![4]));
}

#[test]
fn ngram_longest_pattern_wins_and_patterns_longer_than_history_are_skipped() {
    let cpu = cpu();
    let d = dims(1, 1, 4);
    // step 2: n = 3 is skipped. [2, 3] is at 4 (followed by 50); [3] alone is at 0 (followed by 40).
    let row = history(&[3, 40, 0, 0, 2, 3, 50], &[2, 3], 12);
    let (drafts, this_time) = ngram(&cpu, d, &one_slot(&row, &[7], &[2], &[100]));
    assert_eq!((drafts, this_time), (vec![-5, 50, -5, 77], vec![2]));
}

#[test]
fn ngram_threshold_budget_is_granted_in_slot_order() {
    let cpu = cpu();
    const S: usize = 4;
    const L: usize = 10;
    // Slots 0, 2, 3 are decode slots that each find 3 drafts; slot 1 is a prefill of 5 tokens;
    // slot 4 is idle. mandatory = 5 + 3 = 8, threshold 12 -> 4 draft tokens: 3, 1, 0.
    let d = dims(5, 5, S);
    let one = history(&[1, 2, 3, 4, 5], &[1], L);
    let token_ids_all: Vec<i32> = (0..5).flat_map(|_| one.clone()).collect();
    let draft_tokens = vec![-5; 5 * S];
    let case = Ngram {
        max_model_len: L,
        token_ids_all: &token_ids_all,
        prompt_lens: &[5; 5],
        step_idx: &[1; 5],
        draft_token_num: &[3; 5],
        encoder: &[0, 5, 0, 0, 0],
        max_dec_len: &[100; 5],
        this_time: &[1, 5, 1, 1, 0],
        draft_tokens: &draft_tokens,
        max_ngram: 3,
        min_ngram: 1,
        threshold: 12,
    };
    let (drafts, this_time) = ngram(&cpu, d, &case);
    #[rustfmt::skip]
    let want = [
        -5, 2, 3, 4,
        -5, -5, -5, -5,
        -5, 2, -5, -5,
        -5, -5, -5, -5,
        -5, -5, -5, -5,
    ];
    assert_eq!(drafts, want);
    assert_eq!(this_time, [4, 5, 2, 1, 0]);

    // A threshold below the mandatory tokens grants nothing.
    let (drafts, this_time) = ngram(
        &cpu,
        d,
        &Ngram {
            threshold: 3,
            ..case
        },
    );
    assert_eq!(drafts, draft_tokens);
    assert_eq!(this_time, [1, 5, 1, 1, 0]);
}

#[test]
fn ngram_hostile_contents_never_panic() {
    let cpu = cpu();
    const S: usize = 3;
    const L: usize = 6;
    let d = dims(7, 6, S);
    let token_ids_all: Vec<i32> = (0..7 * L as i32).map(|i| i % 3).collect();
    let draft_tokens = vec![-5; 7 * S];
    let case = Ngram {
        max_model_len: L,
        token_ids_all: &token_ids_all,
        // 0: negative prompt; 1: prompt past the row; 2: step past the row; 3: negative draft num;
        // 4: negative max_dec_len; 5: negative encoder with this_time > 0 (counts as 0: decode);
        // 6: beyond real_bsz.
        prompt_lens: &[-4, i32::MAX, 2, 2, 2, 2, 2],
        step_idx: &[3, 3, i32::MAX, 3, 3, 3, 3],
        draft_token_num: &[i32::MAX, 3, 3, -1, 3, 3, 3],
        encoder: &[0, 0, 0, 0, 0, -1, 0],
        max_dec_len: &[i32::MAX, 100, 100, 100, i32::MIN, 100, 100],
        this_time: &[1, 1, 1, 1, 1, 2, 3],
        draft_tokens: &draft_tokens,
        max_ngram: usize::MAX,
        min_ngram: 1,
        threshold: usize::MAX,
    };
    let (drafts, this_time) = ngram(&cpu, d, &case);
    // Slot 0: prompt 0, history [0, 1, 2]: no earlier match. Slot 1: prompt clamps to the whole
    // row, step to 0: nothing to match. Slot 2: step clamps to 4, history [2, 0, 1, 2]; [2] at 0
    // (self-match excluded) -> follows [0, 1] (budget S - 1 = 2). Slots 3, 4: zero budget.
    // Slot 5 decodes (prompt [0, 1], history [2, 0, 1]) but every match ends its haystack: no
    // drafts, this_time 1. Slot 6 is beyond real_bsz: untouched.
    assert_eq!(this_time, [1, 1, 3, 1, 1, 1, 3]);
    let mut want = draft_tokens.clone();
    want[2 * S + 1..2 * S + 3].copy_from_slice(&[0, 1]);
    assert_eq!(drafts, want);
}
