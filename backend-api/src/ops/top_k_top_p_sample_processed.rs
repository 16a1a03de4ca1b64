//! `top_k_top_p_sample_processed` (`docs/semantics.md` §5.12), a gated entry of the op table:
//! `top_k_top_p_sample` of the rows `process_logits` makes, for a device that applies the
//! processing as its sampling pass reads the scores
//! ([`Capabilities::fused_processing`](crate::Capabilities::fused_processing)). Arguments and
//! validation; on any other device the front runs the composition (`fallback.rs`).

use super::process_logits::{ProcessInputs, ProcessParams, RowProcessing, validate_processing};
use super::top_k_top_p_sample::{SampleInputs, SampleParams, validate as validate_sample};
use super::{Check, ScoresKind};
use crate::call::{Call, DeviceDesc};
use crate::{BackendKind, Buffer, Error, Op, Result};

/// A validated `top_k_top_p_sample` that applies `process_logits` to its rows itself: the
/// sampling call (no `fallback` input) and the processing of every row of its scores. Output
/// `tokens [rows]` i32. Nothing to launch when `rows == 0`.
pub type ProcessedSampleCall<'c> = Call<
    'c,
    (SampleInputs<'c>, ProcessInputs<'c>),
    Buffer,
    (SampleParams<'c>, ProcessParams<'c>),
    ProcessedSampleFacts,
>;

/// The entry's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ProcessedSampleCall<'c>;

/// What validation derived for a fused processed sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessedSampleFacts {
    /// The scores' dtype and kind.
    pub scores: ScoresKind,
    /// The backend of the device the call was validated for (for the error of a backend that
    /// sets the capability but does not run the entry: [`not_dispatched`]).
    pub backend: BackendKind,
}

/// Validates the fused `top_k_top_p_sample` of processed rows: the sampling op's checks (its
/// `fallback` input must be absent: the processing makes it) and `process_logits`' checks of
/// every row of the scores. Errors name [`Op::TopKTopPSample`].
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    (inputs, processing): (&SampleInputs<'c>, &RowProcessing<'c>),
    tokens: &'c mut Buffer,
    params: &SampleParams<'c>,
) -> Result<ProcessedSampleCall<'c>> {
    let check = Check::new(Op::TopKTopPSample, device);
    if inputs.fallback.is_some() {
        return Err(Error::invalid(
            check.op,
            "fallback",
            "none: the processing makes the fallbacks",
            "a buffer",
        ));
    }
    let sample = validate_sample(device, inputs, tokens, params)?;
    let (launches_nothing, extent) = (sample.launches_nothing(), sample.extent());
    let process_inputs = processing.inputs(inputs.scores);
    let process_params = processing.params(params.shape);
    let (scores, _) = validate_processing(&check, device, &process_inputs, &process_params)?;
    let tokens = sample.into_out();
    let facts = ProcessedSampleFacts {
        scores,
        backend: device.info.kind,
    };
    let call = Call::new(
        (*inputs, process_inputs),
        tokens,
        (*params, process_params),
        facts,
    );
    Ok(call
        .with_extent(extent.0, extent.1)
        .launching_nothing_if(launches_nothing))
}

/// The error of a backend that received the entry without naming its host code in
/// [`dispatch_ops!`](crate::dispatch_ops): [`Error::Unsupported`], as before the entry existed.
/// The front only sends the entry to a device that sets
/// [`Capabilities::fused_processing`](crate::Capabilities::fused_processing).
pub fn not_dispatched(call: &ProcessedSampleCall<'_>) -> Error {
    Error::Unsupported {
        backend: call.facts().backend,
        op: Op::TopKTopPSample,
        what: "fused logits processing".to_owned(),
    }
}
