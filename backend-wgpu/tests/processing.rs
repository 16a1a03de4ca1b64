//! Logits processing on the adapter against the reference device, bit for bit: `process_logits`
//! (`docs/semantics.md` §4c) over random and hostile inputs of every float dtype, the `fallback`
//! input of `top_k_top_p_sample` and `top_p_candidates`, and the token counts of `update_state`.
//!
//! Without a usable adapter the tests are listed as ignored with the reason, and fail under
//! `SPECULA_REQUIRE=wgpu` (`specula_backend_api::testing`).

use std::process::ExitCode;
use std::sync::Arc;

use specula_backend_api::ops::process_logits::mask_words;
use specula_backend_api::ops::{
    BatchDims, CandidatesInputs, CandidatesOutputs, CandidatesParams, DecodeState, OutputLayout,
    ProcessInputs, ProcessOutputs, ProcessParams, RowShape, SampleInputs, SampleParams, Scores,
    SlotProcessing, TokenHistory, UpdateStateInputs, UpdateStateParams,
};
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{DType, Device, DeviceExt, Error, Result};
use specula_reference::ReferenceDevice;

/// splitmix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `num / den`.
    fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Uniform in `[lo, hi)`.
    fn float(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
}

/// A garbage i32: negative, huge or the extremes.
fn garbage_i32(rng: &mut Rng) -> i32 {
    rng.pick(&[-1, -7, i32::MIN, i32::MAX, 1 << 20, 12_345_678])
}

/// A hostile f32 parameter.
fn hostile_f32(rng: &mut Rng) -> f32 {
    rng.pick(&[
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1),
        -f32::from_bits(0x0040_0000),
        0.0,
        -0.0,
        1e30,
        -1e30,
        f32::MAX,
        2e-30,
        -3.5,
    ])
}

/// One `process_logits` case: every input as host data.
#[derive(Clone, Debug)]
struct Case {
    dims: BatchDims,
    vocab: usize,
    max_model_len: usize,
    rows: usize,
    dtype: DType,
    logits: bool,
    /// The score matrix as f32 values (converted to `dtype` on upload).
    scores: Vec<f32>,
    temperature: Vec<f32>,
    cu_out: Vec<i32>,
    batch_id: Vec<i32>,
    token_ids_all: Vec<i32>,
    prompt_lens: Vec<i32>,
    step_idx: Vec<i32>,
    draft_tokens: Vec<i32>,
    token_counts: Vec<i32>,
    prompt_mask: Vec<u32>,
    penalties: Vec<f32>,
    min_tokens: Vec<i32>,
    end_tokens: Vec<i32>,
    bias_offsets: Vec<i32>,
    bias_ids: Vec<i32>,
    bias_values: Vec<f32>,
    bad_word_offsets: Vec<i32>,
    bad_words: Vec<i32>,
    allowed: Option<Vec<u32>>,
    bitmask: Option<Vec<u32>>,
}

/// The shape of a generated case.
#[derive(Clone, Copy, Debug)]
struct Shape {
    max_bsz: usize,
    real_bsz: usize,
    s: usize,
    vocab: usize,
    max_model_len: usize,
}

/// A token id: mostly from a few small ids (so tokens repeat), sometimes any id, sometimes
/// garbage when `hostile`.
fn token(rng: &mut Rng, vocab: usize, hostile: bool) -> i32 {
    if hostile && rng.chance(1, 12) {
        return rng.pick(&[-1, vocab as i32, vocab as i32 + 5, i32::MIN, i32::MAX]);
    }
    if rng.chance(2, 3) {
        rng.below(vocab.min(6)) as i32
    } else {
        rng.below(vocab) as i32
    }
}

/// A logit: ties from a few values, random values, and (hostile) NaN, ±inf, subnormals, huge.
fn logit(rng: &mut Rng, hostile: bool) -> f32 {
    if hostile && rng.chance(1, 8) {
        return rng.pick(&[
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(3),
            -f32::from_bits(0x0010_0000),
            1e-30,
            -0.0,
            1e30,
            -1e38,
            f32::MAX,
        ]);
    }
    if rng.chance(1, 4) {
        rng.pick(&[0.0, 1.0, -1.0, 2.5, -20.0, 0.5])
    } else {
        rng.float(-8.0, 8.0)
    }
}

/// A probability: small values, and (hostile) NaN, negatives, values above 1, infinities.
fn prob(rng: &mut Rng, hostile: bool) -> f32 {
    if hostile && rng.chance(1, 8) {
        return rng.pick(&[
            f32::NAN,
            -0.25,
            1.5,
            f32::INFINITY,
            f32::from_bits(5),
            -0.0,
            1.0,
        ]);
    }
    if rng.chance(1, 5) {
        rng.pick(&[0.0, 0.125, 0.25])
    } else {
        rng.float(0.0, 0.2)
    }
}

