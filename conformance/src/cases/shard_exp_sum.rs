//! Cases of `shard_exp_sum` (`docs/semantics.md` §5.17).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;
use specula_backend_api::shard::KeyOrder;

use super::Size;
use super::generate::{FLOAT_DTYPES, Rng, f32s, hostile_logit_rows, u64s};
use super::sharded_rows::{Slice, WholeRows, golden_key, shapes, slices_of};
use crate::Result;
use crate::case::{TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `shard_exp_sum` case. Inputs `logits`, `temperature`, `row_key`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Rows.
    pub rows: usize,
    /// The slice the rows hold.
    pub slice: Slice,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        vec![
            TensorSpec::new("logits", Want::Float, self.rows * self.slice.len),
            TensorSpec::new("temperature", Want::Is(DType::F32), self.rows),
            TensorSpec::new("row_key", Want::Is(DType::U64), self.rows),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        let [logits, temperature, row_key] = r.inputs(["logits", "temperature", "row_key"])?;
        let [sums] = r.outputs([("sums", DType::F32, &[self.rows])])?;
        let inputs = ShardExpSumInputs {
            logits: &logits,
            temperature: &temperature,
            row_key: &row_key,
        };
        let params = ShardExpSumParams { shape: self.slice.shape(self.rows) };
        device.shard_exp_sum(&inputs, sums, &params)?;
        Ok(())
    }

    fn reduction_width(&self) -> usize {
        self.slice.len
    }
}

/// Every case of `shard_exp_sum`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (name, mut rng, shape) in shapes(size, "shard_exp_sum", dtype) {
            let whole = WholeRows::generate(&mut rng, dtype, shape, true);
            for slice in slices_of(shape.1) {
                let params = Params { rows: shape.0, slice };
                let name = format!("{name}::{}", slice.name());
                out.push(whole.to_case(Case::new(name, params), slice));
            }
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // Row 0: m = 0 (id 0), T = 1: exp(0) + exp(−inf) + exp(NaN as −inf) = 1. Row 1: a +inf
    // maximum counts the +inf logits. Row 2: T = 0 sums nothing.
    let inf = f32::INFINITY;
    let params = Params { rows: 3, slice: Slice::new(0, 3, 5) };
    vec![Case::new("golden::special_rows", params)
        .with("logits", f32s(&[0.0, -inf, f32::NAN, inf, 1.0, inf, 2.0, 1.0, 0.0]))
        .with("temperature", f32s(&[1.0, 1.0, 0.0]))
        .with(
            "row_key",
            u64s(&[golden_key(0x8000_0000, 0), golden_key(0xFF80_0000, 0), golden_key(0xC000_0000, 0)]),
        )
        .expect("sums", f32s(&[1.0, 2.0, 0.0]))]
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("shard_exp_sum/hostile", 1);
    let (rows, vocab) = (9, 301);
    let values = hostile_logit_rows(&mut rng, rows, vocab);
    let slice = Slice::new(1, 300, vocab);
    let temperature = [f32::NAN, -1.0, 0.0, f32::INFINITY, 1e-30, 1.0, 2.5, -0.0, 0.7];
    let whole = WholeRows::of(DType::F32, (rows, vocab), values, Some(temperature.to_vec()));
    let mut keys = whole.row_keys(KeyOrder::Rank);
    keys[5] = rng.next_u64();
    keys[6] = 0;
    vec![whole.to_case(Case::new("hostile::special_temperatures_and_keys", Params { rows, slice }), slice)
        .with("row_key", u64s(&keys))]
}
