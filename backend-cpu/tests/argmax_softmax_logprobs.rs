//! Contract tests of the per-row float ops of the CPU backend: `argmax` (§4.2), `softmax` (§4.9)
//! and `accept_logprobs` (§4.8), with the special values (NaN, ±0, ±inf) the contract pins down
//! and hostile device contents that must give the documented fallbacks.

// Helpers outside `#[test]` functions unwrap too: a failed setup is a failed test.
#![allow(clippy::unwrap_used)]

use half::{bf16, f16};
use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, Device, DeviceExt, Element};
use specula_backend_cpu::CpuDevice;

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;
const NEG_INF: f32 = f32::NEG_INFINITY;

fn cpu() -> CpuDevice {
    CpuDevice::with_threads(2).unwrap()
}

fn get<T: Element>(cpu: &CpuDevice, b: &Buffer) -> Vec<T> {
    cpu.download::<T>(b).unwrap()
}

/// A deterministic pseudo-random f32 in [-1, 1) (a 64-bit LCG; no dependency needed).
fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

// ---------------------------------------------------------------------------------------------
// argmax

fn argmax<T: Element>(cpu: &CpuDevice, rows: &[T], vocab: usize) -> Vec<i32> {
    let input = cpu.upload(rows).unwrap();
    let mut out = cpu.upload(&vec![-7i32; rows.len() / vocab]).unwrap();
    let shape = RowShape {
        rows: rows.len() / vocab,
        vocab,
    };
    cpu.argmax(&input, &mut out, &shape).unwrap();
    get(cpu, &out)
}

#[test]
fn argmax_nan_ranks_below_everything() {
    let cpu = cpu();
    #[rustfmt::skip]
    let rows = [
        NAN, NEG_INF, NAN,     // -inf beats NaN
        NAN, NAN, NAN,         // all NaN -> 0
        1.0, NAN, 2.0,         // NaN in the middle is skipped
        NAN, -1e30, NEG_INF,
        INF, NAN, INF,         // ties at +inf -> lowest
    ];
    assert_eq!(argmax(&cpu, &rows, 3), [1, 0, 2, 1, 0]);
}

#[test]
fn argmax_zero_signs_are_equal_and_ties_go_to_lowest_id() {
    let cpu = cpu();
    #[rustfmt::skip]
    let rows = [
        -0.0, 0.0, -1.0, -0.0,
        0.0, -0.0, -1.0, 0.0,
        -3.0, -0.0, -2.0, 0.0,
        1.0, 3.0, 3.0, 2.0,
        NEG_INF, NEG_INF, NEG_INF, NEG_INF,
    ];
    assert_eq!(argmax(&cpu, &rows, 4), [0, 0, 1, 1, 0]);
}

#[test]
fn argmax_half_precision_inputs() {
    let cpu = cpu();
    let row = [0.25f32, 7.0, NAN, 7.0, -0.0];
    let h: Vec<f16> = row.iter().map(|&v| f16::from_f32(v)).collect();
    let b: Vec<bf16> = row.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(argmax(&cpu, &h, 5), [1]);
    assert_eq!(argmax(&cpu, &b, 5), [1]);
    // Values distinct in bf16 only by the last mantissa bit.
    let b: Vec<bf16> = [0x3f80u16, 0x3f81, 0x3f81, 0x3f7f]
        .iter()
        .map(|&x| bf16::from_bits(x))
        .collect();
    assert_eq!(argmax(&cpu, &b, 4), [1]);
}

#[test]
fn argmax_many_rows_in_parallel() {
    let cpu = cpu();
    let (rows, vocab) = (257, 1000);
    let mut state = 1;
    let mut data: Vec<f32> = (0..rows * vocab).map(|_| lcg(&mut state)).collect();
    let want: Vec<i32> = (0..rows)
        .map(|r| {
            let id = (r * 7919) % vocab;
            data[r * vocab + id] = 5.0;
            id as i32
        })
        .collect();
    assert_eq!(argmax(&cpu, &data, vocab), want);
}

// ---------------------------------------------------------------------------------------------
// softmax

fn softmax<T: Element>(cpu: &CpuDevice, rows: &[T], vocab: usize, temperature: &[f32]) -> Vec<f32> {
    let logits = cpu.upload(rows).unwrap();
    let t = cpu.upload(temperature).unwrap();
    let mut probs = cpu.upload(&vec![-7.0f32; rows.len()]).unwrap();
    let params = SoftmaxParams {
        shape: RowShape {
            rows: temperature.len(),
            vocab,
        },
        host_temperature: None,
    };
    cpu.softmax(&logits, &t, &mut probs, &params).unwrap();
    get(cpu, &probs)
}

