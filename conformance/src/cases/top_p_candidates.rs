//! Cases of `top_p_candidates` (contract §4.4).

use specula_backend_api::DType;

use super::generate::{FLOAT_DTYPES, Rng, add_ties, f32s, float_tensor, i32s, prob_row};
use super::top_k_top_p_sample::pick_top_p;
use super::{Size, full_shape_for, row_shapes};
use crate::case::{Case, CaseParams};

fn case(
    name: String,
    dtype: DType,
    vocab: usize,
    candidates: usize,
    probs: &[f32],
    top_p: &[f32],
    batch_id: Option<&[i32]>,
) -> Case {
    let rows = top_p.len();
    let mut case = Case::new(
        name,
        CaseParams::TopPCandidates {
            rows,
            vocab,
            candidates,
        },
    )
    .with("probs", float_tensor(dtype, &[rows, vocab], probs))
    .with("top_p", f32s(top_p));
    if let Some(batch_id) = batch_id {
        case = case.with("batch_id_per_token_output", i32s(batch_id));
    }
    case
}

/// Every case of `top_p_candidates`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    let counts = [1, 8, 20, 64, 128];
    for dtype in FLOAT_DTYPES {
        for (i, (rows, vocab)) in row_shapes(size).into_iter().enumerate() {
            if !full_shape_for(dtype, rows, vocab) {
                continue;
            }
            let mut rng = Rng::new(
                &format!("candidates/{dtype}"),
                (rows * 1_000_003 + vocab) as u64,
            );
            let c = counts[i % counts.len()];
            let mut probs = Vec::with_capacity(rows * vocab);
            for r in 0..rows {
                let mut row = prob_row(&mut rng, vocab);
                if r % 3 == 1 {
                    add_ties(&mut rng, &mut row);
                }
                probs.extend(row);
            }
            let top_p: Vec<f32> = (0..rows).map(|_| pick_top_p(&mut rng)).collect();
            // Every other shape passes the layout's batch ids, with padding rows at the end.
            let batch_id: Option<Vec<i32>> = (i % 2 == 1).then(|| {
                let valid = rows - rows / 4;
                (0..rows)
                    .map(|r| if r < valid { (r / 3) as i32 } else { -1 })
                    .collect()
            });
            out.push(case(
                format!("{dtype}::{rows}x{vocab}_c{c}"),
                dtype,
                vocab,
                c,
                &probs,
                &top_p,
                batch_id.as_deref(),
            ));
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    let nan = f32::NAN;
    // 5 rows of V = 5, C = 4.
    let probs = [
        [0.1, 0.4, 0.2, 0.3, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.25, 0.25, 0.25, 0.25, 0.0],
        [0.5, 0.0, 0.5, -1.0, nan],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ];
    let top_p = [0.5, 0.9, 0.5, 1.0, 0.3];
    let batch_id = [0, 1, 1, 2, -1];
    let ids = [
        [1, 3, 2, 0],
        [0, -1, -1, -1],
        [0, 1, 2, 3],
        [0, 2, -1, -1],
        [-1, -1, -1, -1],
    ];
    let scores = [
        [0.4, 0.3, 0.2, 0.1],
        [0.0; 4],
        [0.25; 4],
        [0.5, 0.5, 0.0, 0.0],
        [0.0; 4],
    ];
    let lens = [2, 1, 2, 2, 0];
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            // Scores are the sanitized probabilities as the op reads them (after the dtype).
            let scores: Vec<f32> = scores
                .concat()
                .iter()
                .map(|&s| super::generate::round_to(dtype, &[s])[0])
                .collect();
            case(
                format!("golden::ranks_ties_zero_padding_{dtype}"),
                dtype,
                5,
                4,
                &probs.concat(),
                &top_p,
                Some(&batch_id),
            )
            .expect(
                "ids",
                crate::tensor::HostTensor::new(&[5, 4], &ids.concat()),
            )
            .expect("scores", float_tensor(DType::F32, &[5, 4], &scores))
            .expect("lens", i32s(&lens))
        })
        .collect()
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("candidates/hostile", 1);
    let vocab = 1031;
    let rows = 12;
    let mut probs = Vec::new();
    for r in 0..rows {
        let mut row = prob_row(&mut rng, vocab);
        for x in row.iter_mut() {
            match (r % 6, rng.below(4)) {
                (0, 0) => *x = f32::NAN,
                (1, 0) => *x = f32::INFINITY,
                (2, _) => *x = -*x,
                (3, _) => *x = 0.0,
                (4, _) => *x = f32::from_bits(rng.next_u64() as u32),
                _ => {}
            }
        }
        probs.extend(row);
    }
    let nan = f32::NAN;
    let top_p = [
        nan,
        -0.5,
        0.0,
        1.5,
        f32::INFINITY,
        1e-30,
        0.5,
        1.0,
        nan,
        0.9,
        2.0,
        -0.0,
    ];
    let batch_id = [0, -1, i32::MAX, i32::MIN, 3, -7, 1, 1, 2, -1, 100, 0];
    let mut out = Vec::new();
    for dtype in FLOAT_DTYPES {
        out.push(case(
            format!("hostile::bad_rows_top_p_batch_ids_{dtype}"),
            dtype,
            vocab,
            17,
            &probs,
            &top_p,
            Some(&batch_id),
        ));
    }
    // More candidates than tokens.
    let small: Vec<f32> = probs.iter().take(7 * 3).copied().collect();
    out.push(case(
        "hostile::c_above_vocab".into(),
        DType::F32,
        7,
        128,
        &small,
        &top_p[..3],
        None,
    ));
    out
}