/// The history of slot `b` at row position `pos`, as the definition builds it (for bad words
/// that match it).
fn history(c: &Case, b: usize, pos: usize) -> Vec<i32> {
    let mml = c.max_model_len;
    let prompt = (c.prompt_lens[b].max(0) as usize).min(mml);
    let end = (prompt + c.step_idx[b].max(0) as usize).min(mml);
    let mut h = c.token_ids_all[b * mml + prompt..b * mml + end].to_vec();
    let s = c.dims.max_step_tokens;
    h.extend_from_slice(&c.draft_tokens[b * s + 1..b * s + 1 + pos]);
    h
}

/// A random case of `shape` (`hostile`: garbage everywhere the definition allows it).
fn gen_case(rng: &mut Rng, shape: Shape, dtype: DType, logits: bool, hostile: bool) -> Case {
    let Shape {
        max_bsz,
        real_bsz,
        s,
        vocab,
        max_model_len: mml,
    } = shape;
    let words = mask_words(vocab);
    // Layout: each live slot has 0 ..= S rows.
    let mut cu_out = vec![0i32; real_bsz + 1];
    let mut batch_id = Vec::new();
    for b in 0..real_bsz {
        let n = rng.below(s + 1);
        cu_out[b + 1] = cu_out[b] + n as i32;
        batch_id.extend(std::iter::repeat_n(b as i32, n));
    }
    let cap = (real_bsz * s).max(1);
    batch_id.resize(cap, -1);
    if hostile {
        for id in batch_id.iter_mut() {
            if rng.chance(1, 10) {
                *id = rng.pick(&[-1, -3, real_bsz as i32, max_bsz as i32, i32::MAX, 0]);
            }
        }
        for c in cu_out.iter_mut() {
            if rng.chance(1, 8) {
                *c = rng.pick(&[-2, -1, i32::MIN, i32::MAX, 1]);
            }
        }
    }
    let rows = cap - rng.below(2).min(cap - 1);
    let mut prompt_lens: Vec<i32> = (0..max_bsz)
        .map(|_| rng.below(mml / 2 + 1) as i32)
        .collect();
    let mut step_idx: Vec<i32> = (0..max_bsz)
        .map(|_| rng.below(mml / 2 + 1) as i32)
        .collect();
    if hostile {
        for b in 0..max_bsz {
            if rng.chance(1, 6) {
                prompt_lens[b] = rng.pick(&[-5, mml as i32 + 3, i32::MAX, i32::MIN]);
            }
            if rng.chance(1, 6) {
                step_idx[b] = rng.pick(&[-5, mml as i32 + 3, i32::MAX, i32::MIN]);
            }
        }
    }
    let token_ids_all: Vec<i32> = (0..max_bsz * mml)
        .map(|_| token(rng, vocab, hostile))
        .collect();
    let draft_tokens: Vec<i32> = (0..max_bsz * s)
        .map(|_| token(rng, vocab, hostile))
        .collect();
    let token_counts: Vec<i32> = (0..max_bsz * vocab)
        .map(|_| {
            if hostile && rng.chance(1, 10) {
                rng.pick(&[
                    -1,
                    i32::MIN,
                    i32::MAX,
                    (1 << 24) - 1,
                    1 << 24,
                    (1 << 24) + 3,
                ])
            } else if rng.chance(1, 4) {
                1 + rng.below(4) as i32
            } else {
                0
            }
        })
        .collect();
    let prompt_mask: Vec<u32> = (0..max_bsz * words)
        .map(|_| (rng.next() & rng.next()) as u32)
        .collect();
    let mut penalties = Vec::new();
    for _ in 0..max_bsz {
        let alpha = rng.pick(&[1.0f32, 1.3, 0.7, 2.0, 1.1]);
        let mut row = [
            alpha,
            1.0 / alpha,
            rng.pick(&[0.0, 0.5, -0.25, 0.1]),
            rng.pick(&[0.0, 0.3, -1.0]),
            rng.pick(&[0.0, 0.05, 0.3, 0.9, 1.0]),
        ];
        if hostile {
            for v in row.iter_mut() {
                if rng.chance(1, 5) {
                    *v = hostile_f32(rng);
                }
            }
            if rng.chance(1, 6) {
                row[0] = rng.pick(&[
                    f32::from_bits(0x2f80_0000),
                    f32::from_bits(0x4f80_0000),
                    4.3e9,
                ]);
                row[1] = rng.pick(&[
                    f32::from_bits(0x2f80_0000),
                    f32::from_bits(0x4f80_0000),
                    2e-10,
                ]);
            }
        }
        penalties.extend_from_slice(&row);
    }
    let min_tokens: Vec<i32> = (0..max_bsz)
        .map(|_| {
            if hostile && rng.chance(1, 6) {
                garbage_i32(rng)
            } else {
                rng.below(mml / 2 + s + 2) as i32
            }
        })
        .collect();
    let end_tokens: Vec<i32> = (0..1 + rng.below(3))
        .map(|_| token(rng, vocab, hostile))
        .collect();
    // Bias lists: duplicates, out-of-range ids (hostile), hostile values.
    let mut bias_offsets = vec![0i32];
    let mut bias_ids = Vec::new();
    let mut bias_values = Vec::new();
    for _ in 0..max_bsz {
        for _ in 0..rng.below(5) {
            bias_ids.push(token(rng, vocab, hostile));
            bias_values.push(if hostile && rng.chance(1, 5) {
                hostile_f32(rng)
            } else {
                rng.pick(&[-100.0, 5.0, -1.5, 0.25, 3.0])
            });
        }
        bias_offsets.push(bias_ids.len() as i32);
    }
    if bias_ids.is_empty() {
        bias_ids.push(0);
        bias_values.push(1.0);
    }
    if hostile {
        for o in bias_offsets.iter_mut() {
            if rng.chance(1, 8) {
                *o = garbage_i32(rng);
            }
        }
    }
    let allowed = rng.chance(1, 2).then(|| {
        (0..max_bsz * words)
            .map(|_| {
                if rng.chance(1, 10) {
                    0
                } else {
                    !((rng.next() & rng.next() & rng.next()) as u32)
                }
            })
            .collect()
    });
    let bitmask = rng.chance(1, 2).then(|| {
        (0..rows * words)
            .map(|_| {
                if rng.chance(1, 10) {
                    0
                } else {
                    !((rng.next() & rng.next() & rng.next()) as u32)
                }
            })
            .collect()
    });
    let mut scores = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        let all_neg_inf = logits && rng.chance(1, 10);
        for _ in 0..vocab {
            scores.push(if all_neg_inf {
                f32::NEG_INFINITY
            } else if logits {
                logit(rng, hostile)
            } else {
                prob(rng, hostile)
            });
        }
    }
    let temperature: Vec<f32> = (0..rows)
        .map(|_| {
            if hostile && rng.chance(1, 4) {
                rng.pick(&[0.0, f32::INFINITY, f32::NAN, -1.0, 1e-30, -0.0])
            } else {
                rng.pick(&[1.0, 0.7, 2.5, 1.0, 0.0])
            }
        })
        .collect();
    let mut case = Case {
        dims: BatchDims {
            max_bsz,
            real_bsz,
            max_step_tokens: s,
        },
        vocab,
        max_model_len: mml,
        rows,
        dtype,
        logits,
        scores,
        temperature,
        cu_out,
        batch_id,
        token_ids_all,
        prompt_lens,
        step_idx,
        draft_tokens,
        token_counts,
        prompt_mask,
        penalties,
        min_tokens,
        end_tokens,
        bias_offsets,
        bias_ids,
        bias_values,
        bad_word_offsets: Vec::new(),
        bad_words: Vec::new(),
        allowed,
        bitmask,
    };
    // Bad words: single tokens, entries whose prefix is the end of some row's history (crossing
    // the draft boundary when the row has drafts before it), random entries; hostile lists end
    // with malformed entries and have garbage offsets.
    let mut offsets = vec![0i32];
    let mut list = Vec::new();
    for b in 0..max_bsz {
        for _ in 0..rng.below(4) {
            match rng.below(3) {
                0 => list.extend([1, token(rng, vocab, hostile)]),
                1 => {
                    let pos = rng.below(s);
                    let h = if b < real_bsz
                        && case.prompt_lens[b] >= 0
                        && case.step_idx[b] >= 0
                        && (case.prompt_lens[b] as usize) < mml
                    {
                        history(&case, b, pos)
                    } else {
                        Vec::new()
                    };
                    let n = 1 + rng.below(3).min(h.len());
                    list.push(n as i32);
                    list.extend_from_slice(&h[h.len() - (n - 1)..]);
                    list.push(token(rng, vocab, hostile));
                }
                _ => {
                    let n = 1 + rng.below(3);
                    list.push(n as i32);
                    for _ in 0..n {
                        list.push(token(rng, vocab, hostile));
                    }
                }
            }
        }
        if hostile && rng.chance(1, 4) {
            list.extend(rng.pick(&[[0, 1, 2], [-3, 1, 1], [9, 1, 1], [2, 1, 1]]));
        }
        offsets.push(list.len() as i32);
    }
    if list.is_empty() {
        list.push(1);
    }
    if hostile {
        for o in offsets.iter_mut() {
            if rng.chance(1, 8) {
                *o = garbage_i32(rng);
            }
        }
    }
    case.bad_word_offsets = offsets;
    case.bad_words = list;
    case
}

