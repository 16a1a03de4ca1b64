//! `process_logits` reproduces FastDeploy's penalty values where its definition and §4c agree
//! (`docs/semantics.md` §7): plain decoding, the repetition penalty on prompt and generated
//! tokens, frequency and presence on generated tokens only.
//!
//! FastDeploy's penalty kernels (`update_repeat_times`, `update_value_by_repeat_times`) are
//! restated below from their definition: `repeat_times[v]` counts `v` among the generated tokens,
//! and a prompt token not generated gets `-1`; then for `times != 0` a negative logit is
//! multiplied by `α` and any other divided by it, and for `times > 0` the logit becomes
//! `logit − times · β − γ`, all in f32. (FastDeploy then divides by the temperature in the same
//! op; Specula weighs the processed logits at the temperature instead, so the comparison is at
//! temperature 1.)

use specula_backend_api::ops::BatchDims;
use specula_backend_api::{DType, Device};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;
use specula_reference::fixtures::{ProcessCase, run_process};

const VOCAB: usize = 1000;

/// FastDeploy's penalised logits of one row.
fn fastdeploy(
    logits: &[f32],
    prompt: &[i32],
    generated: &[i32],
    (alpha, beta, gamma): (f32, f32, f32),
) -> Vec<f32> {
    let mut times = vec![0i32; logits.len()];
    for &t in generated {
        times[t as usize] += 1;
    }
    for &t in prompt {
        if times[t as usize] == 0 {
            times[t as usize] = -1;
        }
    }
    logits
        .iter()
        .zip(&times)
        .map(|(&logit, &times)| {
            let mut logit = logit;
            if times != 0 {
                logit = if logit < 0.0 {
                    logit * alpha
                } else {
                    logit / alpha
                };
            }
            if times > 0 {
                logit = logit - times as f32 * beta - gamma;
            }
            logit
        })
        .collect()
}

/// One decode row (slot 0, position 0: plain decoding) processed by `device`.
fn specula(
    device: &dyn Device,
    logits: &[f32],
    prompt: &[i32],
    generated: &[i32],
    (alpha, beta, gamma): (f32, f32, f32),
) -> Vec<f32> {
    let mut prompt_mask = vec![0u32; VOCAB.div_ceil(32)];
    for &t in prompt {
        prompt_mask[t as usize / 32] |= 1 << (t % 32);
    }
    let mut token_counts = vec![0i32; VOCAB];
    for &t in generated {
        token_counts[t as usize] += 1;
    }
    let case = ProcessCase {
        dims: BatchDims::new(1, 1, 1),
        vocab: VOCAB,
        max_model_len: prompt.len() + generated.len() + 1,
        rows: 1,
        dtype: DType::F32,
        logits: true,
        scores: logits.to_vec(),
        temperature: vec![1.0],
        cu_out: vec![0, 1],
        batch_id: vec![0],
        token_ids_all: [prompt, generated, &[0]].concat(),
        prompt_lens: vec![prompt.len() as i32],
        step_idx: vec![generated.len() as i32],
        draft_tokens: vec![7],
        token_counts,
        prompt_mask,
        penalties: vec![alpha, 1.0 / alpha, beta, gamma, 0.0],
        min_tokens: vec![0],
        end_tokens: vec![VOCAB as i32 - 1],
        bias_offsets: vec![0, 0],
        bias_ids: vec![0],
        bias_values: vec![0.0],
        bad_word_offsets: vec![0, 0],
        bad_words: vec![0],
        allowed: None,
        bitmask: None,
    };
    let (processed, _fallback) = run_process(device, &case).expect("process_logits");
    processed.into_iter().map(f32::from_bits).collect()
}

/// A row of ordinary logits, a prompt and a generated history with repeats.
fn inputs(seed: u64) -> (Vec<f32>, Vec<i32>, Vec<i32>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let logits = (0..VOCAB)
        .map(|_| (next() % 20_000) as f32 / 1000.0 - 10.0)
        .collect();
    let prompt = (0..40).map(|_| (next() % 120) as i32).collect();
    let generated = (0..60).map(|_| (next() % 150) as i32 + 50).collect();
    (logits, prompt, generated)
}

#[test]
fn penalties_equal_fastdeploys_where_the_definitions_agree() {
    let devices: [Box<dyn Device>; 2] = [
        Box::new(ReferenceDevice::new()),
        Box::new(CpuDevice::new().expect("cpu device")),
    ];
    let mut penalised = 0;
    for seed in 0..8 {
        let (logits, prompt, generated) = inputs(seed);
        for params in [
            (2.0, 0.5, 0.25),
            (0.5, 0.125, 1.0),
            (1.3, 0.7, 0.1),
            (1.05, 0.0, 0.0),
        ] {
            let expected = fastdeploy(&logits, &prompt, &generated, params);
            for device in &devices {
                let got = specula(device.as_ref(), &logits, &prompt, &generated, params);
                for v in 0..VOCAB {
                    let (a, b) = (got[v], expected[v]);
                    if params.0.log2().fract() == 0.0 {
                        // α a power of two: 1/α is exact, so the values are identical.
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "token {v}, {params:?}: {a} vs {b}"
                        );
                    } else {
                        // x · f32(1/α) against x / α: one ulp of that product apart, carried
                        // through the subtractions (each may round the difference once more).
                        let ulp = |x: f32| f32::from_bits(x.abs().to_bits() + 1) - x.abs();
                        let bound = ulp(logits[v] / params.0) + 2.0 * ulp(a.abs().max(b.abs()));
                        assert!((a - b).abs() <= bound, "token {v}, {params:?}: {a} vs {b}");
                    }
                }
                penalised += (0..VOCAB).filter(|&v| expected[v] != logits[v]).count();
            }
        }
    }
    assert!(penalised > 1000, "the penalties must change many logits");
}
