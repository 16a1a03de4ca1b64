//! Op arguments, parameters and their host-side validation.
//!
//! Every op takes its input buffers as a `*Inputs` struct of shared references, its outputs as a
//! `*Outputs` struct of `&mut` buffers, and a small `Copy` parameter struct. The `validate` function
//! of each op is called by every backend before launch, so all backends reject the same arguments
//! with the same typed [`Error`].

mod layout;
mod logprobs;
mod rows;
mod state;
mod verify;

pub use layout::*;
pub use logprobs::*;
pub use rows::*;
pub use state::*;
pub use verify::*;

use crate::{Buffer, DType, DeviceId, Error, Op, Result};

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
    /// The number of output rows a step can produce at most: `real_bsz · S` (saturating, so an
    /// absurd shape fails the buffer-size checks instead of overflowing).
    pub fn max_output_rows(&self) -> usize {
        self.real_bsz.saturating_mul(self.max_step_tokens)
    }

    /// Validates `real_bsz ≤ max_bsz` and `S ≥ 1`.
    pub fn validate(&self, op: Op) -> Result<()> {
        if self.max_step_tokens < 1 {
            return Err(Error::invalid(op, "max_step_tokens", ">= 1", 0));
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
/// rules of the contract (§1) and the row counts of its buffers before launch.
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

/// Checks buffers for one op on one device: dtype, element count, owning device.
#[derive(Clone, Copy, Debug)]
pub struct Check {
    /// The op being validated.
    pub op: Op,
    /// The device it runs on.
    pub device: DeviceId,
}

impl Check {
    /// A checker for `op` on `device`.
    pub fn new(op: Op, device: DeviceId) -> Self {
        Check { op, device }
    }

    fn owner(&self, arg: &'static str, buffer: &Buffer) -> Result<()> {
        if buffer.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: self.op,
                arg,
                expected: self.device.0,
                actual: buffer.device().0,
            });
        }
        Ok(())
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
    pub fn exact(
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
    pub fn at_least(
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
    pub fn float(&self, arg: &'static str, buffer: &Buffer, len: usize) -> Result<DType> {
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
        Ok(buffer.dtype())
    }

    /// A vocabulary size in `1 ..= 2^20`.
    pub fn vocab(&self, vocab: usize) -> Result<()> {
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
    pub fn host_top_p(&self, top_p: Option<&[f32]>, len: usize) -> Result<()> {
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
    pub fn host_temperature(&self, temperature: Option<&[f32]>, len: usize) -> Result<()> {
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

    /// The element count `a · b`, or an error when it overflows.
    pub fn product(&self, arg: &'static str, a: usize, b: usize) -> Result<usize> {
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
