//! Op arguments, parameters and their host-side validation: one file per op, named as the op.
//!
//! Every op takes its input buffers as a `*Inputs` struct of shared references, its outputs as a
//! `*Outputs` struct of `&mut` buffers (or one `&mut Buffer`), and a small `Copy` parameter struct.
//! Each op's `validate` is called by the front ([`Device`](crate::Device)) before any backend
//! runs, and is the only way to build the op's [`Call`](crate::backend::Call): every backend
//! rejects the same arguments with the same typed [`Error`] (`docs/semantics.md` §6).

pub mod accept_logprobs;
pub mod argmax;
pub mod build_output_layout;
pub mod build_sampling_params;
pub mod gather_next_token;
pub mod ngram_match;
pub mod process_logits;
pub mod shard_exp_sum;
pub mod shard_histogram;
pub mod shard_key;
pub mod shard_records;
pub mod shard_walk;
pub mod sharded;
pub mod softmax;
pub mod top_k_top_p_sample;
pub mod top_k_top_p_sample_processed;
pub mod top_p_candidates;
pub mod update_state;
pub mod verify_draft_tokens;

pub use accept_logprobs::{
    AcceptLogprobsCall, LogprobsBuffers, LogprobsInputs, LogprobsOutputs, LogprobsParams,
};
pub use argmax::ArgmaxCall;
pub use build_output_layout::{BuildOutputLayoutCall, LayoutOutputs, LayoutParams};
pub use build_sampling_params::{
    BuildSamplingParamsCall, RowSamplingParams, SamplingParamsInputs, SamplingParamsParams,
    SlotSamplingParams,
};
pub use gather_next_token::{GatherInputs, GatherNextTokenCall, GatherParams};
pub use ngram_match::{NgramInputs, NgramMatchCall, NgramOutputs, NgramParams};
pub use process_logits::{
    HostProcessing, ProcessInputs, ProcessLogitsCall, ProcessOutputs, ProcessParams,
    ProcessingTables, RowBlock, RowProcessing, SlotProcessing, TokenHistory,
};
pub use shard_exp_sum::{ShardExpSumCall, ShardExpSumInputs, ShardExpSumParams};
pub use shard_histogram::{
    ShardHistogramCall, ShardHistogramInputs, ShardHistogramOutputs, ShardHistogramParams,
};
pub use shard_key::{ShardKeyCall, ShardKeyInputs, ShardKeyParams};
pub use shard_records::{ShardRecordsCall, ShardRecordsParams};
pub use shard_walk::{
    ShardResidual, ShardWalkCall, ShardWalkInputs, ShardWalkOutputs, ShardWalkParams,
};
pub use sharded::{ShardRows, ShardShape, VocabSlice};
pub use softmax::{SoftmaxCall, SoftmaxInputs, SoftmaxParams};
pub use top_k_top_p_sample::{SampleInputs, SampleParams, TopKTopPSampleCall};
pub use top_k_top_p_sample_processed::{ProcessedSampleCall, ProcessedSampleFacts};
pub use top_p_candidates::{
    CandidatesInputs, CandidatesOutputs, CandidatesParams, TopPCandidatesCall,
};
pub use update_state::{DecodeState, UpdateStateCall, UpdateStateInputs, UpdateStateParams};
pub use verify_draft_tokens::{
    CandidateInputs, RejectionInputs, Strategy, StrategyInputs, VerifyDraftTokensCall, VerifyFacts,
    VerifyInputs, VerifyOutputs, VerifyParams, VerifySlotState,
};

use crate::call::DeviceDesc;
use crate::{Buffer, DType, Error, Op, Result};

/// The batch shape shared by the batch-level ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchDims {
    /// Number of request slots (`max_bsz`).
    pub max_bsz: usize,
    /// Slots `0 .. real_bsz` are described this step; the others produce nothing.
    pub real_bsz: usize,
    /// `S`: the most tokens a decode slot feeds in one step (1 + the most drafts).
    pub max_step_tokens: usize,
}

impl BatchDims {
    /// A batch of `max_bsz` slots, `0 .. real_bsz` described this step, at most `max_step_tokens`
    /// (`S`) tokens a decode slot.
    pub const fn new(max_bsz: usize, real_bsz: usize, max_step_tokens: usize) -> Self {
        BatchDims {
            max_bsz,
            real_bsz,
            max_step_tokens,
        }
    }

