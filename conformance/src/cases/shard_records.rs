//! Cases of `shard_records` (`docs/semantics.md` §5.14).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;
use specula_backend_api::shard::KeyOrder;

use super::Size;
use super::generate::{FLOAT_DTYPES, Rng, f32s, hostile_logit_rows, u64s};
use super::sharded_rows::{SliceRows, RowBuffers, Slice, WholeRows, golden_key, min_ps, u64_tensor, shapes, slices_of};
use crate::Result;
use crate::case::TensorSpec;
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `shard_records` case. Inputs `probs` (or `logits`, `temperature`),
/// `row_key`, optional `min_p`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// The rows and their slice.
    #[serde(flatten)]
    pub shard: SliceRows,
    /// `K`, the records per row.
    pub records: usize,
    /// The key order.
    #[serde(with = "super::sharded_rows::key_order")]
    pub order: KeyOrder,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        self.shard.rows_specs()
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        let rows = RowBuffers::load(r, self.shard.logits)?;
        let len = [self.shard.rows, self.records, 2];
        let [records] = r.outputs([("records", DType::U64, &len)])?;
        let params = ShardRecordsParams {
            shape: self.shard.shape(),
            records: self.records,
            order: self.order,
        };
        device.shard_records(&rows.rows(), records, &params)?;
        Ok(())
    }
}

/// A case of the slice `slice` of `whole`.
pub(crate) fn case(name: String, whole: &WholeRows, slice: Slice, records: usize, order: KeyOrder) -> Case {
    let params = Params {
        shard: whole.slice_rows(slice),
        records,
        order,
    };
    whole.to_case(Case::new(name, params), slice)
}

/// Every case of `shard_records`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (name, mut rng, shape) in shapes(size, "shard_records", dtype) {
            let logits = rng.below(3) > 0;
            let whole = WholeRows::generate(&mut rng, dtype, shape, logits);
            for slice in slices_of(shape.1) {
                let k = rng.pick(&[1, 7, 50, 1024]);
                let order = rng.pick(&KeyOrder::ALL);
                let name = format!("{name}::{}::k{k}_{order}", slice.name());
                let min_p = f32s(&min_ps(&mut rng, shape.0));
                out.push(case(name.clone(), &whole, slice, k, order));
                out.push(case(format!("{name}::min_p"), &whole, slice, k, order).with("min_p", min_p));
            }
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // Ids 2, 3, 4 of a row of 6: w(0.25) = 2^38, w(0.5) = 2^39; ord(0.5) = 0xBF00_0000,
    // ord(0.25) = 0xBE80_0000. Four records of three tokens: the last is (0, 0).
    let params = Params {
        shard: SliceRows::new(1, Slice::new(2, 3, 6), false),
        records: 4,
        order: KeyOrder::Rank,
    };
    let expected = [
        golden_key(0xBF00_0000, 3),
        1 << 39,
        golden_key(0xBE80_0000, 2),
        1 << 38,
        golden_key(0xBE80_0000, 4),
        1 << 38,
        0,
        0,
    ];
    let probs = Case::new("golden::probs_ties_by_id", params.clone())
        .with("probs", f32s(&[0.25, 0.5, 0.25]))
        .with("row_key", u64s(&[golden_key(0xBF00_0000, 3)]))
        .expect("records", u64_tensor(&[1, 4, 2], &expected));
    // min_p 0.75 against the row's largest weight w(0.5): 2^38 · 2^24 < ceil(0.75 · 2^24) · 2^39.
    let min_p = Case::new("golden::probs_min_p", params)
        .with("probs", f32s(&[0.25, 0.5, 0.25]))
        .with("row_key", u64s(&[golden_key(0xBF00_0000, 3)]))
        .with("min_p", f32s(&[0.75]))
        .expect(
            "records",
            u64_tensor(&[1, 4, 2], &[expected[0], expected[1], expected[2], 0, expected[4], 0, 0, 0]),
        );
    // Logits at T = 0: only the row key's token (id 1, in another slice) weighs; here none.
    let logits = Case::new(
        "golden::logits_argmax_elsewhere",
        Params {
            shard: SliceRows::new(1, Slice::new(2, 2, 4), true),
            records: 2,
            order: KeyOrder::Rank,
        },
    )
    .with("logits", f32s(&[1.0, 2.0]))
    .with("temperature", f32s(&[0.0]))
    .with("row_key", u64s(&[golden_key(0xC000_0000, 1)]))
    .expect(
        "records",
        u64_tensor(&[1, 2, 2], &[golden_key(0xC000_0000, 3), 0, golden_key(0xBF80_0000, 2), 0]),
    );
    vec![probs, min_p, logits]
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("shard_records/hostile", 1);
    let (rows, vocab) = (9, 433);
    let values = hostile_logit_rows(&mut rng, rows, vocab);
    let slice = Slice::new(100, 333, vocab);
    let whole = WholeRows::of(DType::F32, (rows, vocab), values, Some(vec![-2.0; rows]));
    let keys: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
    let min_p = [f32::NAN, -1.0, 7.0, 0.5, 1e-30, f32::INFINITY, 0.0, 1.0, 0.9];
    vec![
        case("hostile::garbage_row_keys".to_owned(), &whole, slice, 64, KeyOrder::Rank)
            .with("row_key", u64s(&keys))
            .with("min_p", f32s(&min_p)),
        case("hostile::nan_inf_true_keys".to_owned(), &whole, slice, 333, KeyOrder::Argmax)
            .with("min_p", f32s(&min_p)),
    ]
}
