//! `shard_walk` (`docs/semantics.md` §5.16): the slice's kept (or residual) weights, summed and
//! walked in ascending id order.

use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::ShardResidual;
use specula_backend_api::ops::shard_walk::OpCall;
use specula_backend_api::shard::KeyOrder;
use specula_backend_api::{Op, Result};

use super::sharded::SliceRows;
use crate::ReferenceDevice;
use crate::matrix::FloatMatrix;
use crate::shard::{Weigher, key};

const OP: Op = Op::ShardWalk;

/// REJECTION's residual of a row against its draft row (`docs/semantics.md` §5.8).
struct Residual<'a> {
    draft: FloatMatrix<'a>,
    draft_key: &'a [u64],
    draft_row: &'a [i32],
    target_mass: &'a [u64],
    draft_mass: &'a [u64],
}

impl<'a> Residual<'a> {
    fn new(dtype: specula_backend_api::DType, r: &ShardResidual<'a>, len: usize) -> Result<Self> {
        let draft_rows = r.draft.len() / len;
        Ok(Residual {
            draft: FloatMatrix::new(OP, dtype, r.draft, draft_rows, len)?,
            draft_key: slice::<u64>(r.draft_key)?,
            draft_row: slice::<i32>(r.draft_row)?,
            target_mass: slice::<u64>(r.target_mass)?,
            draft_mass: slice::<u64>(r.draft_mass)?,
        })
    }

    /// `ρ` of every token of row `r`, from its kept weights `wp`; all 0 without a draft row.
    fn of_row(&self, r: usize, wp: &[u64], temperature: Option<f32>, first: usize) -> Vec<u64> {
        let row = usize::try_from(self.draft_row[r]).ok();
        let Some((q, d)) = row.and_then(|d| Some((self.draft.row(d)?, d))) else {
            return vec![0; wp.len()];
        };
        let weigher = Weigher::new(self.draft_key[d], temperature, None);
        let (big_p, big_q) = (self.target_mass[r], self.draft_mass[r]);
        let shift = match temperature {
            None => 41,
            Some(_) => {
                let bits = |x: u64| 64 - u64::from(x.leading_zeros());
                (bits(big_p) + bits(big_q)).saturating_sub(60)
            }
        };
        (0..wp.len())
            .map(|j| {
                let wq = weigher.weight(q[j], first + j);
                let plus = u128::from(wp[j]) * u128::from(big_q);
                let minus = u128::from(wq) * u128::from(big_p);
                let rho = if plus > minus {
                    (plus - minus) >> shift
                } else {
                    0
                };
                u64::try_from(rho).unwrap_or(u64::MAX)
            })
            .collect()
    }
}

/// Runs a validated `shard_walk` call.
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let shape = params.shape;
    let rows = SliceRows::new(OP, *kind, &inputs.rows, &shape)?;
    let first = shape.slice.first;
    let threshold = slice::<u64>(inputs.threshold)?;
    let offset = slice::<u64>(inputs.offset)?;
    let residual = match &inputs.residual {
        Some(r) => Some(Residual::new(kind.dtype, r, shape.slice.len)?),
        None => None,
    };
    let tokens = slice_mut::<i32>(out.tokens)?;
    let mass = slice_mut::<u64>(out.mass)?;
    let count = slice_mut::<u64>(out.count)?;
    for r in 0..shape.rows {
        let Some((values, weigher)) = rows.row(r) else {
            continue;
        };
        let kept: Vec<bool> = (0..values.len())
            .map(|j| key(KeyOrder::Rank, kind.logits, values[j], first + j) >= threshold[r])
            .collect();
        let wp: Vec<u64> = (0..values.len())
            .map(|j| {
                if kept[j] {
                    weigher.weight(values[j], first + j)
                } else {
                    0
                }
            })
            .collect();
        let walked = match &residual {
            Some(res) => res.of_row(r, &wp, rows.temperature(r), first),
            None => wp,
        };
        count[r] = kept.iter().filter(|&&k| k).count() as u64;
        // Saturating (§5.16): garbage masses can make the residual of every token huge.
        mass[r] = walked.iter().fold(0u64, |m, &w| m.saturating_add(w));
        tokens[r] = -1;
        let mut running = 0u64;
        for (j, &w) in walked.iter().enumerate() {
            running = running.saturating_add(w);
            if running > offset[r] {
                tokens[r] = (first + j) as i32;
                break;
            }
        }
    }
    Ok(())
}