    /// The number of output rows a step can produce at most: `real_bsz · S` (saturating, so an
    /// absurd shape fails the buffer-size checks instead of overflowing).
    pub fn max_output_rows(&self) -> usize {
        self.real_bsz.saturating_mul(self.max_step_tokens)
    }

    /// Validates `real_bsz ≤ max_bsz` and `1 ≤ S ≤ MAX_HOST_LENGTH` (`i32::MAX`).
    pub fn validate(&self, op: Op) -> Result<()> {
        let s = self.max_step_tokens;
        if !(1..=crate::abi::MAX_HOST_LENGTH).contains(&s) {
            return Err(Error::invalid(
                op,
                "max_step_tokens",
                format!("1 ..= {}", crate::abi::MAX_HOST_LENGTH),
                s,
            ));
        }
        if self.real_bsz > self.max_bsz {
            return Err(Error::invalid(
                op,
                "real_bsz",
                format!("<= max_bsz {}", self.max_bsz),
                self.real_bsz,
            ));
        }
        Ok(())
    }
}

/// Host-side copies of the slot lengths, when the caller has them: they let an op check the slot
/// rules of the batch layout (`docs/semantics.md` §2) and the row counts of its buffers before
/// launch.
#[derive(Clone, Copy, Debug)]
pub struct HostSlotLens<'a> {
    /// `seq_lens_this_time`, at least `real_bsz` entries.
    pub seq_lens_this_time: &'a [i32],
    /// `seq_lens_encoder`, at least `real_bsz` entries.
    pub seq_lens_encoder: &'a [i32],
}

impl HostSlotLens<'_> {
    /// Checks the slot rules for slots `0 .. real_bsz` and returns `T_out`, the number of output rows.
    pub fn validate(&self, op: Op, dims: &BatchDims) -> Result<usize> {
        for (arg, lens) in [
            ("host seq_lens_this_time", self.seq_lens_this_time),
            ("host seq_lens_encoder", self.seq_lens_encoder),
        ] {
            if lens.len() < dims.real_bsz {
                return Err(Error::ShapeMismatch {
                    op,
                    arg,
                    expected: dims.real_bsz,
                    actual: lens.len(),
                });
            }
        }
        let mut rows = 0;
        for b in 0..dims.real_bsz {
            let this_time = self.seq_lens_this_time[b];
            let encoder = self.seq_lens_encoder[b];
            if this_time < 0 {
                return Err(Error::invalid(
                    op,
                    "seq_lens_this_time",
                    format!("slot {b}: >= 0"),
                    this_time,
                ));
            }
            if encoder < 0 {
                return Err(Error::invalid(
                    op,
                    "seq_lens_encoder",
                    format!("slot {b}: >= 0"),
                    encoder,
                ));
            }
            match crate::slots::slot_kind(this_time, encoder) {
                crate::slots::SlotKind::Empty => {}
                crate::slots::SlotKind::Prefill => {
                    if this_time != encoder {
                        return Err(Error::invalid(
                            op,
                            "seq_lens_this_time",
                            format!("slot {b} (prefill): == seq_lens_encoder {encoder}"),
                            this_time,
                        ));
                    }
                    rows += 1;
                }
                crate::slots::SlotKind::Decode => {
                    if this_time as usize > dims.max_step_tokens {
                        return Err(Error::invalid(
                            op,
                            "seq_lens_this_time",
                            format!("slot {b} (decode): <= S {}", dims.max_step_tokens),
                            this_time,
                        ));
                    }
                    rows += this_time as usize;
                }
            }
        }
        Ok(rows)
    }
}

/// Checks buffers for one op on one device: dtype, element count, owning device, and that the
/// device supports the dtype of a float input.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Check<'d> {
    /// The op being validated.
    pub(crate) op: Op,
    /// The device it runs on.
    device: &'d DeviceDesc,
}

impl<'d> Check<'d> {
    /// A checker for `op` on `device`.
    pub(crate) fn new(op: Op, device: &'d DeviceDesc) -> Self {
        Check { op, device }
    }

    fn owner(&self, arg: &'static str, buffer: &Buffer) -> Result<()> {
        if buffer.device() != self.device.id {
            return Err(Error::DeviceMismatch {
                op: self.op,
                arg,
                expected: self.device.id.0,
                actual: buffer.device().0,
            });
        }
        Ok(())
    }

