//! The fallbacks of the op table's gated entries ([`__gated_op_table!`](crate::__gated_op_table)):
//! what the front runs for an entry on a device without the entry's capability, one function per
//! entry, named as the entry. Each composes ops of the table on the backend, so every device
//! answers every entry the same way and the backends write no composition of their own.

use crate::backend::{AnyCall, Backend};
use crate::call::Alloc;
use crate::ops::top_k_top_p_sample::validate as validate_sample;
use crate::ops::{ProcessOutputs, ProcessedSampleCall, SampleInputs, Scores, process_logits};
use crate::{DType, Result};

macro_rules! run_or_fall_back {
    ($($gated:ident $gname:ident $base:ident $capability:ident $section:literal $summary:literal,)*) => {
        /// Runs a validated call with something to do: on the backend, except a gated entry on
        /// a device without its capability, which runs the entry's fallback.
        pub(crate) fn run<B: Backend + ?Sized>(backend: &B, call: AnyCall<'_, '_>) -> Result<()> {
            let capabilities = &backend.desc().capabilities;
            match call {
                $(AnyCall::$gated(call) if !capabilities.$capability => $gname(backend, call),)*
                call => backend.run(call),
            }
        }
    };
}

crate::__gated_op_table! { [] run_or_fall_back }

/// Runs a validated op call on the backend unless it writes nothing.
fn run_op<B: Backend + ?Sized>(backend: &B, call: AnyCall<'_, '_>) -> Result<()> {
    if call.launches_nothing() {
        return Ok(());
    }
    backend.run(call)
}

/// `top_k_top_p_sample_processed` as the composition `docs/semantics.md` §5.12 defines:
/// `process_logits` of every row into scratch rows and fallbacks the backend allocates, then
/// `top_k_top_p_sample` of the processed rows with that `fallback` input (identical by
/// construction; the reference device runs it so, and stays the oracle).
fn top_k_top_p_sample_processed<B: Backend + ?Sized>(
    backend: &B,
    call: ProcessedSampleCall<'_>,
) -> Result<()> {
    let desc = backend.desc();
    let (sample, processing) = *call.inputs();
    let (sample_params, process_params) = *call.params();
    let tokens = call.into_out();
    let (rows, vocab) = (sample_params.shape.rows, sample_params.shape.vocab);
    // Validation multiplied `rows · vocab` without overflow.
    let mut processed =
        backend.run_alloc_zeroed(Alloc::checked(desc, DType::F32, rows * vocab)?)?;
    let mut fallback = backend.run_alloc_zeroed(Alloc::checked(desc, DType::I32, rows)?)?;
    let mut outputs = ProcessOutputs {
        processed: &mut processed,
        fallback: &mut fallback,
    };
    let process = process_logits::validate(desc, &processing, &mut outputs, &process_params)?;
    run_op(backend, AnyCall::ProcessLogits(process))?;
    let scores = match sample.scores.temperature() {
        Some(temperature) => Scores::logits(&processed, temperature),
        None => Scores::Probs(&processed),
    };
    let inputs = SampleInputs {
        scores,
        fallback: Some(&fallback),
        ..sample
    };
    let sample = validate_sample(desc, &inputs, tokens, &sample_params)?;
    run_op(backend, AnyCall::TopKTopPSample(sample))
}
