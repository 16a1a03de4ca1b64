//! Cases of `top_k_top_p_sample` (contract §4.3).

use specula_backend_api::DType;

use super::generate::{
    EDGE_SEEDS, FLOAT_DTYPES, Rng, add_ties, f32s, float_tensor, i32s, prob_row, u64s,
};
use super::{Size, full_shape_for, row_shapes};
use crate::case::{Case, CaseParams};

fn case(
    name: String,
    dtype: DType,
    vocab: usize,
    probs: &[f32],
    top_k: &[i32],
    top_p: &[f32],
    seed: &[u64],
) -> Case {
    let rows = top_k.len();
    Case::new(name, CaseParams::TopKTopPSample { rows, vocab })
        .with("probs", float_tensor(dtype, &[rows, vocab], probs))
        .with("top_k", i32s(top_k))
        .with("top_p", f32s(top_p))
        .with("seed", u64s(seed))
}

/// Realistic per-row `top_k` values for a vocabulary.
pub(crate) fn pick_top_k(rng: &mut Rng, vocab: usize) -> i32 {
    let v = vocab as i32;
    rng.pick(&[0, 0, 0, 1, 5, 20, 50, v, v + 7, (v / 2).max(1)])
}

/// Realistic per-row `top_p` values.
pub(crate) fn pick_top_p(rng: &mut Rng) -> f32 {
    rng.pick(&[1.0, 1.0, 0.95, 0.9, 0.8, 0.5, 0.3, 0.999, 1e-6])
}

/// Every case of `top_k_top_p_sample`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (rows, vocab) in row_shapes(size) {
            if !full_shape_for(dtype, rows, vocab) {
                continue;
            }
            let mut rng = Rng::new(
                &format!("sample/{dtype}"),
                (rows * 1_000_003 + vocab) as u64,
            );
            let mut probs = Vec::with_capacity(rows * vocab);
            for r in 0..rows {
                let mut row = prob_row(&mut rng, vocab);
                if r % 3 == 1 {
                    add_ties(&mut rng, &mut row);
                }
                probs.extend(row);
            }
            let top_k: Vec<i32> = (0..rows).map(|_| pick_top_k(&mut rng, vocab)).collect();
            let top_p: Vec<f32> = (0..rows).map(|_| pick_top_p(&mut rng)).collect();
            let seed: Vec<u64> = (0..rows).map(|_| rng.seed()).collect();
            out.push(case(
                format!("{dtype}::{rows}x{vocab}"),
                dtype,
                vocab,
                &probs,
                &top_k,
                &top_p,
                &seed,
            ));
        }
        // Many rows of one distribution with distinct seeds: every kept token gets drawn.
        let (rows, vocab) = (512, 7);
        let mut rng = Rng::new(&format!("sample/{dtype}/draws"), 0);
        let row = prob_row(&mut rng, vocab);
        let probs: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
        let seed: Vec<u64> = (0..rows as u64).map(|i| 1000 + 4 * i).collect();
        out.push(case(
            format!("{dtype}::{rows}x{vocab}_same_row"),
            dtype,
            vocab,
            &probs,
            &vec![0; rows],
            &vec![1.0; rows],
            &seed,
        ));
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // Rows whose result does not depend on the draw: top-k 1, one-hot rows, a tiny top-p, zero
    // total weight (the first token in rank order).
    let nan = f32::NAN;
    let rows: [([f32; 5], i32, f32, i32); 9] = [
        ([0.1, 0.3, 0.3, 0.2, 0.1], 1, 1.0, 1),
        ([0.1, 0.2, 0.3, 0.2, 0.2], 0, 1e-6, 2),
        ([0.0, 0.0, 0.0, 1.0, 0.0], 0, 1.0, 3),
        ([0.25, 0.25, 0.25, 0.25, 0.0], 1, 0.5, 0),
        ([0.0, 0.0, 0.0, 0.0, 0.0], 0, 1.0, 0),
        ([nan, nan, nan, nan, nan], 3, 0.9, 0),
        ([-1.0, -0.5, 0.0, -0.0, nan], 0, 1.0, 0),
        ([0.2, 0.2, 5.0, f32::INFINITY, 0.1], 1, 1.0, 2),
        ([0.05, 0.05, 0.6, 0.2, 0.1], -4, 1e-3, 2),
    ];
    let probs: Vec<f32> = rows.iter().flat_map(|r| r.0).collect();
    let top_k: Vec<i32> = rows.iter().map(|r| r.1).collect();
    let top_p: Vec<f32> = rows.iter().map(|r| r.2).collect();
    let expected: Vec<i32> = rows.iter().map(|r| r.3).collect();
    let seed: Vec<u64> = EDGE_SEEDS.iter().copied().chain([42]).collect();
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            case(
                format!("golden::deterministic_rows_{dtype}"),
                dtype,
                5,
                &probs,
                &top_k,
                &top_p,
                &seed,
            )
            .expect("tokens", i32s(&expected))
        })
        .collect()
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("sample/hostile", 1);
    let vocab = 1031;
    let rows = 16;
    let mut probs = Vec::new();
    for r in 0..rows {
        let mut row = prob_row(&mut rng, vocab);
        for x in row.iter_mut() {
            match (r % 8, rng.below(4)) {
                (0, 0) => *x = f32::NAN,
                (1, 0) => *x = f32::INFINITY,
                (2, _) => *x = -*x,
                (3, _) => *x = 0.0,
                (4, _) => *x = 1.0,
                (5, 1) => *x = -0.0,
                (6, _) => *x = f32::from_bits(rng.next_u64() as u32),
                _ => {}
            }
        }
        probs.extend(row);
    }
    let v = vocab as i32;
    let top_k = [
        -1,
        i32::MIN,
        v + 1,
        i32::MAX,
        1,
        0,
        v,
        3,
        -7,
        2,
        0,
        0,
        0,
        0,
        1,
        v - 1,
    ];
    let nan = f32::NAN;
    let top_p = [
        nan,
        -0.5,
        0.0,
        1.5,
        f32::INFINITY,
        1e-30,
        0.5,
        f32::MIN_POSITIVE,
        1.0,
        0.9,
        -0.0,
        2.0,
        nan,
        0.1,
        1.0,
        0.7,
    ];
    let seed: Vec<u64> = EDGE_SEEDS
        .iter()
        .chain(EDGE_SEEDS.iter())
        .map(|s| s ^ rng.below(2) as u64)
        .collect();
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            case(
                format!("hostile::bad_rows_params_seeds_{dtype}"),
                dtype,
                vocab,
                &probs,
                &top_k,
                &top_p,
                &seed,
            )
        })
        .collect()
}
