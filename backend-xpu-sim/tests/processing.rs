//! `process_logits`, the `fallback` input of the sampling ops and the token counts of
//! `update_state`, compared bit for bit with `specula_reference::ReferenceDevice` on random and
//! hostile inputs (garbage layouts, offsets, bad-word entries, ids, NaN / inf / subnormal
//! parameters and scores). Without an OpenCL device every test is reported as ignored with the
//! reason, and fails under `SPECULA_REQUIRE=xpu-sim`.

use std::process::ExitCode;

use specula_backend_api::ops::{
    BatchDims, CandidatesInputs, CandidatesOutputs, CandidatesParams, DecodeState, Logits,
    OutputLayout, ProcessInputs, ProcessOutputs, ProcessParams, RowShape, SampleInputs,
    SampleParams, Scores, SlotProcessing, TokenHistory, UpdateStateInputs, UpdateStateParams,
};
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Error};
use specula_backend_xpu_sim::{LaunchConfig, XpuSimDevice};
use specula_reference::ReferenceDevice;

type TestResult = Result<(), String>;

fn main() -> ExitCode {
    let needs = Needs::new("xpu-sim", availability());
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "process_logits_matches_the_reference",
            Box::new(process_logits_matches_the_reference),
        ),
        (
            "process_logits_launch_shapes_agree",
            Box::new(process_logits_launch_shapes_agree),
        ),
        (
            "sampling_fallback_matches_the_reference",
            Box::new(sampling_fallback_matches_the_reference),
        ),
        (
            "token_counts_match_the_reference",
            Box::new(token_counts_match_the_reference),
        ),
    ];
    testing::run(&needs, tests)
}

/// `Err(reason)` when there is no OpenCL device.
fn availability() -> Result<(), String> {
    match XpuSimDevice::with_launch(0, LaunchConfig::default()) {
        Err(Error::Unavailable { reason, .. }) => Err(reason),
        Ok(_) | Err(_) => Ok(()),
    }
}

fn fail(context: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{context}: {e}")
}

fn open(launch: LaunchConfig) -> Result<XpuSimDevice, String> {
    XpuSimDevice::with_launch(0, launch).map_err(fail("open"))
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Hostile float values: NaN, infinities, subnormals, huge and tiny magnitudes, signed zeros.
const HOSTILE: [f32; 14] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1e-40,
    -1e-40,
    1e30,
    -1e30,
    3.0e38,
    1e-30,
    0.0,
    -0.0,
    -1.0,
    f32::from_bits(0x2f80_0000),
    f32::from_bits(0x4f80_0000),
];

