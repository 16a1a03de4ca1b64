//! Cases of `argmax` (`docs/semantics.md` §5.4).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::generate::{
    FLOAT_DTYPES, Rng, float_tensor, i32s, logit_row, prob_row, rows_with_ties, spoiled_rows,
};
use super::{Size, row_gens};
use crate::Result;
use crate::case::{TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `argmax` case (the JSON header of a case file, beside `"op"`).
/// Input `input`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Rows.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        vec![TensorSpec::new(
            "input",
            Want::Float,
            self.rows * self.vocab,
        )]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params { rows, vocab } = *self;
        let device = r.device();
        let [input] = r.inputs(["input"])?;
        let [out] = r.outputs([("out", DType::I32, &[rows])])?;
        device.argmax(&input, out, &RowShape { rows, vocab })?;
        Ok(())
    }
}

/// An `argmax` case of `[rows, vocab]` `values` in `dtype`.
pub(crate) fn case(name: String, dtype: DType, rows: usize, vocab: usize, values: &[f32]) -> Case {
    Case::new(name, Params { rows, vocab })
        .with("input", float_tensor(dtype, &[rows, vocab], values))
}

/// Every case of `argmax`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for mut g in row_gens(size, "argmax", dtype) {
            // Logits and probabilities alternate; every third row gets runs of ties.
            let values = rows_with_ties(&mut g.rng, g.rows, |rng, r| match r % 2 {
                0 => logit_row(rng, g.vocab),
                _ => prob_row(rng, g.vocab),
            });
            out.push(case(g.name(), dtype, g.rows, g.vocab, &values));
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
    let (rows, vocab) = (6, 1031);
    let values = spoiled_rows(
        &mut rng,
        rows,
        vocab,
        logit_row,
        5,
        |rng, r, draw, x| match (r, draw) {
            (0, 0) => *x = f32::NAN,
            (1, _) => *x = f32::NAN,
            (2, 0) => *x = f32::NEG_INFINITY,
            (3, _) => *x = f32::from_bits(rng.next_u64() as u32),
            (4, 1) => *x = f32::MIN_POSITIVE / 8.0,
            (5, _) => *x = f32::MAX,
            _ => {}
        },
    );
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
