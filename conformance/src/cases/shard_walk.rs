//! Cases of `shard_walk` (`docs/semantics.md` §5.16).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;
use specula_backend_api::shard::{KeyOrder, SliceWeigher, token_key};

use super::Size;
use super::generate::{FLOAT_DTYPES, Rng, f32s, float_tensor, hostile_logit_rows, i32s, u64s};
use super::sharded_rows::{SliceRows, RowBuffers, Slice, WholeRows, golden_key, min_ps, shapes, slices_of};
use crate::Result;
use crate::case::{TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `shard_walk` case. Inputs `probs` (or `logits`, `temperature`),
/// `row_key`, optional `min_p`, `threshold`, `offset`; with `residual`, `draft` (`draft_rows`
/// rows), `draft_key`, `draft_row`, `target_mass`, `draft_mass`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// The rows and their slice.
    #[serde(flatten)]
    pub shard: SliceRows,
    /// Draft rows of REJECTION's residual (0: no residual).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub draft_rows: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let rows = self.shard.rows;
        let mut specs = self.shard.rows_specs();
        specs.push(TensorSpec::new("threshold", Want::Is(DType::U64), rows));
        specs.push(TensorSpec::new("offset", Want::Is(DType::U64), rows));
        if self.draft_rows > 0 {
            specs.extend([
                TensorSpec::new("draft", Want::Float, self.draft_rows * self.shard.slice.len),
                TensorSpec::new("draft_key", Want::Is(DType::U64), self.draft_rows),
                TensorSpec::i32("draft_row", rows),
                TensorSpec::new("target_mass", Want::Is(DType::U64), rows),
                TensorSpec::new("draft_mass", Want::Is(DType::U64), rows),
            ]);
        }
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        let rows = RowBuffers::load(r, self.shard.logits)?;
        let [threshold, offset] = r.inputs(["threshold", "offset"])?;
        let residual = match self.draft_rows {
            0 => None,
            _ => Some(r.inputs(["draft", "draft_key", "draft_row", "target_mass", "draft_mass"])?),
        };
        let n = [self.shard.rows];
        let [tokens, mass, count] = r.outputs([
            ("tokens", DType::I32, &n),
            ("mass", DType::U64, &n),
            ("count", DType::U64, &n),
        ])?;
        let inputs = ShardWalkInputs {
            rows: rows.rows(),
            threshold: &threshold,
            offset: &offset,
            residual: residual.as_ref().map(|[draft, key, row, wp, wq]| ShardResidual {
                draft,
                draft_key: key,
                draft_row: row,
                target_mass: wp,
                draft_mass: wq,
            }),
        };
        let params = ShardWalkParams { shape: self.shard.shape() };
        device.shard_walk(&inputs, &mut ShardWalkOutputs { tokens, mass, count }, &params)?;
        Ok(())
    }
}

/// Row `r`'s keys and weights over `ids` of the whole rows.
fn keyed(whole: &WholeRows, r: usize, ids: std::ops::Range<usize>, row_key: u64) -> Vec<(u64, u64)> {
    let t = whole.temperature.as_ref().map(|t| t[r]);
    let weigher = SliceWeigher::new(row_key, t, None);
    let row = whole.row(r);
    ids.map(|id| (token_key(KeyOrder::Rank, whole.logits(), row[id], id), weigher.weight(row[id], id)))
        .collect()
}

/// A walk case: thresholds at a random rank of each whole row, offsets within the slice's kept
/// mass (some past it), and with `draft` REJECTION's residual against those rows.
fn case(name: String, rng: &mut Rng, whole: &WholeRows, slice: Slice, draft: Option<&WholeRows>) -> Case {
    let keys = whole.row_keys(KeyOrder::Rank);
    let mut threshold = Vec::new();
    let mut offset = Vec::new();
    let mut kept_mass = Vec::new();
    for (r, &row_key) in keys.iter().enumerate() {
        let mut all = keyed(whole, r, 0..whole.vocab, row_key);
        all.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
        let cut = all[rng.below(all.len())].0;
        let cut = if rng.below(5) == 0 { 0 } else { cut };
        threshold.push(cut);
        kept_mass.push(all.iter().filter(|(k, _)| *k >= cut).map(|(_, w)| w).sum::<u64>());
        let local: u64 = keyed(whole, r, slice.first..slice.first + slice.len, row_key)
            .iter()
            .filter(|(k, _)| *k >= cut)
            .map(|(_, w)| w)
            .sum();
        offset.push(match rng.below(6) {
            0 => u64::MAX,
            1 => local,
            _ => ((u128::from(rng.next_u64()) * u128::from(local.max(1))) >> 64) as u64,
        });
    }
    let params = Params {
        shard: whole.slice_rows(slice),
        draft_rows: draft.map_or(0, |d| d.rows),
    };
    let case = whole
        .to_case(Case::new(name, params), slice)
        .with("threshold", u64s(&threshold))
        .with("offset", u64s(&offset))
        .with("min_p", f32s(&min_ps(rng, whole.rows)));
    let Some(draft) = draft else { return case };
    let draft_keys = draft.row_keys(KeyOrder::Rank);
    let draft_row: Vec<i32> = (0..whole.rows)
        .map(|_| match rng.below(8) {
            0 => -1,
            1 => draft.rows as i32,
            _ => rng.below(draft.rows) as i32,
        })
        .collect();
    let draft_mass: Vec<u64> = draft_row
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d < draft.rows).map_or(0, |d| {
            keyed(draft, d, 0..draft.vocab, draft_keys[d]).iter().map(|(_, w)| w).sum()
        }))
        .collect();
    case.with("draft", float_tensor(whole.dtype, &[draft.rows, slice.len], &draft.cut(slice)))
        .with("draft_key", u64s(&draft_keys))
        .with("draft_row", i32s(&draft_row))
        .with("target_mass", u64s(&kept_mass))
        .with("draft_mass", u64s(&draft_mass))
}

