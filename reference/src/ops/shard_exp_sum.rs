//! `shard_exp_sum` (`docs/semantics.md` §5.17): the slice's share of the softmax normaliser.

use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::{Op, Result};

use super::softmax::{effective_temperature, interleaved_sum, scaled};
use crate::ReferenceDevice;
use crate::matrix::FloatMatrix;
use crate::shard::value_of;

/// Runs a validated `shard_exp_sum` call.
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, sums, params, dtype) = call.parts();
    let shape = params.shape;
    let logits = FloatMatrix::new(
        Op::ShardExpSum,
        *dtype,
        inputs.logits,
        shape.rows,
        shape.slice.len,
    )?;
    let temperature = slice::<f32>(inputs.temperature)?;
    let row_key = slice::<u64>(inputs.row_key)?;
    for (r, sum) in slice_mut::<f32>(sums)?.iter_mut().enumerate() {
        let Some(row) = logits.row(r) else { continue };
        let (m, t) = (value_of(row_key[r]), effective_temperature(temperature[r]));
        *sum = if t == 0.0 || m == f32::NEG_INFINITY {
            0.0
        } else if m == f32::INFINITY {
            row.iter().filter(|&&l| l == f32::INFINITY).count() as f32
        } else {
            interleaved_sum(row.iter().map(|&l| scaled(l, m, t).exp()))
        };
    }
    Ok(())
}
