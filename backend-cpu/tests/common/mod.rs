//! Helpers shared by the CPU's integration tests: device memory from host slices, and the two
//! sampling ops run from host rows.

use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, Device, DeviceExt, Element};

/// `data` uploaded to `dev`.
pub fn up<T: Element>(dev: &dyn Device, data: &[T]) -> Buffer {
    dev.upload(data).expect("upload")
}

/// `len` zeroed elements of `T` on `dev`.
pub fn zeros<T: Element>(dev: &dyn Device, len: usize) -> Buffer {
    dev.alloc::<T>(len).expect("alloc")
}

/// The contents of `buffer`.
pub fn down<T: Element>(dev: &dyn Device, buffer: &Buffer) -> Vec<T> {
    dev.download(buffer).expect("download")
}

/// Rows of `top_k_top_p_sample` and `top_p_candidates` with their per-row parameters.
pub struct Rows<T> {
    pub probs: Vec<T>,
    pub vocab: usize,
    pub top_k: Vec<i32>,
    pub top_p: Vec<f32>,
    pub seed: Vec<u64>,
}

/// Candidates per row.
pub const C: usize = 64;

/// The sampled tokens and the candidates (`ids`, `scores`, `lens`) of `rows` on `dev`.
pub fn sample_and_candidates<T: Element>(
    dev: &dyn Device,
    rows: &Rows<T>,
) -> (Vec<i32>, Vec<i32>, Vec<f32>, Vec<i32>) {
    let n = rows.top_k.len();
    let shape = RowShape {
        rows: n,
        vocab: rows.vocab,
    };
    let (probs, top_k) = (up(dev, &rows.probs), up(dev, &rows.top_k));
    let (top_p, seed) = (up(dev, &rows.top_p), up(dev, &rows.seed));
    let mut tokens = zeros::<i32>(dev, n);
    let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
    let params = SampleParams::new(shape);
    dev.top_k_top_p_sample(&inputs, &mut tokens, &params)
        .expect("top_k_top_p_sample");
    let (mut ids, mut scores) = (zeros::<i32>(dev, n * C), zeros::<f32>(dev, n * C));
    let mut lens = zeros::<i32>(dev, n);
    let inputs = CandidatesInputs::new(Scores::Probs(&probs), &top_p);
    let mut outputs = CandidatesOutputs {
        ids: &mut ids,
        scores: &mut scores,
        lens: &mut lens,
    };
    let params = CandidatesParams::new(shape, C);
    dev.top_p_candidates(&inputs, &mut outputs, &params)
        .expect("top_p_candidates");
    (
        down(dev, &tokens),
        down(dev, &ids),
        down(dev, &scores),
        down(dev, &lens),
    )
}