/// Every case of `shard_walk`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (name, mut rng, shape) in shapes(size, "shard_walk", dtype) {
            let logits = rng.below(3) > 0;
            let whole = WholeRows::generate(&mut rng, dtype, shape, logits);
            let draft_shape = (rng.range(1, shape.0 + 1), shape.1);
            let mut draft = WholeRows::generate(&mut rng, dtype, draft_shape, logits);
            // A draft row is weighed at the temperature of the row it is checked against.
            draft.temperature = whole.temperature.clone().map(|_| vec![1.0; draft_shape.0]);
            for slice in slices_of(shape.1) {
                let name = format!("{name}::{}", slice.name());
                out.push(case(name.clone(), &mut rng, &whole, slice, None));
                out.push(case(format!("{name}::residual"), &mut rng, &whole, slice, Some(&draft)));
            }
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // Ids 2, 3, 4 of a row of 6 (0.25, 0.5, 0.25); the threshold is id 2's key, so ids 2 and 3
    // are kept (id 4 ties on value and comes after id 2): mass 2^38 + 2^39, count 2. An offset
    // of 2^38 ends the walk at id 3; u64::MAX walks past every token.
    let params = Params {
        shard: SliceRows::new(2, Slice::new(2, 3, 6), false),
        draft_rows: 0,
    };
    let cut = golden_key(0xBE80_0000, 2);
    vec![Case::new("golden::probs_kept_walk", params)
        .with("probs", f32s(&[0.25, 0.5, 0.25, 0.25, 0.5, 0.25]))
        .with("row_key", u64s(&[golden_key(0xBF00_0000, 3); 2]))
        .with("threshold", u64s(&[cut, cut]))
        .with("offset", u64s(&[1 << 38, u64::MAX]))
        .expect("tokens", i32s(&[3, -1]))
        .expect("mass", u64s(&[3 << 38, 3 << 38]))
        .expect("count", u64s(&[2, 2]))]
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("shard_walk/hostile", 1);
    let (rows, vocab) = (9, 257);
    let values = hostile_logit_rows(&mut rng, rows, vocab);
    let draft_values = hostile_logit_rows(&mut rng, 3, vocab);
    let slice = Slice::new(57, 200, vocab);
    let whole = WholeRows::of(DType::F16, (rows, vocab), values, Some(vec![-5.0; rows]));
    let draft = WholeRows::of(DType::F16, (3, vocab), draft_values, Some(vec![1.0; 3]));
    let garbage = |rng: &mut Rng, n: usize| -> Vec<u64> { (0..n).map(|_| rng.next_u64()).collect() };
    let params = Params { shard: SliceRows::new(rows, slice, true), draft_rows: 3 };
    vec![whole
        .to_case(Case::new("hostile::garbage_keys_masses_offsets", params), slice)
        .with("row_key", u64s(&garbage(&mut rng, rows)))
        .with("threshold", u64s(&garbage(&mut rng, rows)))
        .with("offset", u64s(&garbage(&mut rng, rows)))
        .with("draft", float_tensor(DType::F16, &[3, slice.len], &draft.cut(slice)))
        .with("draft_key", u64s(&garbage(&mut rng, 3)))
        .with("draft_row", i32s(&[0, 1, 2, -1, 3, i32::MAX, i32::MIN, 0, 2]))
        .with("target_mass", u64s(&garbage(&mut rng, rows)))
        .with("draft_mass", u64s(&garbage(&mut rng, rows)))]
}