/// One `process_logits` call, as host data.
struct Case {
    name: String,
    dtype: DType,
    logits: bool,
    vocab: usize,
    dims: BatchDims,
    rows: usize,
    max_model_len: usize,
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

/// A token: mostly from a small alphabet (so histories, drafts and bad words meet), sometimes any
/// id of the vocabulary, and, when hostile, ids outside it.
fn token(rng: &mut Rng, vocab: usize, hostile: bool) -> i32 {
    if hostile && rng.chance(10) {
        return rng.pick(&[-1, vocab as i32, vocab as i32 + 7, i32::MIN, i32::MAX]);
    }
    if rng.chance(80) {
        rng.below(vocab.min(4)) as i32
    } else {
        rng.below(vocab) as i32
    }
}

/// Offsets of per-slot lists with `lens[b]` entries each; garbage when hostile.
fn offsets(rng: &mut Rng, lens: &[usize], total: usize, hostile: bool) -> Vec<i32> {
    let mut out = vec![0i32];
    for &n in lens {
        out.push(out[out.len() - 1] + n as i32);
    }
    if hostile {
        for o in out.iter_mut() {
            if rng.chance(25) {
                *o = rng.range(-3, total as i64 + 3) as i32;
            }
        }
    }
    out
}

/// A mask word with mostly set bits (or none, now and then).
fn mask_word(rng: &mut Rng) -> u32 {
    if rng.chance(5) {
        0
    } else {
        (rng.next() | rng.next() | rng.next()) as u32
    }
}

fn generate(seed: u64, vocab: usize, dtype: DType, logits: bool, hostile: bool) -> Case {
    let rng = &mut Rng(seed);
    let max_bsz = 1 + rng.below(4);
    let real_bsz = if rng.chance(10) {
        0
    } else {
        1 + rng.below(max_bsz)
    };
    let s = 1 + rng.below(4);
    let max_model_len = 4 + rng.below(12);
    let words = vocab.div_ceil(32);

    // Layout: each slot's rows, then padding rows.
    let mut cu_out = vec![0i32];
    let mut batch_id = Vec::new();
    for b in 0..real_bsz {
        let n = 1 + rng.below(s);
        batch_id.extend(std::iter::repeat_n(b as i32, n));
        cu_out.push(cu_out[b] + n as i32);
    }
    let rows = batch_id.len() + rng.below(3);
    batch_id.resize(rows.max(real_bsz * s), -1);
    if hostile {
        for id in batch_id.iter_mut() {
            if rng.chance(15) {
                *id = rng.range(-3, max_bsz as i64 + 3) as i32;
            }
        }
        for c in cu_out.iter_mut() {
            if rng.chance(15) {
                *c = rng.pick(&[-3, 1, rows as i32 + 2, i32::MIN, i32::MAX]);
            }
        }
    }

    let token_ids_all = (0..max_bsz * max_model_len)
        .map(|_| token(rng, vocab, hostile))
        .collect();
    let prompt_lens = (0..max_bsz)
        .map(|_| {
            if hostile && rng.chance(25) {
                rng.pick(&[-3, max_model_len as i32 + 2, i32::MIN, i32::MAX])
            } else {
                rng.below(max_model_len / 2 + 1) as i32
            }
        })
        .collect();
    let step_idx = (0..max_bsz)
        .map(|_| {
            if hostile && rng.chance(25) {
                rng.pick(&[-5, max_model_len as i32 + 5, i32::MAX, i32::MIN])
            } else {
                rng.below(max_model_len) as i32
            }
        })
        .collect();
    let draft_tokens = (0..max_bsz * s)
        .map(|_| token(rng, vocab, hostile))
        .collect();
    let token_counts = (0..max_bsz * vocab)
        .map(|_| match rng.below(10) {
            0..=6 => 0,
            7 | 8 => 1 + rng.below(5) as i32,
            _ if hostile => rng.pick(&[-5, i32::MAX, 1 << 24, (1 << 24) - 1, i32::MIN]),
            _ => rng.below(100) as i32,
        })
        .collect();
    let prompt_mask = (0..max_bsz * words)
        .map(|_| (rng.next() & rng.next()) as u32)
        .collect();

    let mut penalties = Vec::new();
    for _ in 0..max_bsz {
        let alpha = rng.pick(&[1.0f32, 1.3, 0.7, 2.0, 1.0]);
        let mut row = [
            alpha,
            1.0 / alpha,
            rng.pick(&[0.0, 0.5, -0.25, 1e-3, 0.0]),
            rng.pick(&[0.0, 0.7, -1.0, 0.0]),
            rng.pick(&[0.0, 0.0, 0.05, 0.3, 1.0, 1e-8, 0.9]),
        ];
        if hostile {
            for v in row.iter_mut() {
                if rng.chance(35) {
                    // NaN (read as 0, or as off) more often than the others.
                    *v = if rng.chance(30) {
                        f32::NAN
                    } else {
                        rng.pick(&HOSTILE)
                    };
                }
            }
        }
        penalties.extend(row);
    }
    let min_tokens = (0..max_bsz)
        .map(|_| {
            if hostile && rng.chance(20) {
                rng.pick(&[i32::MAX, i32::MIN])
            } else {
                rng.range(-1, 6) as i32
            }
        })
        .collect();
    let end_tokens = (0..1 + rng.below(3))
        .map(|_| token(rng, vocab, hostile))
        .collect();

    // Bias: per-slot entries (ids repeat: the last entry of an id counts).
    let bias_lens: Vec<usize> = (0..max_bsz).map(|_| rng.below(4)).collect();
    let nb: usize = bias_lens.iter().sum::<usize>().max(1);
    let bias_offsets = offsets(rng, &bias_lens, nb, hostile);
    let bias_ids = (0..nb).map(|_| token(rng, vocab, hostile)).collect();
    let bias_values = (0..nb)
        .map(|_| {
            if hostile && rng.chance(40) {
                // NaN reads as 0: the one value a plain addition gets wrong.
                rng.pick(&[f32::NAN, f32::NAN, f32::INFINITY, 1e-40, 3.0e38, -1e30])
            } else {
                rng.pick(&[0.5f32, -2.0, 10.0, -1e3, 1e-3, 3.25])
            }
        })
        .collect();

    // Bad words: entries `n, t_1 .. t_n` from the alphabet (so they match histories).
    let mut bad_words = Vec::new();
    let mut bad_lens = Vec::new();
    for _ in 0..max_bsz {
        let start = bad_words.len();
        for _ in 0..rng.below(4) {
            let n = 1 + rng.below(3);
            let n_field = if hostile && rng.chance(10) {
                rng.pick(&[0, -1, 100, i32::MIN])
            } else {
                n as i32
            };
            bad_words.push(n_field);
            bad_words.extend((0..n).map(|_| token(rng, vocab, hostile)));
        }
        bad_lens.push(bad_words.len() - start);
    }
    if bad_words.is_empty() {
        bad_words.push(1);
    }
    let bad_word_offsets = offsets(rng, &bad_lens, bad_words.len(), hostile);

    let allowed = rng
        .chance(40)
        .then(|| (0..max_bsz * words).map(|_| mask_word(rng)).collect());
    let bitmask = rng
        .chance(40)
        .then(|| (0..rows * words).map(|_| mask_word(rng)).collect());
    let temperature = (0..rows)
        .map(|_| {
            if hostile && rng.chance(20) {
                rng.pick(&[f32::NAN, -1.0, f32::INFINITY, 1e-40, -0.0])
            } else {
                rng.pick(&[1.0f32, 0.7, 0.0, 2.5, 1e-3, 1.0])
            }
        })
        .collect();

    let mut scores = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        let all_dead = rng.chance(10);
        let special = if hostile { 15 } else { 3 };
        for _ in 0..vocab {
            let value = if all_dead {
                rng.pick(&[f32::NEG_INFINITY, f32::NAN])
            } else if rng.chance(special) {
                rng.pick(&HOSTILE)
            } else if logits {
                // Halves repeat, so rows have ties.
                (rng.range(-16, 16) as f32) * 0.5 + if rng.chance(50) { rng.unit() } else { 0.0 }
            } else if rng.chance(20) {
                rng.pick(&[0.0f32, 0.25, 0.5])
            } else {
                rng.unit()
            };
            scores.push(value);
        }
    }