    /// [`Error::Unsupported`] unless the device runs this op on `dtype`.
    pub(crate) fn supported(&self, dtype: DType) -> Result<DType> {
        if !self.device.capabilities.supports(self.op, dtype) {
            return Err(Error::Unsupported {
                backend: self.device.info.kind,
                op: self.op,
                what: format!("dtype {dtype}"),
            });
        }
        Ok(dtype)
    }

    fn dtype(&self, arg: &'static str, buffer: &Buffer, dtype: DType) -> Result<()> {
        if buffer.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op: self.op,
                arg,
                expected: dtype.name().to_owned(),
                actual: buffer.dtype(),
            });
        }
        Ok(())
    }

    fn len(&self, arg: &'static str, buffer: &Buffer, len: usize) -> Result<()> {
        if buffer.len() != len {
            return Err(Error::ShapeMismatch {
                op: self.op,
                arg,
                expected: len,
                actual: buffer.len(),
            });
        }
        Ok(())
    }

    /// A buffer of exactly `len` elements of `dtype` on this device.
    pub(crate) fn exact(
        &self,
        arg: &'static str,
        buffer: &Buffer,
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        self.owner(arg, buffer)?;
        self.dtype(arg, buffer, dtype)?;
        self.len(arg, buffer, len)
    }

    /// A buffer of at least `min_len` elements of `dtype` on this device; returns its length.
    pub(crate) fn at_least(
        &self,
        arg: &'static str,
        buffer: &Buffer,
        dtype: DType,
        min_len: usize,
    ) -> Result<usize> {
        self.owner(arg, buffer)?;
        self.dtype(arg, buffer, dtype)?;
        if buffer.len() < min_len {
            return Err(Error::ShapeMismatch {
                op: self.op,
                arg,
                expected: min_len,
                actual: buffer.len(),
            });
        }
        Ok(buffer.len())
    }

    /// A float buffer (f32, f16 or bf16) of exactly `len` elements; returns its dtype.
    pub(crate) fn float(&self, arg: &'static str, buffer: &Buffer, len: usize) -> Result<DType> {
        self.owner(arg, buffer)?;
        if !buffer.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op: self.op,
                arg,
                expected: "f32|f16|bf16".to_owned(),
                actual: buffer.dtype(),
            });
        }
        self.len(arg, buffer, len)?;
        self.supported(buffer.dtype())
    }

    /// A float buffer (f32, f16 or bf16) of a whole number `n ≥ 1` of rows of `vocab` elements;
    /// returns its dtype and `n`.
    pub(crate) fn float_rows(
        &self,
        arg: &'static str,
        buffer: &Buffer,
        vocab: usize,
    ) -> Result<(DType, usize)> {
        let dtype = self.float(arg, buffer, buffer.len())?;
        let rows = buffer.len() / vocab.max(1);
        if rows == 0 || !buffer.len().is_multiple_of(vocab.max(1)) {
            return Err(Error::invalid(
                self.op,
                arg,
                format!("a whole number >= 1 of rows of {vocab}"),
                buffer.len(),
            ));
        }
        Ok((dtype, rows))
    }

    /// A vocabulary size in `1 ..= 2^20`.
    pub(crate) fn vocab(&self, vocab: usize) -> Result<()> {
        if vocab == 0 || vocab > crate::abi::MAX_VOCAB {
            return Err(Error::invalid(
                self.op,
                "vocab",
                format!("1 ..= {}", crate::abi::MAX_VOCAB),
                vocab,
            ));
        }
        Ok(())
    }

    /// Host-side `top_p` values, each in (0, 1].
    pub(crate) fn host_top_p(&self, top_p: Option<&[f32]>, len: usize) -> Result<()> {
        let Some(top_p) = top_p else { return Ok(()) };
        if top_p.len() != len {
            return Err(Error::ShapeMismatch {
                op: self.op,
                arg: "host top_p",
                expected: len,
                actual: top_p.len(),
            });
        }
        if let Some((i, p)) = top_p
            .iter()
            .enumerate()
            .find(|(_, p)| !(**p > 0.0 && **p <= 1.0))
        {
            return Err(Error::invalid(
                self.op,
                "top_p",
                format!("entry {i} in (0, 1]"),
                p,
            ));
        }
        Ok(())
    }

    /// Host-side temperatures, each finite-or-infinite but ≥ 0 and not NaN.
    pub(crate) fn host_temperature(&self, temperature: Option<&[f32]>, len: usize) -> Result<()> {
        let Some(temperature) = temperature else {
            return Ok(());
        };
        if temperature.len() != len {
            return Err(Error::ShapeMismatch {
                op: self.op,
                arg: "host temperature",
                expected: len,
                actual: temperature.len(),
            });
        }
        if let Some((i, t)) = temperature
            .iter()
            .enumerate()
            .find(|(_, t)| t.is_nan() || **t < 0.0)
        {
            return Err(Error::invalid(
                self.op,
                "temperature",
                format!("entry {i} >= 0 and not NaN"),
                t,
            ));
        }
        Ok(())
    }

    /// [`Error::Unsupported`] unless the device runs the ops of sharded rows.
    pub(crate) fn sharded(&self) -> Result<()> {
        if !self.device.capabilities.sharded {
            return Err(Error::Unsupported {
                backend: self.device.info.kind,
                op: self.op,
                what: "sharded rows".to_owned(),
            });
        }
        Ok(())
    }

    /// An optional `[rows]` i32 `fallback` input (`process_logits`), which needs a device with
    /// logits processing.
    pub(crate) fn fallback(&self, fallback: Option<&Buffer>, rows: usize) -> Result<()> {
        let Some(fallback) = fallback else {
            return Ok(());
        };
        if !self.device.capabilities.processing {
            return Err(Error::Unsupported {
                backend: self.device.info.kind,
                op: self.op,
                what: "a fallback input (logits processing)".to_owned(),
            });
        }
        self.exact("fallback", fallback, DType::I32, rows)
    }

    /// The element count `a · b`, or an error when it overflows.
    pub(crate) fn product(&self, arg: &'static str, a: usize, b: usize) -> Result<usize> {
        a.checked_mul(b).ok_or_else(|| {
            Error::invalid(
                self.op,
                arg,
                "a size that fits in usize",
                format!("{a} x {b}"),
            )
        })
    }
}

