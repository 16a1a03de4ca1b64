//! Cases of `shard_histogram` (`docs/semantics.md` §5.15).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::abi::SHARD_HISTOGRAM_BUCKETS;
use specula_backend_api::ops::*;
use specula_backend_api::shard::KeyOrder;

use super::Size;
use super::generate::{FLOAT_DTYPES, Rng, f32s, hostile_logit_rows, u64s};
use super::sharded_rows::{SliceRows, RowBuffers, Slice, WholeRows, golden_key, min_ps, u64_tensor, shapes, slices_of};
use crate::Result;
use crate::case::{TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `shard_histogram` case. Inputs `probs` (or `logits`, `temperature`),
/// `row_key`, optional `min_p`, `prefix`, `floor`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// The rows and their slice.
    #[serde(flatten)]
    pub shard: SliceRows,
    /// The bucket's shift.
    pub shift: u32,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let mut specs = self.shard.rows_specs();
        specs.push(TensorSpec::new("prefix", Want::Is(DType::U64), self.shard.rows));
        specs.push(TensorSpec::new("floor", Want::Is(DType::U64), self.shard.rows));
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        let rows = RowBuffers::load(r, self.shard.logits)?;
        let [prefix, floor] = r.inputs(["prefix", "floor"])?;
        let len = [self.shard.rows, SHARD_HISTOGRAM_BUCKETS];
        let [counts, masses] = r.outputs([("counts", DType::U64, &len), ("masses", DType::U64, &len)])?;
        let inputs = ShardHistogramInputs {
            rows: rows.rows(),
            prefix: &prefix,
            floor: &floor,
        };
        let params = ShardHistogramParams {
            shape: self.shard.shape(),
            shift: self.shift,
        };
        device.shard_histogram(&inputs, &mut ShardHistogramOutputs { counts, masses }, &params)?;
        Ok(())
    }
}

/// The prefix of `key` above a bucket at `shift`.
fn prefix_of(key: u64, shift: u32) -> u64 {
    key.checked_shr(shift + 8).unwrap_or(0)
}

/// Every case of `shard_histogram`: each round of the search (shifts 44 … 4, 0), within the
/// prefix of the row's first token, with and without a floor.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (name, mut rng, shape) in shapes(size, "shard_histogram", dtype) {
            let logits = rng.below(3) > 0;
            let whole = WholeRows::generate(&mut rng, dtype, shape, logits);
            let keys = whole.row_keys(KeyOrder::Rank);
            for slice in slices_of(shape.1) {
                let shift = rng.pick(&[44, 36, 28, 20, 12, 4, 0]);
                let prefix: Vec<u64> = keys.iter().map(|&k| prefix_of(k, shift)).collect();
                let floor: Vec<u64> = keys.iter().map(|&k| rng.pick(&[0, k >> 1, k])).collect();
                let params = Params { shard: SliceRows::new(shape.0, slice, logits), shift };
                let name = format!("{name}::{}::shift{shift}", slice.name());
                let case = whole
                    .to_case(Case::new(name, params), slice)
                    .with("prefix", u64s(&prefix))
                    .with("floor", u64s(&floor));
                out.push(case.clone().with("min_p", f32s(&min_ps(&mut rng, shape.0))));
                let mut first_round = case;
                first_round.name.push_str("::first_round");
                out.push(top_round(first_round, shape.0));
            }
        }
    }
    out.extend(hostile());
    out
}

/// The parameters of a histogram case.
fn params_of(case: &Case) -> Params {
    match &case.params {
        super::CaseParams::ShardHistogram(p) => p.clone(),
        _ => unreachable!("a shard_histogram case"),
    }
}

/// `case` as the first round: shift 44, prefix 0 (every key), no floor.
fn top_round(mut case: Case, rows: usize) -> Case {
    let params = Params { shift: 44, ..params_of(&case) };
    case.params = params.into();
    case.with("prefix", u64s(&vec![0; rows])).with("floor", u64s(&vec![0; rows]))
}

fn golden() -> Vec<Case> {
    // Ids 2, 3, 4 of a row of 6: keys >> 44 are ord >> 24: 0xBE for 0.25 (ids 2, 4), 0xBF for
    // 0.5 (id 3). Row 1's floor leaves out id 4 (whose key is below id 2's).
    let params = Params {
        shard: SliceRows::new(2, Slice::new(2, 3, 6), false),
        shift: 44,
    };
    let mut counts = vec![0u64; 512];
    let mut masses = vec![0u64; 512];
    (counts[0xBE], counts[0xBF], masses[0xBE], masses[0xBF]) = (2, 1, 1 << 39, 1 << 39);
    (counts[256 + 0xBE], counts[256 + 0xBF]) = (1, 1);
    (masses[256 + 0xBE], masses[256 + 0xBF]) = (1 << 38, 1 << 39);
    let key = golden_key(0xBF00_0000, 3);
    vec![
        Case::new("golden::probs_first_round", params)
            .with("probs", f32s(&[0.25, 0.5, 0.25, 0.25, 0.5, 0.25]))
            .with("row_key", u64s(&[key, key]))
            .with("prefix", u64s(&[0, 0]))
            .with("floor", u64s(&[0, golden_key(0xBE80_0000, 2)]))
            .expect("counts", u64_tensor(&[2, 256], &counts))
            .expect("masses", u64_tensor(&[2, 256], &masses)),
    ]
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("shard_histogram/hostile", 1);
    let (rows, vocab) = (9, 389);
    let values = hostile_logit_rows(&mut rng, rows, vocab);
    let slice = Slice::new(0, 300, vocab);
    let whole = WholeRows::of(DType::BF16, (rows, vocab), values, Some(vec![f32::NAN; rows]));
    let keys: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
    let prefix: Vec<u64> = (0..rows).map(|r| if r % 2 == 0 { 0 } else { rng.next_u64() }).collect();
    let floor: Vec<u64> = (0..rows).map(|_| rng.next_u64() >> rng.below(64)).collect();
    let params = Params { shard: SliceRows::new(rows, slice, true), shift: 44 };
    vec![whole
        .to_case(Case::new("hostile::garbage_keys_prefixes_floors", params), slice)
        .with("row_key", u64s(&keys))
        .with("prefix", u64s(&prefix))
        .with("floor", u64s(&floor))]
}