    Case {
        name: format!(
            "seed {seed} vocab {vocab} {dtype:?} {} hostile {hostile}",
            if logits { "logits" } else { "probs" }
        ),
        dtype,
        logits,
        vocab,
        dims: BatchDims {
            max_bsz,
            real_bsz,
            max_step_tokens: s,
        },
        rows,
        max_model_len,
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
        bad_word_offsets,
        bad_words,
        allowed,
        bitmask,
    }
}

/// f32 to f16 bits (truncating; any pattern is a fine input).
fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = x.abs();
    if x.is_nan() {
        sign | 0x7e00
    } else if a >= 65504.0 {
        sign | 0x7c00
    } else if a < 2f32.powi(-24) {
        sign
    } else if a < 2f32.powi(-14) {
        sign | (a / 2f32.powi(-24)) as u16
    } else {
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
    }
}

/// The scores in `dtype`.
fn upload_scores(device: &dyn Device, values: &[f32], dtype: DType) -> Result<Buffer, Error> {
    let bytes: Vec<u8> = match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|&x| f16_bits(x).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    device.upload_bytes(dtype, &bytes)
}

/// Runs the case on `device`: the processed rows (f32 bits) and the fallbacks.
fn process(device: &dyn Device, c: &Case) -> Result<(Vec<u32>, Vec<i32>), Error> {
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
        Scores::Logits(Logits {
            logits: &scores,
            temperature: &temperature,
            host_temperature: None,
        })
    } else {
        Scores::Probs(&scores)
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
    let processed = device.download::<f32>(&processed)?;
    Ok((
        processed.iter().map(|x| x.to_bits()).collect(),
        device.download(&fallback)?,
    ))
}