/// The per-slot lengths on device (`docs/semantics.md` §2), `[max_bsz]` i32 each.
#[derive(Clone, Copy, Debug)]
pub struct SlotLens<'a> {
    /// Tokens fed this step per slot.
    pub seq_lens_this_time: &'a Buffer,
    /// Prompt tokens of a prefill slot (> 0: prefill).
    pub seq_lens_encoder: &'a Buffer,
}

impl SlotLens<'_> {
    /// Validates both `[max_bsz]` i32 buffers.
    pub(crate) fn validate(&self, check: &Check<'_>, dims: &BatchDims) -> Result<()> {
        check.exact(
            "seq_lens_this_time",
            self.seq_lens_this_time,
            DType::I32,
            dims.max_bsz,
        )?;
        check.exact(
            "seq_lens_encoder",
            self.seq_lens_encoder,
            DType::I32,
            dims.max_bsz,
        )
    }
}

/// The output layout on device, as `build_output_layout` writes it.
#[derive(Clone, Copy, Debug)]
pub struct OutputLayout<'a> {
    /// `[real_bsz + 1]` i32: exclusive prefix sum of the output rows per slot.
    pub cu_seqlens_q_output: &'a Buffer,
    /// `[rows]` i32 with `rows ≥ real_bsz · S`: the slot of each output row, -1 for padding rows.
    pub batch_id_per_token_output: &'a Buffer,
}

impl OutputLayout<'_> {
    /// Validates the layout buffers and returns the output-row capacity.
    pub(crate) fn validate(&self, check: &Check<'_>, dims: &BatchDims) -> Result<usize> {
        check.exact(
            "cu_seqlens_q_output",
            self.cu_seqlens_q_output,
            DType::I32,
            dims.real_bsz + 1,
        )?;
        check.at_least(
            "batch_id_per_token_output",
            self.batch_id_per_token_output,
            DType::I32,
            dims.max_output_rows(),
        )
    }
}

/// The shape of a `[rows, vocab]` matrix of probabilities or logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    /// Number of rows `R`.
    pub rows: usize,
    /// Vocabulary size `V`, in `1 ..= 2^20`.
    pub vocab: usize,
}

