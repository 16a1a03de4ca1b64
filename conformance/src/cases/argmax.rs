//! Cases of `argmax` (contract §4.2).

use specula_backend_api::DType;

use super::generate::{FLOAT_DTYPES, Rng, add_ties, float_tensor, i32s, logit_row, prob_row};
use super::{Size, full_shape_for, row_shapes};
use crate::case::{Case, CaseParams};

fn case(name: String, dtype: DType, rows: usize, vocab: usize, values: &[f32]) -> Case {
    Case::new(name, CaseParams::Argmax { rows, vocab })
        .with("input", float_tensor(dtype, &[rows, vocab], values))
}

/// Every case of `argmax`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (rows, vocab) in row_shapes(size) {
            if !full_shape_for(dtype, rows, vocab) {
                continue;
            }
            let mut rng = Rng::new(
                &format!("argmax/{dtype}"),
                (rows * 1_000_003 + vocab) as u64,
            );
            let mut values = Vec::with_capacity(rows * vocab);
            for r in 0..rows {
                // Logits and probabilities alternate; every third row gets runs of ties.
                let mut row = if r % 2 == 0 {
                    logit_row(&mut rng, vocab)
                } else {
                    prob_row(&mut rng, vocab)
                };
                if r % 3 == 1 {
                    add_ties(&mut rng, &mut row);
                }
                values.extend(row);
            }
            out.push(case(
                format!("{dtype}::{rows}x{vocab}"),
                dtype,
                rows,
                vocab,
                &values,
            ));
        }
    }
    out.extend(hostile());
    out
}

/// A golden table: name, vocabulary, rows, expected argmax per row.
type Table = (&'static str, usize, Vec<Vec<f32>>, Vec<i32>);

fn golden() -> Vec<Case> {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // (name, vocab, rows, expected argmax per row)
    let tables: [Table; 4] = [
        (
            "ties_lowest_id",
            5,
            vec![
                vec![0.1, 0.5, 0.2, 0.5, 0.5],
                vec![3.0, 3.0, 3.0, 3.0, 3.0],
                vec![-1.0, -2.0, -1.0, -7.0, -1.0],
            ],
            vec![1, 0, 0],
        ),
        (
            "nan_below_everything",
            4,
            vec![
                vec![nan, -inf, nan, nan],
                vec![nan, nan, nan, nan],
                vec![nan, 0.25, nan, 1.5],
                vec![-inf, -inf, nan, -inf],
            ],
            vec![1, 0, 3, 0],
        ),
        (
            "signed_zero_and_inf",
            4,
            vec![
                vec![-0.0, 0.0, -0.0, -1.0],
                vec![-5.0, -0.0, 0.0, -1.0],
                vec![1.0, inf, 3.0, inf],
                vec![-inf, -inf, -inf, -inf],
            ],
            vec![0, 1, 1, 0],
        ),
        ("single_token", 1, vec![vec![-3.0], vec![nan]], vec![0, 0]),
    ];
    let mut out = Vec::new();
    for (name, vocab, rows, expected) in tables {
        let values: Vec<f32> = rows.concat();
        for dtype in FLOAT_DTYPES {
            out.push(
                case(
                    format!("golden::{name}_{dtype}"),
                    dtype,
                    rows.len(),
                    vocab,
                    &values,
                )
                .expect("out", i32s(&expected)),
            );
        }
    }
    out
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("argmax/hostile", 1);
    let vocab = 1031;
    let rows = 6;
    let mut values = Vec::new();
    for r in 0..rows {
        let mut row = logit_row(&mut rng, vocab);
        for x in row.iter_mut() {
            match (r, rng.below(5)) {
                (0, 0) => *x = f32::NAN,
                (1, _) => *x = f32::NAN,
                (2, 0) => *x = f32::NEG_INFINITY,
                (3, _) => *x = f32::from_bits(rng.next_u64() as u32),
                (4, 1) => *x = f32::MIN_POSITIVE / 8.0,
                (5, _) => *x = f32::MAX,
                _ => {}
            }
        }
        values.extend(row);
    }
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            case(
                format!("hostile::nan_inf_garbage_bits_{dtype}"),
                dtype,
                rows,
                vocab,
                &values,
            )
        })
        .collect()
}