/// The first difference between the device's and the reference's outputs of case `c`.
fn compare(device: &dyn Device, reference: &ReferenceDevice, c: &Case) -> TestResult {
    let (got, got_fallback) =
        process(device, c).map_err(|e| format!("{}: xpu-sim: {e}", c.name))?;
    let (want, want_fallback) =
        process(reference, c).map_err(|e| format!("{}: reference: {e}", c.name))?;
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        let (r, v) = (i / c.vocab, i % c.vocab);
        return Err(format!(
            "{}: processed[{r}, {v}] = {:#010x} ({}), reference {:#010x} ({}); input {} batch_id {}",
            c.name,
            got[i],
            f32::from_bits(got[i]),
            want[i],
            f32::from_bits(want[i]),
            c.scores[i],
            c.batch_id[r]
        ));
    }
    if got_fallback != want_fallback {
        return Err(format!(
            "{}: fallback {got_fallback:?}, reference {want_fallback:?}",
            c.name
        ));
    }
    Ok(())
}

const VOCABS: [usize; 8] = [1, 2, 5, 31, 32, 33, 100, 1031];
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn process_logits_matches_the_reference() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let reference = ReferenceDevice::new();
    let mut seed = 1u64;
    for vocab in VOCABS {
        for dtype in DTYPES {
            for logits in [true, false] {
                for hostile in [false, true] {
                    for _ in 0..3 {
                        seed += 1;
                        compare(
                            &device,
                            &reference,
                            &generate(seed, vocab, dtype, logits, hostile),
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn process_logits_launch_shapes_agree() -> TestResult {
    let reference = ReferenceDevice::new();
    for launch in [LaunchConfig::new(3, 5), LaunchConfig::new(2, 16)] {
        let device = open(launch)?;
        for (k, vocab) in [7usize, 33, 1031, 40_003].into_iter().enumerate() {
            for logits in [true, false] {
                for hostile in [false, true] {
                    let seed = 1000 + k as u64 * 10 + u64::from(logits) * 2 + u64::from(hostile);
                    compare(
                        &device,
                        &reference,
                        &generate(seed, vocab, DType::F32, logits, hostile),
                    )
                    .map_err(|e| format!("launch {launch}: {e}"))?;
                }
            }
        }
    }
    Ok(())
}

/// The sampled tokens and the candidates (ids, score bits, lens) of rows `scores` with `fallback`.
type Sampled = (Vec<i32>, Vec<i32>, Vec<u32>, Vec<i32>);

fn sample_with_fallback(
    device: &dyn Device,
    c: &Case,
    scores: &[f32],
    fallback: &[i32],
) -> Result<Sampled, Error> {
    let rng = &mut Rng(c.rows as u64 * 31 + c.vocab as u64);
    let rows = c.rows;
    let top_k: Vec<i32> = (0..rows).map(|_| rng.range(-1, 4) as i32).collect();
    let top_p: Vec<f32> = (0..rows)
        .map(|_| rng.pick(&[1.0f32, 0.5, 0.9, 0.1]))
        .collect();
    let seed: Vec<u64> = (0..rows).map(|_| rng.next()).collect();
    let matrix = device.upload(scores)?;
    let temperature = device.upload(&c.temperature)?;
    let (top_k, top_p, seed) = (
        device.upload(&top_k)?,
        device.upload(&top_p)?,
        device.upload(&seed)?,
    );
    let fallback = device.upload(fallback)?;
    let batch_id = device.upload(&c.batch_id[..rows])?;
    let scores = || {
        if c.logits {
            Scores::Logits(Logits {
                logits: &matrix,
                temperature: &temperature,
                host_temperature: None,
            })
        } else {
            Scores::Probs(&matrix)
        }
    };
    let shape = RowShape {
        rows,
        vocab: c.vocab,
    };
    let mut tokens = device.alloc::<i32>(rows)?;
    device.top_k_top_p_sample(
        &SampleInputs {
            scores: scores(),
            top_k: &top_k,
            top_p: &top_p,
            seed: &seed,
            fallback: Some(&fallback),
        },
        &mut tokens,
        &SampleParams {
            shape,
            host_top_p: None,
        },
    )?;
    let candidates = 4;
    let mut ids = device.alloc::<i32>(rows * candidates)?;
    let mut cand_scores = device.alloc::<f32>(rows * candidates)?;
    let mut lens = device.alloc::<i32>(rows)?;
    device.top_p_candidates(
        &CandidatesInputs {
            scores: scores(),
            top_p: &top_p,
            batch_id_per_token_output: Some(&batch_id),
            fallback: Some(&fallback),
        },
        &mut CandidatesOutputs {
            ids: &mut ids,
            scores: &mut cand_scores,
            lens: &mut lens,
        },
        &CandidatesParams {
            shape,
            candidates,
            host_top_p: None,
        },
    )?;
    let cand_scores = device.download::<f32>(&cand_scores)?;
    Ok((
        device.download(&tokens)?,
        device.download(&ids)?,
        cand_scores.iter().map(|x| x.to_bits()).collect(),
        device.download(&lens)?,
    ))
}

/// The reference's processed rows and fallbacks feed both devices' sampling ops: all-masked rows
/// (fallback -1), rows whose unmasked tokens are all -inf, and garbage fallbacks.
fn sampling_fallback_matches_the_reference() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let reference = ReferenceDevice::new();
    let mut seed = 5000u64;
    for vocab in [1usize, 5, 33, 300] {
        for logits in [true, false] {
            for hostile in [false, true] {
                for _ in 0..4 {
                    seed += 1;
                    let c = generate(seed, vocab, DType::F32, logits, hostile);
                    if c.rows == 0 {
                        continue;
                    }
                    let (processed, mut fallback) =
                        process(&reference, &c).map_err(fail("reference process_logits"))?;
                    if hostile {
                        let rng = &mut Rng(seed);
                        for f in fallback.iter_mut() {
                            if rng.chance(20) {
                                *f = rng.pick(&[-7, vocab as i32 + 3, i32::MIN]);
                            }
                        }
                    }
                    let scores: Vec<f32> = processed.iter().map(|&b| f32::from_bits(b)).collect();
                    let got = sample_with_fallback(&device, &c, &scores, &fallback)
                        .map_err(|e| format!("{}: xpu-sim: {e}", c.name))?;
                    let want = sample_with_fallback(&reference, &c, &scores, &fallback)
                        .map_err(|e| format!("{}: reference: {e}", c.name))?;
                    if got != want {
                        return Err(format!(
                            "{}: fallback {fallback:?}\n xpu-sim {got:?}\n reference {want:?}",
                            c.name
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every buffer `update_state` writes, after one call.
type StateAfter = (
    Vec<i32>,
    Vec<u8>,
    Vec<i32>,
    Vec<i32>,
    Vec<u64>,
    Vec<i32>,
    Vec<i32>,
);

fn update_with_counts(device: &dyn Device, seed: u64) -> Result<(StateAfter, Vec<i32>), Error> {
    let rng = &mut Rng(seed);
    let max_bsz = 1 + rng.below(5);
    let real_bsz = rng.below(max_bsz + 1);
    let s = 1 + rng.below(4);
    let max_model_len = 2 + rng.below(8);
    let vocab = 1 + rng.below(40);
    let n = max_bsz;
    let accept_tokens: Vec<i32> = (0..n * s).map(|_| token(rng, vocab, true)).collect();
    let is_block_step: Vec<u8> = (0..n).map(|_| u8::from(rng.chance(10))).collect();
    let prompt_lens: Vec<i32> = (0..n)
        .map(|_| rng.range(-2, max_model_len as i64 + 1) as i32)
        .collect();
    let max_dec_len: Vec<i32> = (0..n).map(|_| rng.range(0, 20) as i32).collect();
    let end_tokens: Vec<i32> = (0..1 + rng.below(2))
        .map(|_| token(rng, vocab, true))
        .collect();
    let accept_num: Vec<i32> = (0..n).map(|_| rng.range(-1, s as i64 + 1) as i32).collect();
    let stop_flags: Vec<u8> = (0..n).map(|_| u8::from(rng.chance(10))).collect();
    let token_ids_all: Vec<i32> = (0..n * max_model_len)
        .map(|_| token(rng, vocab, false))
        .collect();
    let step_idx: Vec<i32> = (0..n)
        .map(|_| rng.range(-2, max_model_len as i64) as i32)
        .collect();
    let infer_seed: Vec<u64> = (0..n).map(|_| rng.next()).collect();
    let draft_tokens: Vec<i32> = (0..n * s).map(|_| token(rng, vocab, false)).collect();
    let encoder: Vec<i32> = (0..n).map(|_| rng.range(0, 3) as i32).collect();
    let decoder: Vec<i32> = (0..n).map(|_| rng.range(0, 30) as i32).collect();
    let counts: Vec<i32> = (0..n * vocab)
        .map(|_| rng.pick(&[0, 1, 7, -3, i32::MAX - 1, i32::MAX, i32::MIN]))
        .collect();

    let accept_tokens = device.upload(&accept_tokens)?;
    let is_block_step = device.upload(&is_block_step)?;
    let prompt_lens = device.upload(&prompt_lens)?;
    let max_dec_len = device.upload(&max_dec_len)?;
    let end_tokens = device.upload(&end_tokens)?;
    let mut accept_num = device.upload(&accept_num)?;
    let mut stop_flags = device.upload(&stop_flags)?;
    let mut token_ids_all = device.upload(&token_ids_all)?;
    let mut step_idx = device.upload(&step_idx)?;
    let mut infer_seed = device.upload(&infer_seed)?;
    let mut draft_tokens = device.upload(&draft_tokens)?;
    let mut encoder = device.upload(&encoder)?;
    let mut decoder = device.upload(&decoder)?;
    let mut counts = device.upload(&counts)?;
    device.update_state(
        &UpdateStateInputs {
            accept_tokens: &accept_tokens,
            is_block_step: &is_block_step,
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
            // Odd seeds: without token counts (the table stays as uploaded).
            token_counts: seed.is_multiple_of(2).then_some(&mut counts),
        },
        &UpdateStateParams {
            dims: BatchDims {
                max_bsz,
                real_bsz,
                max_step_tokens: s,
            },
            max_model_len,
            vocab,
        },
    )?;
    let state = (
        device.download(&accept_num)?,
        device.download(&stop_flags)?,
        device.download(&token_ids_all)?,
        device.download(&step_idx)?,
        device.download(&infer_seed)?,
        device.download(&draft_tokens)?,
        [
            device.download::<i32>(&encoder)?,
            device.download(&decoder)?,
        ]
        .concat(),
    );
    Ok((state, device.download(&counts)?))
}

fn token_counts_match_the_reference() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let reference = ReferenceDevice::new();
    for seed in 0..200u64 {
        let got = update_with_counts(&device, seed).map_err(fail("xpu-sim update_state"))?;
        let want = update_with_counts(&reference, seed).map_err(fail("reference update_state"))?;
        if got != want {
            return Err(format!("seed {seed}: xpu-sim {got:?}\n reference {want:?}"));
        }
    }
    Ok(())
}