/// Uploads a float matrix given as f32 values in `dtype` (f16 and bf16 rounded to nearest).
fn upload_scores(
    device: &dyn Device,
    values: &[f32],
    dtype: DType,
) -> Result<specula_backend_api::Buffer> {
    match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16_bits(v).to_le_bytes())
                .collect();
            device.upload_bytes(dtype, &bytes)
        }
        DType::BF16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| bf16_bits(v).to_le_bytes())
                .collect();
            device.upload_bytes(dtype, &bytes)
        }
        _ => device.upload(values),
    }
}

/// bf16 bits of `v` (round to nearest even; NaN kept a NaN).
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// f16 bits of `v` (round to nearest even, subnormals included; NaN kept a NaN).
fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    if v.is_nan() {
        return sign | 0x7e00;
    }
    let a = v.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < f32::from_bits(0x3300_0000) {
        // Below half the least subnormal (2^-25): 0 (exactly half rounds to even 0 too).
        return sign;
    }
    // Scale to units of the least subnormal (2^-24) or round the mantissa.
    let e = ((b >> 23) & 0xff) as i32 - 127;
    if e < -14 {
        let units = a * f32::from_bits(0x4b80_0000); // a · 2^24, exact
        let r = units.round_ties_even() as u16;
        return sign | r;
    }
    let mant = b & 0x7f_ffff;
    let mut h = (((e + 15) as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// `processed` (bits) and `fallback` of `case` on `device`.
fn run_process(device: &dyn Device, c: &Case) -> Result<(Vec<u32>, Vec<i32>)> {
    let scores = upload_scores(device, &c.scores, c.dtype)?;
    let temperature = device.upload(&c.temperature)?;
    let cu_out = device.upload(&c.cu_out)?;
    let batch_id = device.upload(&c.batch_id)?;
    let token_ids_all = device.upload(&c.token_ids_all)?;
    let prompt_lens = device.upload(&c.prompt_lens)?;
    let step_idx = device.upload(&c.step_idx)?;
    let draft_tokens = device.upload(&c.draft_tokens)?;
    let token_counts = device.upload(&c.token_counts)?;
    let prompt_mask = device.upload(&c.prompt_mask)?;
    let penalties = device.upload(&c.penalties)?;
    let min_tokens = device.upload(&c.min_tokens)?;
    let end_tokens = device.upload(&c.end_tokens)?;
    let bias_offsets = device.upload(&c.bias_offsets)?;
    let bias_ids = device.upload(&c.bias_ids)?;
    let bias_values = device.upload(&c.bias_values)?;
    let bad_word_offsets = device.upload(&c.bad_word_offsets)?;
    let bad_words = device.upload(&c.bad_words)?;
    let allowed = c.allowed.as_deref().map(|a| device.upload(a)).transpose()?;
    let bitmask = c.bitmask.as_deref().map(|m| device.upload(m)).transpose()?;
    let mut processed = device.alloc::<f32>(c.rows * c.vocab)?;
    let mut fallback = device.alloc::<i32>(c.rows)?;
    let scores = if c.logits {
        Scores::logits(&scores, &temperature)
    } else {
        Scores::probs(&scores)
    };
    device.process_logits(
        &ProcessInputs {
            scores,
            layout: OutputLayout {
                cu_seqlens_q_output: &cu_out,
                batch_id_per_token_output: &batch_id,
            },
            history: TokenHistory {
                token_ids_all: &token_ids_all,
                prompt_lens: &prompt_lens,
                step_idx: &step_idx,
                draft_tokens: &draft_tokens,
                token_counts: &token_counts,
                prompt_mask: &prompt_mask,
            },
            slots: SlotProcessing {
                penalties: &penalties,
                min_tokens: &min_tokens,
                end_tokens: &end_tokens,
                bias_offsets: &bias_offsets,
                bias_ids: &bias_ids,
                bias_values: &bias_values,
                bad_word_offsets: &bad_word_offsets,
                bad_words: &bad_words,
                allowed: allowed.as_ref(),
            },
            bitmask: bitmask.as_ref(),
        },
        &mut ProcessOutputs {
            processed: &mut processed,
            fallback: &mut fallback,
        },
        &ProcessParams {
            dims: c.dims,
            shape: RowShape {
                rows: c.rows,
                vocab: c.vocab,
            },
            max_model_len: c.max_model_len,
            host: None,
        },
    )?;
    device.synchronize()?;
    let processed: Vec<f32> = device.download(&processed)?;
    Ok((
        processed.iter().map(|x| x.to_bits()).collect(),
        device.download(&fallback)?,
    ))
}

/// Compares `case` on the adapter with the reference; `what` names it in the message.
fn compare_process(wgpu: &dyn Device, c: &Case, what: &str) -> std::result::Result<(), String> {
    let reference = ReferenceDevice::new();
    let want = run_process(&reference, c).map_err(|e| format!("{what}: reference: {e}"))?;
    let got = run_process(wgpu, c).map_err(|e| format!("{what}: wgpu: {e}"))?;
    if got.1 != want.1 {
        let r = (0..c.rows).find(|&r| got.1[r] != want.1[r]).unwrap_or(0);
        return Err(format!(
            "{what}: fallback of row {r}: {} expected {} ({c:?})",
            got.1[r], want.1[r]
        ));
    }
    if let Some(i) = (0..got.0.len()).find(|&i| got.0[i] != want.0[i]) {
        let (r, v) = (i / c.vocab, i % c.vocab);
        return Err(format!(
            "{what}: processed[{r}, {v}] = {} ({:#x}), expected {} ({:#x}); input {} ({c:?})",
            f32::from_bits(got.0[i]),
            got.0[i],
            f32::from_bits(want.0[i]),
            want.0[i],
            c.scores[i]
        ));
    }
    Ok(())
}

/// The shapes of the random cases: V not a multiple of 32, V = 1, vocabularies wider than a
/// workgroup (300, 1031), one slot, several.
const SHAPES: [Shape; 7] = [
    Shape {
        max_bsz: 3,
        real_bsz: 2,
        s: 4,
        vocab: 37,
        max_model_len: 16,
    },
    Shape {
        max_bsz: 2,
        real_bsz: 2,
        s: 3,
        vocab: 1,
        max_model_len: 8,
    },
    Shape {
        max_bsz: 4,
        real_bsz: 3,
        s: 5,
        vocab: 300,
        max_model_len: 24,
    },
    Shape {
        max_bsz: 1,
        real_bsz: 1,
        s: 1,
        vocab: 64,
        max_model_len: 6,
    },
    Shape {
        max_bsz: 5,
        real_bsz: 4,
        s: 3,
        vocab: 7,
        max_model_len: 12,
    },
    Shape {
        max_bsz: 2,
        real_bsz: 1,
        s: 6,
        vocab: 33,
        max_model_len: 10,
    },
    Shape {
        max_bsz: 3,
        real_bsz: 3,
        s: 4,
        vocab: 1031,
        max_model_len: 20,
    },
];

fn process_logits_matches_the_reference(wgpu: Arc<dyn Device>) -> std::result::Result<(), String> {
    let mut rng = Rng(0x5eed_0001);
    for round in 0..8 {
        for (i, &shape) in SHAPES.iter().enumerate() {
            for dtype in DType::FLOATS {
                for logits in [true, false] {
                    for hostile in [false, true] {
                        let c = gen_case(&mut rng, shape, dtype, logits, hostile);
                        let what = format!(
                            "round {round} shape {i} {dtype:?} logits {logits} hostile {hostile}"
                        );
                        compare_process(wgpu.as_ref(), &c, &what)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// A row of `vocab` values where some rows weigh nothing (all -inf logits, all-zero probs).
fn weightless_rows(rng: &mut Rng, rows: usize, vocab: usize, logits: bool) -> Vec<f32> {
    let mut out = Vec::new();
    for r in 0..rows {
        for _ in 0..vocab {
            out.push(if r % 3 == 0 {
                if logits {
                    rng.pick(&[f32::NEG_INFINITY, f32::NAN])
                } else {
                    rng.pick(&[0.0, -0.5, f32::NAN])
                }
            } else if logits {
                logit(rng, true)
            } else {
                prob(rng, true)
            });
        }
    }
    out
}

/// Sampled tokens and candidates (ids, score bits, lens) of `scores` with `fallback`.
type SampleOut = (Vec<i32>, Vec<i32>, Vec<u32>, Vec<i32>);

fn run_sampling(
    device: &dyn Device,
    values: &[f32],
    dtype: DType,
    logits: bool,
    shape: RowShape,
    fallback: &[i32],
) -> Result<SampleOut> {
    let rows = shape.rows;
    let m = upload_scores(device, values, dtype)?;
    let t: Vec<f32> = (0..rows).map(|r| [1.0, 0.5, 0.0, 2.0][r % 4]).collect();
    let t = device.upload(&t)?;
    let top_k: Vec<i32> = (0..rows).map(|r| [0, 1, 3][r % 3]).collect();
    let top_p: Vec<f32> = (0..rows)
        .map(|r| [1.0, 0.7, 0.3, 0.95, 0.5][r % 5])
        .collect();
    let seed: Vec<u64> = (0..rows as u64).map(|r| r * 0x9e37_79b9 + 11).collect();
    let (k, p, s, f) = (
        device.upload(&top_k)?,
        device.upload(&top_p)?,
        device.upload(&seed)?,
        device.upload(fallback)?,
    );
    let scores = if logits {
        Scores::logits(&m, &t)
    } else {
        Scores::probs(&m)
    };
    let mut tokens = device.alloc::<i32>(rows)?;
    device.top_k_top_p_sample(
        &SampleInputs {
            scores,
            top_k: &k,
            top_p: &p,
            seed: &s,
            fallback: Some(&f),
        },
        &mut tokens,
        &SampleParams {
            shape,
            host_top_p: None,
        },
    )?;
    let c = 4;
    let mut ids = device.alloc::<i32>(rows * c)?;
    let mut sc = device.alloc::<f32>(rows * c)?;
    let mut lens = device.alloc::<i32>(rows)?;
    device.top_p_candidates(
        &CandidatesInputs {
            scores,
            top_p: &p,
            batch_id_per_token_output: None,
            fallback: Some(&f),
        },
        &mut CandidatesOutputs {
            ids: &mut ids,
            scores: &mut sc,
            lens: &mut lens,
        },
        &CandidatesParams {
            shape,
            candidates: c,
            host_top_p: None,
        },
    )?;
    device.synchronize()?;
    let sc: Vec<f32> = device.download(&sc)?;
    Ok((
        device.download(&tokens)?,
        device.download(&ids)?,
        sc.iter().map(|x| x.to_bits()).collect(),
        device.download(&lens)?,
    ))
}

fn sampling_ops_yield_the_fallback(wgpu: Arc<dyn Device>) -> std::result::Result<(), String> {
    let mut rng = Rng(0x5eed_0002);
    let reference = ReferenceDevice::new();
    for vocab in [1usize, 5, 40, 300] {
        for dtype in DType::FLOATS {
            for logits in [true, false] {
                let rows = 12;
                let values = weightless_rows(&mut rng, rows, vocab, logits);
                let fallback: Vec<i32> = (0..rows)
                    .map(|r| [-1, 0, (vocab - 1) as i32, 2.min(vocab as i32 - 1)][r % 4])
                    .collect();
                let shape = RowShape { rows, vocab };
                let what = format!("vocab {vocab} {dtype:?} logits {logits}");
                let want = run_sampling(&reference, &values, dtype, logits, shape, &fallback)
                    .map_err(|e| format!("{what}: reference: {e}"))?;
                let got = run_sampling(wgpu.as_ref(), &values, dtype, logits, shape, &fallback)
                    .map_err(|e| format!("{what}: wgpu: {e}"))?;
                if got != want {
                    return Err(format!("{what}: got {got:?}, expected {want:?}"));
                }
            }
        }
    }
    Ok(())
}

/// `process_logits` then the sampling ops with its `fallback`, on processed rows of random cases
/// (masked rows, min_p-dropped tokens): the adapter's samples and candidates equal the reference's.
fn processed_rows_sample_like_the_reference(
    wgpu: Arc<dyn Device>,
) -> std::result::Result<(), String> {
    let mut rng = Rng(0x5eed_0004);
    let reference = ReferenceDevice::new();
    for round in 0..6 {
        for (i, &shape) in SHAPES.iter().enumerate() {
            for logits in [true, false] {
                let c = gen_case(&mut rng, shape, DType::F32, logits, round % 2 == 1);
                let what = format!("round {round} shape {i} logits {logits}");
                let (processed, fallback) =
                    run_process(wgpu.as_ref(), &c).map_err(|e| format!("{what}: wgpu: {e}"))?;
                let values: Vec<f32> = processed.iter().map(|&b| f32::from_bits(b)).collect();
                let shape = RowShape {
                    rows: c.rows,
                    vocab: c.vocab,
                };
                let want = run_sampling(&reference, &values, DType::F32, logits, shape, &fallback)
                    .map_err(|e| format!("{what}: reference: {e}"))?;
                let got =
                    run_sampling(wgpu.as_ref(), &values, DType::F32, logits, shape, &fallback)
                        .map_err(|e| format!("{what}: wgpu: {e}"))?;
                if got != want {
                    return Err(format!("{what}: got {got:?}, expected {want:?}"));
                }
            }
        }
    }
    Ok(())
}

/// Every output of `update_state` with token counts.
type StateOut = (
    Vec<i32>,
    Vec<u8>,
    Vec<i32>,
    Vec<i32>,
    Vec<u64>,
    Vec<i32>,
    Vec<i32>,
    Vec<i32>,
    Vec<i32>,
);

/// The host inputs of one `update_state` case.
struct StateCase {
    dims: BatchDims,
    mml: usize,
    vocab: usize,
    accept_tokens: Vec<i32>,
    is_block: Vec<u8>,
    prompt_lens: Vec<i32>,
    max_dec_len: Vec<i32>,
    end_tokens: Vec<i32>,
    accept_num: Vec<i32>,
    stop_flags: Vec<u8>,
    token_ids_all: Vec<i32>,
    step_idx: Vec<i32>,
    infer_seed: Vec<u64>,
    draft_tokens: Vec<i32>,
    encoder: Vec<i32>,
    decoder: Vec<i32>,
    token_counts: Vec<i32>,
}

fn run_state(device: &dyn Device, c: &StateCase) -> Result<StateOut> {
    let accept_tokens = device.upload(&c.accept_tokens)?;
    let is_block = device.upload(&c.is_block)?;
    let prompt_lens = device.upload(&c.prompt_lens)?;
    let max_dec_len = device.upload(&c.max_dec_len)?;
    let end_tokens = device.upload(&c.end_tokens)?;
    let mut accept_num = device.upload(&c.accept_num)?;
    let mut stop_flags = device.upload(&c.stop_flags)?;
    let mut token_ids_all = device.upload(&c.token_ids_all)?;
    let mut step_idx = device.upload(&c.step_idx)?;
    let mut infer_seed = device.upload(&c.infer_seed)?;
    let mut draft_tokens = device.upload(&c.draft_tokens)?;
    let mut encoder = device.upload(&c.encoder)?;
    let mut decoder = device.upload(&c.decoder)?;
    let mut counts = device.upload(&c.token_counts)?;
    device.update_state(
        &UpdateStateInputs {
            accept_tokens: &accept_tokens,
            is_block_step: &is_block,
            prompt_lens: &prompt_lens,
            max_dec_len: &max_dec_len,
            end_tokens: &end_tokens,
        },
        &mut DecodeState {
            accept_num: &mut accept_num,
            stop_flags: &mut stop_flags,
            token_ids_all: &mut token_ids_all,
            step_idx: &mut step_idx,
            infer_seed: &mut infer_seed,
            draft_tokens: &mut draft_tokens,
            seq_lens_encoder: &mut encoder,
            seq_lens_decoder: &mut decoder,
            token_counts: Some(&mut counts),
        },
        &UpdateStateParams {
            dims: c.dims,
            max_model_len: c.mml,
            vocab: c.vocab,
        },
    )?;
    device.synchronize()?;
    Ok((
        device.download(&accept_num)?,
        device.download(&stop_flags)?,
        device.download(&token_ids_all)?,
        device.download(&step_idx)?,
        device.download(&infer_seed)?,
        device.download(&draft_tokens)?,
        device.download(&encoder)?,
        device.download(&decoder)?,
        device.download(&counts)?,
    ))
}

fn update_state_counts_the_appended_tokens(
    wgpu: Arc<dyn Device>,
) -> std::result::Result<(), String> {
    let mut rng = Rng(0x5eed_0003);
    let reference = ReferenceDevice::new();
    for round in 0..40 {
        let (max_bsz, s, mml, vocab) = (6, 4, 12, rng.pick(&[1usize, 5, 33]));
        let real_bsz = 1 + rng.below(max_bsz);
        let n = max_bsz;
        let c = StateCase {
            dims: BatchDims {
                max_bsz,
                real_bsz,
                max_step_tokens: s,
            },
            mml,
            vocab,
            accept_tokens: (0..n * s).map(|_| token(&mut rng, vocab, true)).collect(),
            is_block: (0..n).map(|_| u8::from(rng.chance(1, 8))).collect(),
            prompt_lens: (0..n).map(|_| rng.pick(&[0, 2, 5, 11, 12, -1])).collect(),
            max_dec_len: (0..n).map(|_| rng.pick(&[3, 100, 0])).collect(),
            end_tokens: vec![rng.below(vocab) as i32],
            accept_num: (0..n).map(|_| rng.pick(&[0, 1, 2, 4, 7, -1])).collect(),
            stop_flags: (0..n).map(|_| u8::from(rng.chance(1, 8))).collect(),
            token_ids_all: (0..n * mml)
                .map(|_| token(&mut rng, vocab, false))
                .collect(),
            step_idx: (0..n).map(|_| rng.pick(&[0, 1, 3, 6, -2])).collect(),
            infer_seed: (0..n).map(|_| rng.next() % 1_000_000).collect(),
            draft_tokens: (0..n * s).map(|_| token(&mut rng, vocab, false)).collect(),
            encoder: (0..n).map(|_| rng.pick(&[0, 0, 3])).collect(),
            decoder: (0..n).map(|_| rng.pick(&[0, 5, 9])).collect(),
            token_counts: (0..n * vocab)
                .map(|_| rng.pick(&[0, 0, 1, 3, -4, i32::MAX, i32::MAX - 1, i32::MIN]))
                .collect(),
        };
        let want =
            run_state(&reference, &c).map_err(|e| format!("round {round}: reference: {e}"))?;
        let got = run_state(wgpu.as_ref(), &c).map_err(|e| format!("round {round}: wgpu: {e}"))?;
        if got != want {
            return Err(format!("round {round}: got {got:?}, expected {want:?}"));
        }
    }
    Ok(())
}

/// A [`Case`] of fixed hand-made rows: a slot with every rule on (bias on a draft token, a
/// two-token bad word crossing the draft boundary, min_tokens, min_p), an all-masked row, and a
/// row whose unmasked tokens are all -inf.
fn hand_case() -> Case {
    let vocab = 10;
    let s = 3;
    let mml = 8;
    let words = mask_words(vocab);
    let mut allowed = vec![u32::MAX; 2 * words];
    allowed[words] = 0b11; // slot 1 allows tokens 0 and 1 only
    let mut scores = vec![0.0f32; 4 * vocab];
    for (v, x) in scores.iter_mut().enumerate().take(3 * vocab) {
        *x = (v % vocab) as f32 * 0.5 - 2.0;
    }
    scores[2 * vocab..3 * vocab]
        .iter_mut()
        .for_each(|x| *x = -1.0);
    scores[3 * vocab] = f32::NEG_INFINITY;
    scores[3 * vocab + 1] = f32::NEG_INFINITY;
    Case {
        dims: BatchDims {
            max_bsz: 2,
            real_bsz: 2,
            max_step_tokens: s,
        },
        vocab,
        max_model_len: mml,
        rows: 4,
        dtype: DType::F32,
        logits: true,
        scores,
        temperature: vec![1.0, 0.8, 1.0, 1.0],
        // slot 0: rows 0..3; slot 1: row 3.
        cu_out: vec![0, 3, 4],
        batch_id: vec![0, 0, 0, 1, -1, -1],
        // slot 0: prompt [1, 2], generated [3, 4]; slot 1: prompt [5].
        token_ids_all: vec![1, 2, 3, 4, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0],
        prompt_lens: vec![2, 1],
        step_idx: vec![2, 0],
        draft_tokens: vec![4, 7, 7, 0, 0, 0],
        token_counts: {
            let mut t = vec![0; 2 * vocab];
            t[3] = 1;
            t[4] = 1;
            t
        },
        prompt_mask: vec![0b110, 0b10_0000],
        penalties: vec![1.2, 1.0 / 1.2, 0.5, 0.25, 0.2, 1.0, 1.0, 0.0, 0.0, 0.0],
        min_tokens: vec![4, 0],
        end_tokens: vec![9],
        bias_offsets: vec![0, 2, 2],
        bias_ids: vec![7, 8],
        bias_values: vec![1.5, -0.5],
        bad_word_offsets: vec![0, 4, 4],
        // slot 0: ban 8 after [4, 7] (the last generated token, then the first draft).
        bad_words: vec![3, 4, 7, 8],
        allowed: Some(allowed),
        bitmask: Some({
            let mut m = vec![u32::MAX; 4 * words];
            m[2 * words] = 0; // row 2 all masked
            m
        }),
    }
}

fn hand_made_rows_match_the_reference(wgpu: Arc<dyn Device>) -> std::result::Result<(), String> {
    let c = hand_case();
    compare_process(wgpu.as_ref(), &c, "hand case")?;
    let reference = ReferenceDevice::new();
    let (processed, fallback) = run_process(&reference, &c).map_err(|e| e.to_string())?;
    // Row 2 is all masked; row 3's unmasked tokens (0 and 1) are all -inf.
    if fallback[2] != -1 || fallback[3] != 0 {
        return Err(format!("reference fallback {fallback:?}"));
    }
    // Row 1 (history 3, 4, 7) bans 8; row 0 (history 3, 4) does not.
    let neg_inf = f32::NEG_INFINITY.to_bits();
    if processed[c.vocab + 8] != neg_inf || processed[8] == neg_inf {
        return Err(format!("bad word rows: {processed:?}"));
    }
    Ok(())
}

/// A test body.
type Body = fn(Arc<dyn Device>) -> std::result::Result<(), String>;

fn main() -> ExitCode {
    let opened = specula_backend_wgpu::open(0);
    let availability = match &opened {
        Err(Error::Unavailable { reason, .. }) => Err(reason.clone()),
        Ok(d) if !d.desc().capabilities.processing => {
            Err("the adapter binds too few storage buffers for logits processing".to_owned())
        }
        _ => Ok(()),
    };
    let needs = Needs::new("wgpu", availability);
    let device = opened.map_err(|e| format!("opening wgpu: {e}"));
    let tests: [(&str, Body); 5] = [
        (
            "process_logits_matches_the_reference",
            process_logits_matches_the_reference,
        ),
        (
            "hand_made_rows_match_the_reference",
            hand_made_rows_match_the_reference,
        ),
        (
            "processed_rows_sample_like_the_reference",
            processed_rows_sample_like_the_reference,
        ),
        (
            "sampling_ops_yield_the_fallback",
            sampling_ops_yield_the_fallback,
        ),
        (
            "update_state_counts_the_appended_tokens",
            update_state_counts_the_appended_tokens,
        ),
    ];
    let tests: Vec<(&str, TestFn)> = tests
        .into_iter()
        .map(|(name, body)| {
            let device = device.clone();
            let test: TestFn = Box::new(move || body(device?));
            (name, test)
        })
        .collect();
    testing::run(&needs, tests)
}