/// softmax(x / t) in f64 from the f32 scaled logits, NaN as -inf (finite-maximum rows only).
fn softmax_f64(row: &[f32], t: f32) -> Vec<f64> {
    let y: Vec<f64> = row
        .iter()
        .map(|&x| {
            let y = x / t;
            if y.is_nan() {
                f64::NEG_INFINITY
            } else {
                f64::from(y)
            }
        })
        .collect();
    let m = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = y.iter().map(|v| (v - m).exp()).sum();
    y.iter().map(|v| (v - m).exp() / sum).collect()
}

fn assert_rel(got: &[f32], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= rel * w.abs(),
            "entry {i}: got {g}, want {w}, relative error {}",
            err / w.abs()
        );
    }
}

#[test]
fn softmax_temperature_zero_is_one_hot_at_the_argmax() {
    let cpu = cpu();
    let rows = [1.0, 5.0, 5.0, NAN, NAN, NAN, NAN, NAN];
    assert_eq!(
        softmax(&cpu, &rows, 4, &[0.0, 0.0]),
        [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn softmax_special_rows() {
    let cpu = cpu();
    #[rustfmt::skip]
    let rows = [
        INF, 1.0, INF, NAN,          // uniform over the +inf entries
        NEG_INF, NAN, NEG_INF, NAN,  // all -inf (NaN counts as -inf): uniform over the row
        NAN, 0.0, 0.0, NEG_INF,      // NaN is -inf
        3.0, 3.0, 3.0, 3.0,          // plain uniform
    ];
    let probs = softmax(&cpu, &rows, 4, &[1.0, 1.0, 1.0, 2.0]);
    #[rustfmt::skip]
    let want = [
        0.5, 0.0, 0.5, 0.0,
        0.25, 0.25, 0.25, 0.25,
        0.0, 0.5, 0.5, 0.0,
        0.25, 0.25, 0.25, 0.25,
    ];
    assert_eq!(probs, want);
}

#[test]
fn softmax_device_temperature_negative_or_nan_counts_as_one() {
    let cpu = cpu();
    let row = [0.5f32, -1.0, 2.0];
    let rows: Vec<f32> = row.iter().copied().cycle().take(9).collect();
    let probs = softmax(&cpu, &rows, 3, &[1.0, -2.0, NAN]);
    assert_eq!(probs[0..3], probs[3..6]);
    assert_eq!(probs[0..3], probs[6..9]);
    // And temperature actually matters elsewhere.
    let hot = softmax(&cpu, &row, 3, &[4.0]);
    assert!(hot[2] < probs[2]);
}

#[test]
fn softmax_matches_an_f64_reference() {
    let cpu = cpu();
    let vocab = 1003;
    let temperature = [0.7f32, 1.0, 2.0, 1e-3];
    let mut state = 7;
    // Logits in [-3, 3]; with T = 1e-3 the row is very peaked (many entries underflow to 0).
    let rows: Vec<f32> = (0..vocab * temperature.len())
        .map(|_| 3.0 * lcg(&mut state))
        .collect();
    let probs = softmax(&cpu, &rows, vocab, &temperature);
    for (r, &t) in temperature.iter().enumerate() {
        let range = r * vocab..(r + 1) * vocab;
        let want = softmax_f64(&rows[range.clone()], t);
        // Entries below 1e-30 are dominated by subnormal rounding; compare them absolutely.
        for (i, (&g, &w)) in probs[range].iter().zip(&want).enumerate() {
            if w < 1e-30 {
                assert!(f64::from(g).abs() < 1e-30, "row {r} entry {i}: {g} vs {w}");
            } else {
                assert_rel(&[g], &[w], 1e-6);
            }
        }
    }
}

#[test]
fn softmax_half_precision_inputs_widen_exactly() {
    let cpu = cpu();
    let row = [0.5f32, -1.25, 2.0, 0.0, 1.5];
    let h: Vec<f16> = row.iter().map(|&v| f16::from_f32(v)).collect();
    let b: Vec<bf16> = row.iter().map(|&v| bf16::from_f32(v)).collect();
    let want = softmax_f64(&row, 0.8);
    assert_rel(&softmax(&cpu, &h, 5, &[0.8]), &want, 1e-6);
    assert_rel(&softmax(&cpu, &b, 5, &[0.8]), &want, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// accept_logprobs

struct Logprobs {
    cu_accept: Vec<i32>,
    token_ids: Vec<i32>,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    top_ids: Vec<i32>,
    top_logprobs: Vec<f32>,
}

struct LogprobsCase<'a, T> {
    dims: BatchDims,
    vocab: usize,
    logits: &'a [T],
    temperature: &'a [f32],
    accept_tokens: &'a [i32],
    accept_num: &'a [i32],
    encoder: &'a [i32],
    cu_out: &'a [i32],
    k: usize,
}

fn logprobs<T: Element>(cpu: &CpuDevice, c: &LogprobsCase<'_, T>) -> Logprobs {
    let slots = c.dims.max_bsz * c.dims.max_step_tokens;
    let logits = cpu.upload(c.logits).unwrap();
    let temperature = cpu.upload(c.temperature).unwrap();
    let accept_tokens = cpu.upload(c.accept_tokens).unwrap();
    let accept_num = cpu.upload(c.accept_num).unwrap();
    let encoder = cpu.upload(c.encoder).unwrap();
    let cu_out = cpu.upload(c.cu_out).unwrap();
    // Outputs start as garbage so that every written value is checked.
    let mut cu_accept = cpu.upload(&vec![-7i32; c.dims.max_bsz + 1]).unwrap();
    let mut token_ids = cpu.upload(&vec![-7i32; slots]).unwrap();
    let mut lps = cpu.upload(&vec![7.0f32; slots]).unwrap();
    let mut ranks = cpu.upload(&vec![-7i32; slots]).unwrap();
    let mut top_ids = cpu.upload(&vec![-7i32; slots * c.k]).unwrap();
    let mut top_lps = cpu.upload(&vec![7.0f32; slots * c.k]).unwrap();
    cpu.accept_logprobs(
        &LogprobsInputs {
            logits: &logits,
            temperature: &temperature,
            accept_tokens: &accept_tokens,
            accept_num: &accept_num,
            seq_lens_encoder: &encoder,
            cu_seqlens_q_output: &cu_out,
        },
        &mut LogprobsOutputs {
            cu_accept: &mut cu_accept,
            token_ids: &mut token_ids,
            logprobs: &mut lps,
            ranks: &mut ranks,
            top_ids: &mut top_ids,
            top_logprobs: &mut top_lps,
        },
        &LogprobsParams {
            dims: c.dims,
            shape: RowShape {
                rows: c.temperature.len(),
                vocab: c.vocab,
            },
            top_k: c.k,
            host_temperature: None,
        },
    )
    .unwrap();
    Logprobs {
        cu_accept: get(cpu, &cu_accept),
        token_ids: get(cpu, &token_ids),
        logprobs: get(cpu, &lps),
        ranks: get(cpu, &ranks),
        top_ids: get(cpu, &top_ids),
        top_logprobs: get(cpu, &top_lps),
    }
}

/// log_softmax(x / t) in f64 (finite-maximum rows), NaN as -inf.
fn log_softmax_f64(row: &[f32], t: f32) -> Vec<f64> {
    softmax_f64(row, t).iter().map(|p| p.ln()).collect()
}

fn close(got: f32, want: f64) -> bool {
    if want == f64::NEG_INFINITY {
        return got == NEG_INF;
    }
    (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0)
}

fn assert_close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(close(g, w), "entry {i}: got {g}, want {w}");
    }
}

const V: usize = 5;

#[rustfmt::skip]
const ROWS: [f32; 6 * V] = [
    1.0, 3.0, 3.0, NAN, NEG_INF,  // 0: slot 0, decode row 0
    NAN, NEG_INF, 0.0, NAN, NEG_INF,  // 1: slot 0, decode row 1
    2.0, 5.0, 5.0, 5.0, 1.0,      // 2: slot 0, decode row 2 (not accepted)
    0.5, 2.0, 2.0, 1.0, 0.0,      // 3: slot 1, prefill (temperature 0)
    INF, 1.0, INF, 0.0, NAN,      // 4: slot 2, +inf row
    NEG_INF, NAN, NEG_INF, NEG_INF, NEG_INF,  // 5: slot 3, all -inf
];

#[test]
fn logprobs_ranks_top_k_and_special_rows() {
    let cpu = cpu();
    const S: usize = 3;
    // Slot 0: decode, 3 rows, 2 accepted. Slot 1: prefill (1 row, 2 tokens reuse it). Slot 2:
    // decode 1 row, an out-of-vocabulary token. Slot 3: decode 1 row. Slot 4: beyond real_bsz.
    #[rustfmt::skip]
    let accept_tokens = [
        0, 3, 9,
        2, 1, 9,
        7, 9, 9,
        4, 9, 9,
        1, 1, 1,
    ];
    let case = LogprobsCase {
        dims: BatchDims {
            max_bsz: 5,
            real_bsz: 4,
            max_step_tokens: S,
        },
        vocab: V,
        logits: &ROWS,
        temperature: &[2.0, 1.0, 1.0, 0.0, 1.0, 1.0],
        accept_tokens: &accept_tokens,
        accept_num: &[2, 2, 1, 1, 3],
        encoder: &[0, 4, 0, 0, 0],
        cu_out: &[0, 3, 4, 5, 6],
        k: 3,
    };
    let out = logprobs(&cpu, &case);
    assert_eq!(out.cu_accept, [0, 2, 4, 5, 6, 6]);
    let n = 5 * S;
    let mut token_ids = vec![0, 3, 2, 1, 7, 4];
    token_ids.resize(n, -1);
    assert_eq!(out.token_ids, token_ids);
    // Ranks on raw logits, NaN as -inf: row 0 token 0 (1.0) has two larger; row 1 token 3 (NaN)
    // has one larger (0.0); prefill tokens 2 and 1 (2.0) none; out of vocabulary: 0; token 4 of
    // the all -inf row: none larger.
    let mut ranks = vec![3, 2, 1, 1, 0, 1];
    ranks.resize(n, 0);
    assert_eq!(out.ranks, ranks);

    let ls0 = log_softmax_f64(&ROWS[0..V], 2.0);
    let ls1 = log_softmax_f64(&ROWS[V..2 * V], 1.0);
    let ln5 = -(5f64.ln());
    let mut lps = vec![
        ls0[0],
        f64::NEG_INFINITY,
        f64::NEG_INFINITY,
        0.0,
        f64::NEG_INFINITY,
        ln5,
    ];
    lps.resize(n, f64::NEG_INFINITY);
    assert_close(&out.logprobs, &lps);

    // Top-3 in logit order: descending, ties to the lower id, NaN after -inf.
    #[rustfmt::skip]
    let mut top_ids = vec![
        1, 2, 0,  // row 0
        2, 1, 4,  // row 1: 0.0, then the -infs, NaN last
        1, 2, 3,  // prefill row, twice
        1, 2, 3,
        0, 2, 1,  // row 4: +inf ties, then 1.0
        0, 2, 3,  // row 5: -infs, NaN last
    ];
    top_ids.resize(3 * n, -1);
    assert_eq!(out.top_ids, top_ids);
    let ln2 = -(2f64.ln());
    let ni = f64::NEG_INFINITY;
    #[rustfmt::skip]
    let mut top_lps = vec![
        ls0[1], ls0[2], ls0[0],
        ls1[2], ni, ni,
        0.0, ni, ni,
        0.0, ni, ni,
        ln2, ln2, ni,
        ln5, ln5, ln5,
    ];
    top_lps.resize(3 * n, ni);
    assert_close(&out.top_logprobs, &top_lps);
    // The +inf row: the accepted token 7 is out of vocabulary, so -inf and rank 0 above.
}

#[test]
fn logprobs_values_match_an_f64_reference() {
    let cpu = cpu();
    let vocab = 2001;
    let mut state = 3;
    let rows: Vec<f32> = (0..3 * vocab).map(|_| 4.0 * lcg(&mut state)).collect();
    let temperature = [1.0f32, 0.5, 3.0];
    // Three decode slots of one row each; token i * 100 of row i.
    let case = LogprobsCase {
        dims: BatchDims {
            max_bsz: 3,
            real_bsz: 3,
            max_step_tokens: 1,
        },
        vocab,
        logits: &rows,
        temperature: &temperature,
        accept_tokens: &[0, 100, 200],
        accept_num: &[1, 1, 1],
        encoder: &[0, 0, 0],
        cu_out: &[0, 1, 2, 3],
        k: 64,
    };
    let out = logprobs(&cpu, &case);
    for r in 0..3 {
        let row = &rows[r * vocab..(r + 1) * vocab];
        let ls = log_softmax_f64(row, temperature[r]);
        let tok = r * 100;
        assert_close(&out.logprobs[r..r + 1], &ls[tok..tok + 1]);
        let larger = row.iter().filter(|&&x| x > row[tok]).count();
        assert_eq!(out.ranks[r], larger as i32 + 1);
        // Top-64 against a full sort (test only).
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let want: Vec<i32> = order[..64].iter().map(|&i| i as i32).collect();
        assert_eq!(out.top_ids[r * 64..(r + 1) * 64], want[..]);
        let want_lp: Vec<f64> = order[..64].iter().map(|&i| ls[i]).collect();
        assert_close(&out.top_logprobs[r * 64..(r + 1) * 64], &want_lp);
    }
}

#[test]
fn logprobs_top_k_ties_and_k_beyond_vocab() {
    let cpu = cpu();
    let rows = [2.0f32, 5.0, 5.0, 5.0, 1.0, 0.0, 0.0];
    let case = LogprobsCase {
        dims: BatchDims {
            max_bsz: 1,
            real_bsz: 1,
            max_step_tokens: 1,
        },
        vocab: 7,
        logits: &rows,
        temperature: &[1.0],
        accept_tokens: &[3],
        accept_num: &[1],
        encoder: &[0],
        cu_out: &[0, 1],
        k: 2,
    };
    let out = logprobs(&cpu, &case);
    assert_eq!(out.top_ids, [1, 2]);
    assert_eq!(out.ranks, [1]);
    assert_eq!(out.top_logprobs[0], out.logprobs[0]);

    // K = 9 > V = 7: the last two slots are empty.
    let out = logprobs(&cpu, &LogprobsCase { k: 9, ..case });
    assert_eq!(out.top_ids, [1, 2, 3, 0, 4, 5, 6, -1, -1]);
    assert_eq!(out.top_logprobs[7..], [NEG_INF, NEG_INF]);
}

#[test]
fn logprobs_with_k_zero_still_scores_every_entry() {
    let cpu = cpu();
    let rows: Vec<bf16> = [1.0f32, 2.0, 3.0, 0.5]
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let case = LogprobsCase {
        dims: BatchDims {
            max_bsz: 2,
            real_bsz: 2,
            max_step_tokens: 1,
        },
        vocab: 2,
        logits: &rows,
        temperature: &[1.0, 1.0],
        accept_tokens: &[0, 1],
        accept_num: &[1, 1],
        encoder: &[0, 0],
        cu_out: &[0, 1, 2],
        k: 0,
    };
    let out = logprobs(&cpu, &case);
    assert!(out.top_ids.is_empty() && out.top_logprobs.is_empty());
    assert_eq!(out.token_ids, [0, 1]);
    assert_eq!(out.ranks, [2, 2]);
    assert_close(
        &out.logprobs,
        &[
            log_softmax_f64(&[1.0, 2.0], 1.0)[0],
            log_softmax_f64(&[3.0, 0.5], 1.0)[1],
        ],
    );
}

#[test]
fn logprobs_hostile_offsets_and_counts() {
    let cpu = cpu();
    const S: usize = 2;
    let rows = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
    // Slot 0: accept_num huge (clamped to S) but cu_out negative: rows out of range. Slot 1:
    // negative accept_num. Slot 2: decode base 1, second entry at row 3 = past R = 2. Slot 3 is
    // beyond real_bsz.
    let case = LogprobsCase {
        dims: BatchDims {
            max_bsz: 4,
            real_bsz: 3,
            max_step_tokens: S,
        },
        vocab: 3,
        logits: &rows,
        temperature: &[1.0, -5.0],
        accept_tokens: &[2, 1, 0, 0, 1, -3, 2, 2],
        accept_num: &[i32::MAX, -1, 2, 2],
        encoder: &[0, 0, 0, 0],
        cu_out: &[i32::MIN, 0, 1, 2],
        k: 2,
    };
    let out = logprobs(&cpu, &case);
    assert_eq!(out.cu_accept, [0, 2, 2, 4, 4]);
    assert_eq!(out.token_ids, [2, 1, 1, -3, -1, -1, -1, -1]);
    // Entry 2: row 1 (negative device temperature counts as 1), token 1 (4.0) -> rank 2.
    // Entry 3: row 2 does not exist.
    assert_eq!(out.ranks, [0, 0, 2, 0, 0, 0, 0, 0]);
    let ls = log_softmax_f64(&rows[3..6], 1.0);
    let ni = f64::NEG_INFINITY;
    assert_close(&out.logprobs, &[ni, ni, ls[1], ni, ni, ni, ni, ni]);
    assert_eq!(
        out.top_ids,
        [-1, -1, -1, -1, 2, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
    );
    assert_close(&out.top_logprobs[4..6], &[ls[2], ls[1]]);
}
