//! `shard_exp_sum` (`docs/semantics.md` §5.17): per row, the slice's `Σ exp((l − m) / T)` under
//! the whole row's maximum, in 8 interleaved partial sums. Rows in parallel.

use rayon::prelude::*;
use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::shard::key_value;
use specula_backend_api::{FloatElement, Op, Result};

use super::with_float;
use crate::CpuDevice;

/// The partial sums of the normaliser (as the softmax and `accept_logprobs` rows).
const PARTIAL_SUMS: usize = 8;

/// Runs a validated `shard_exp_sum` call.
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, sums, params, dtype) = call.parts();
    let len = params.shape.slice.len;
    let temperature = slice::<f32>(inputs.temperature)?;
    let row_key = slice::<u64>(inputs.row_key)?;
    let sums = slice_mut::<f32>(sums)?;
    device.install(|| {
        with_float!(*dtype, Op::ShardExpSum, T => {
            let logits = slice::<T>(inputs.logits)?;
            sums.par_iter_mut()
                .zip(logits.par_chunks(len))
                .enumerate()
                .for_each(|(r, (sum, row))| {
                    *sum = row_sum(row, key_value(row_key[r]), temperature[r]);
                });
            Ok(())
        })
    })
}

/// One row: 0 at `T == 0` or a −inf maximum, the count of +inf logits at a +inf maximum, else
/// the sum of `exp((l − m) / T)` (NaN and −inf logits add 0; `T = +inf` scales finite ones to 0).
fn row_sum<T: FloatElement>(row: &[T], m: f32, t: f32) -> f32 {
    let t = if t.is_nan() || t < 0.0 { 1.0 } else { t };
    if t == 0.0 || m == f32::NEG_INFINITY {
        return 0.0;
    }
    if m == f32::INFINITY {
        return row.iter().filter(|x| x.to_f32() == f32::INFINITY).count() as f32;
    }
    let mut partial = [0.0f32; PARTIAL_SUMS];
    for (i, x) in row.iter().enumerate() {
        let l = x.to_f32();
        let y = if l.is_nan() || l == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else if t == f32::INFINITY {
            0.0
        } else {
            (l - m) / t
        };
        partial[i % PARTIAL_SUMS] += y.exp();
    }
    partial.iter().fold(0.0, |sum, &p| sum + p)
}
