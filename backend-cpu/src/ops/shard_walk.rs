//! `shard_walk` (`docs/semantics.md` §5.16): per row, one pass over the slice in ascending id
//! order summing the kept weights (or REJECTION's residual) and noting where the running sum
//! first exceeds the offset. Rows in parallel.

use rayon::prelude::*;
use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::ShardResidual;
use specula_backend_api::ops::shard_walk::OpCall;
use specula_backend_api::shard::{KeyOrder, SliceWeigher, residual, residual_shift};
use specula_backend_api::{FloatElement, Op, Result};

use super::sharded::SliceRows;
use super::with_float;
use crate::CpuDevice;

/// A row's walk: the slice's total, the kept count and the token where the walk ends.
#[derive(Clone, Copy, Debug, Default)]
struct Walk {
    token: i32,
    mass: u64,
    count: u64,
}

/// The draft side of REJECTION's residual, in the rows' element type.
struct Draft<'a, T> {
    rows: &'a [T],
    key: &'a [u64],
    row: &'a [i32],
    target_mass: &'a [u64],
    draft_mass: &'a [u64],
}

impl<'a, T: FloatElement> Draft<'a, T> {
    fn new(r: &ShardResidual<'a>) -> Result<Self> {
        Ok(Draft {
            rows: slice::<T>(r.draft)?,
            key: slice::<u64>(r.draft_key)?,
            row: slice::<i32>(r.draft_row)?,
            target_mass: slice::<u64>(r.target_mass)?,
            draft_mass: slice::<u64>(r.draft_mass)?,
        })
    }
}

/// Runs a validated `shard_walk` call.
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let threshold = slice::<u64>(inputs.threshold)?;
    let offset = slice::<u64>(inputs.offset)?;
    let len = params.shape.slice.len;
    let mut walks = vec![Walk::default(); params.shape.rows];
    device.install(|| {
        with_float!(kind.dtype, Op::ShardWalk, T => {
            let rows = SliceRows::<T>::new(&inputs.rows, &params.shape)?;
            let draft = inputs.residual.as_ref().map(Draft::<T>::new).transpose()?;
            walks.par_iter_mut().enumerate().for_each(|(r, walk)| {
                let row = rows.row(r);
                let kept_weight = |weigher: &SliceWeigher, j: usize| {
                    let x = row[j].to_f32();
                    let kept = rows.key(KeyOrder::Rank, x, j) >= threshold[r];
                    (kept, if kept { weigher.weight(x, rows.first + j) } else { 0 })
                };
                let weigher = rows.weigher(r);
                *walk = match &draft {
                    None => walk_row(len, offset[r], rows.first, |j| kept_weight(&weigher, j)),
                    Some(d) => {
                        let draft_row = usize::try_from(d.row[r])
                            .ok()
                            .filter(|&q| q < d.key.len());
                        let masses = (d.target_mass[r], d.draft_mass[r]);
                        let shift = residual_shift(rows.logits, masses.0, masses.1);
                        let q_weigher = draft_row.map(|q| {
                            (SliceWeigher::new(d.key[q], rows.temperature(r), None), q)
                        });
                        walk_row(len, offset[r], rows.first, |j| {
                            let (kept, wp) = kept_weight(&weigher, j);
                            let rho = q_weigher.map_or(0, |(qw, q)| {
                                let x = d.rows[q * len + j].to_f32();
                                residual(wp, qw.weight(x, rows.first + j), masses, shift)
                            });
                            (kept, rho)
                        })
                    }
                };
            });
            Ok(())
        })
    })?;
    let tokens = slice_mut::<i32>(out.tokens)?;
    for (t, w) in tokens.iter_mut().zip(&walks) {
        *t = w.token;
    }
    let mass = slice_mut::<u64>(out.mass)?;
    for (m, w) in mass.iter_mut().zip(&walks) {
        *m = w.mass;
    }
    let count = slice_mut::<u64>(out.count)?;
    for (c, w) in count.iter_mut().zip(&walks) {
        *c = w.count;
    }
    Ok(())
}

/// Walks positions `0 .. len` with `weight(j) = (kept, w)`: the total of `w`, the number kept,
/// and the global id where the running total first exceeds `offset` (-1 if it never does).
#[inline]
fn walk_row(len: usize, offset: u64, first: usize, weight: impl Fn(usize) -> (bool, u64)) -> Walk {
    let mut walk = Walk {
        token: -1,
        ..Walk::default()
    };
    for j in 0..len {
        let (kept, w) = weight(j);
        walk.count += u64::from(kept);
        walk.mass = walk.mass.saturating_add(w);
        if walk.token < 0 && walk.mass > offset {
            walk.token = (first + j) as i32;
        }
    }
    walk
}