impl RowShape {
    /// Checks the vocabulary and a float `[rows, vocab]` buffer; returns its dtype.
    pub(crate) fn validate_matrix(
        &self,
        check: &Check<'_>,
        arg: &'static str,
        buffer: &Buffer,
    ) -> Result<DType> {
        check.vocab(self.vocab)?;
        let len = check.product(arg, self.rows, self.vocab)?;
        check.float(arg, buffer, len)
    }
}

/// Checks `1 ≤ C ≤ 128`.
pub(crate) fn check_candidates_count(check: &Check<'_>, candidates: usize) -> Result<()> {
    if candidates == 0 || candidates > crate::abi::MAX_CANDIDATES {
        return Err(Error::invalid(
            check.op,
            "candidates",
            format!("1 ..= {}", crate::abi::MAX_CANDIDATES),
            candidates,
        ));
    }
    Ok(())
}

/// The rows a sampling op draws from: probabilities, or logits with a per-row temperature (the
/// integer weights of `docs/semantics.md` §4b, no softmax).
#[derive(Clone, Copy, Debug)]
pub enum Scores<'a> {
    /// `[rows, V]` probabilities (f32, f16 or bf16), weighed `w(p) = floor(sanitize(p) · 2^40)`.
    Probs(&'a Buffer),
    /// `[rows, V]` logits with a per-row temperature, weighed as `docs/semantics.md` §4b says.
    Logits(Logits<'a>),
}

/// Logits rows and their per-row temperature.
#[derive(Clone, Copy, Debug)]
pub struct Logits<'a> {
    /// `[rows, V]` logits (f32, f16 or bf16).
    pub logits: &'a Buffer,
    /// `[rows]` f32 temperatures (device values that are NaN or negative count as 1.0; 0 is the
    /// argmax, +inf weighs every finite logit alike).
    pub temperature: &'a Buffer,
    /// Host copy of the temperatures, for validation (each ≥ 0 and not NaN).
    pub host_temperature: Option<&'a [f32]>,
}

impl<'a> Scores<'a> {
    /// Probabilities.
    pub fn probs(probs: &'a Buffer) -> Self {
        Scores::Probs(probs)
    }

    /// Logits at the per-row `temperature`, without a host copy.
    pub fn logits(logits: &'a Buffer, temperature: &'a Buffer) -> Self {
        Scores::Logits(Logits {
            logits,
            temperature,
            host_temperature: None,
        })
    }

    /// The `[rows, V]` matrix.
    pub fn matrix(&self) -> &'a Buffer {
        match self {
            Scores::Probs(probs) => probs,
            Scores::Logits(l) => l.logits,
        }
    }

    /// The per-row temperatures of logits rows.
    pub fn temperature(&self) -> Option<&'a Buffer> {
        match self {
            Scores::Probs(_) => None,
            Scores::Logits(l) => Some(l.temperature),
        }
    }

    /// Whether the rows are logits.
    pub fn is_logits(&self) -> bool {
        matches!(self, Scores::Logits(_))
    }

    /// Checks the `[rows, vocab]` matrix (named `<prefix>probs` or `<prefix>logits` in errors) and
    /// a logits row's temperatures.
    pub(crate) fn validate(
        &self,
        check: &Check<'_>,
        names: (&'static str, &'static str),
        shape: &RowShape,
    ) -> Result<ScoresKind> {
        let arg = if self.is_logits() { names.1 } else { names.0 };
        if self.is_logits() && !check.device.capabilities.logits {
            return Err(Error::Unsupported {
                backend: check.device.info.kind,
                op: check.op,
                what: "logits rows".to_owned(),
            });
        }
        let dtype = shape.validate_matrix(check, arg, self.matrix())?;
        if let Scores::Logits(l) = self {
            check.exact("temperature", l.temperature, DType::F32, shape.rows)?;
            check.host_temperature(l.host_temperature, shape.rows)?;
        }
        Ok(ScoresKind {
            dtype,
            logits: self.is_logits(),
        })
    }
}

/// What validation derived about [`Scores`]: the matrix dtype and whether it holds logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoresKind {
    /// f32, f16 or bf16.
    pub dtype: DType,
    /// Logits (weighed by `docs/semantics.md` §4b) rather than probabilities.
    pub logits: bool,
}
