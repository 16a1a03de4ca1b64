//! Cases of `shard_key` (`docs/semantics.md` §5.13).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;
use specula_backend_api::shard::KeyOrder;

use super::generate::{FLOAT_DTYPES, Rng, f32s, float_tensor, garbage_i32s, hostile_logit_rows, i32s, u64s};
use super::sharded_rows::{SliceRows, Slice, WholeRows, golden_key, shapes, slices_of};
use super::Size;
use crate::Result;
use crate::case::TensorSpec;
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `shard_key` case. Inputs `probs` (or `logits`, `temperature`), optional
/// `ids`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// The rows and their slice.
    #[serde(flatten)]
    pub shard: SliceRows,
    /// The key order.
    #[serde(with = "super::sharded_rows::key_order")]
    pub order: KeyOrder,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let mut specs = self.shard.scores_specs();
        specs.push(TensorSpec::i32("ids", self.shard.rows).optional());
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        let scores = r.scores(self.shard.logits, "probs", "logits")?;
        let ids = r.optional("ids")?;
        let [keys] = r.outputs([("keys", DType::U64, &[self.shard.rows])])?;
        let inputs = ShardKeyInputs::new(scores.scores()).with_ids(ids.as_ref());
        let params = ShardKeyParams {
            shape: self.shard.shape(),
            order: self.order,
        };
        device.shard_key(&inputs, keys, &params)?;
        Ok(())
    }
}

/// A case of the slice `slice` of `whole` in `order`, with `ids` when given.
fn case(name: String, whole: &WholeRows, slice: Slice, order: KeyOrder, ids: Option<&[i32]>) -> Case {
    let params = Params {
        shard: whole.slice_rows(slice),
        order,
    };
    let mut case = whole.to_case(Case::new(name, params), slice);
    case.inputs.remove("row_key");
    match ids {
        Some(ids) => case.with("ids", i32s(ids)),
        None => case,
    }
}

/// Every case of `shard_key`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (name, mut rng, shape) in shapes(size, "shard_key", dtype) {
            let logits = rng.below(2) == 0;
            let whole = WholeRows::generate(&mut rng, dtype, shape, logits);
            for slice in slices_of(shape.1) {
                for order in KeyOrder::ALL {
                    let name = format!("{name}::{}::{order}", slice.name());
                    out.push(case(name.clone(), &whole, slice, order, None));
                    let ids = garbage_i32s(&mut rng, shape.0, shape.1 + 2);
                    out.push(case(format!("{name}::ids"), &whole, slice, order, Some(&ids)));
                }
            }
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let logits = Params {
        shard: SliceRows::new(2, Slice::new(3, 3, 8), true),
        order: KeyOrder::Rank,
    };
    let logit_rows = |case: Case| {
        case.with("logits", f32s(&[0.5, nan, 2.0, nan, -inf, nan]))
            .with("temperature", f32s(&[1.0, 1.0]))
    };
    // ord(2.0) = 0xC000_0000; ord(−inf) = 0x007F_FFFF; NaN is −inf in rank order and one below
    // it in argmax order.
    let rank = logit_rows(Case::new("golden::logits_rank", logits.clone()))
        .expect("keys", u64s(&[golden_key(0xC000_0000, 5), golden_key(0x007F_FFFF, 3)]));
    let argmax = logit_rows(Case::new(
        "golden::logits_argmax",
        Params { order: KeyOrder::Argmax, ..logits.clone() },
    ))
    .expect("keys", u64s(&[golden_key(0xC000_0000, 5), golden_key(0x007F_FFFF, 4)]));
    let ids = logit_rows(Case::new("golden::logits_ids", logits))
        .with("ids", i32s(&[4, 2]))
        .expect("keys", u64s(&[golden_key(0x007F_FFFF, 4), 0]));
    // Probabilities rank by sanitize(p): 2.0 and 1.0 tie at 1 (ord 0xBF80_0000); argmax by the
    // raw value.
    let probs = Params {
        shard: SliceRows::new(1, Slice::new(0, 3, 3), false),
        order: KeyOrder::Rank,
    };
    let prob_row = |case: Case| case.with("probs", f32s(&[0.5, 2.0, 1.0]));
    let prob_rank = prob_row(Case::new("golden::probs_rank", probs.clone()))
        .expect("keys", u64s(&[golden_key(0xBF80_0000, 1)]));
    let prob_argmax = prob_row(Case::new(
        "golden::probs_argmax",
        Params { order: KeyOrder::Argmax, ..probs },
    ))
    .expect("keys", u64s(&[golden_key(0xC000_0000, 1)]));
    vec![rank, argmax, ids, prob_rank, prob_argmax]
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("shard_key/hostile", 1);
    let (rows, vocab) = (9, 611);
    let values = hostile_logit_rows(&mut rng, rows, vocab);
    let slice = Slice::new(200, 300, vocab);
    let ids = garbage_i32s(&mut rng, rows, vocab);
    FLOAT_DTYPES
        .into_iter()
        .flat_map(|dtype| {
            KeyOrder::ALL.map(|order| {
                let params = Params { shard: SliceRows::new(rows, slice, true), order };
                let cut: Vec<f32> = (0..rows)
                    .flat_map(|r| values[r * vocab + 200..r * vocab + 500].to_vec())
                    .collect();
                Case::new(format!("hostile::nan_inf_garbage_{dtype}_{order}"), params)
                    .with("logits", float_tensor(dtype, &[rows, 300], &cut))
                    .with("temperature", f32s(&vec![-1.0; rows]))
                    .with("ids", i32s(&ids))
            })
        })
        .collect()
}
