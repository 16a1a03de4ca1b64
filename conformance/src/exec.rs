//! Running a case on a device: upload the inputs, surround every output with guard regions, run the
//! op, download the outputs and check the guards.

use std::collections::BTreeMap;

use specula_backend_api::ops::{HostSlotLens, OutputLayout, SlotLens};
use specula_backend_api::ops::{Logits, Scores};
use specula_backend_api::{Buffer, DType, Device, Element};

use specula_backend_api::Op;

use crate::case::TensorSpec;
use crate::tensor::HostTensor;
use crate::{ConformanceError, Result};

/// Bytes of guard region on each side of an output (a multiple of every binding-offset alignment
/// the GPU backends need).
pub const GUARD_BYTES: usize = 256;
/// The byte every guard region (and every output, before the op) is filled with.
pub const CANARY: u8 = 0xA5;

/// A write outside an output's window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardViolation {
    /// The output tensor.
    pub tensor: String,
    /// Element offset relative to the window start (negative: before it).
    pub element: i64,
}

/// What a device produced for a case.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// Output tensors by name (in/out buffers included, with their final contents).
    pub tensors: BTreeMap<String, HostTensor>,
    /// Writes outside the outputs' windows.
    pub guard_violations: Vec<GuardViolation>,
}

/// An output buffer inside a larger allocation, between two canary-filled guard regions.
struct Guarded {
    name: String,
    shape: Vec<usize>,
    guard: usize,
    buffer: Buffer,
}

/// What each op's case module implements: how to run its case through a [`Runner`].
pub(crate) trait OpCase {
    /// Uploads the case's inputs, calls the op with guarded outputs.
    fn run(&self, r: &mut Runner<'_>) -> Result<()>;

    /// The op's input tensors: names, dtypes, element counts (what a case file must hold).
    fn tensors(&self) -> Vec<TensorSpec>;

    /// The row length float outputs are reduced over (1 for ops whose outputs are exact).
    fn reduction_width(&self) -> usize {
        1
    }
}

/// The rows a sampling op draws from, uploaded: probabilities, or logits with their temperatures
/// (and the host copy of the temperatures unless the case is device-only).
pub(crate) struct ScoreBuffers {
    matrix: Buffer,
    temperature: Option<(Buffer, Option<Vec<f32>>)>,
}

impl ScoreBuffers {
    /// The buffers as the op's [`Scores`].
    pub(crate) fn scores(&self) -> Scores<'_> {
        match &self.temperature {
            None => Scores::Probs(&self.matrix),
            Some((temperature, host)) => Scores::Logits(Logits {
                logits: &self.matrix,
                temperature,
                host_temperature: host.as_deref(),
            }),
        }
    }
}

/// What a [`Runner`] reads of a case: its name and op (for messages), its input tensors, those
/// that go to a foreign device, and whether it holds device-only contents.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CaseInputs<'a> {
    pub(crate) name: &'a str,
    pub(crate) op: Op,
    pub(crate) inputs: &'a BTreeMap<String, HostTensor>,
    pub(crate) foreign: &'a [String],
    pub(crate) device_only: bool,
}

/// Runs one case on one device: uploads inputs, allocates guarded outputs, collects them.
pub(crate) struct Runner<'a> {
    device: &'a dyn Device,
    /// The device that holds the case's `foreign` inputs (opened on first use).
    foreign: Option<Box<dyn Device>>,
    case: CaseInputs<'a>,
    guarded: Vec<Guarded>,
}

impl<'a> Runner<'a> {
    /// A runner of `case` on `device`.
    pub(crate) fn new(device: &'a dyn Device, case: CaseInputs<'a>) -> Self {
        Runner {
            device,
            foreign: None,
            case,
            guarded: Vec::new(),
        }
    }

    /// The values of input tensor `name`, whether or not the case is device-only (what every
    /// rank of a sharded run holds as its replicated host parameters).
    pub(crate) fn values<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        self.tensor(name)?.to_vec::<T>()
    }

    /// The device under test.
    pub(crate) fn device(&self) -> &'a dyn Device {
        self.device
    }

    fn tensor(&self, name: &str) -> Result<&'a HostTensor> {
        self.case.inputs.get(name).ok_or_else(|| {
            ConformanceError::Format(format!(
                "case {} ({}) has no input tensor `{name}`",
                self.case.name, self.case.op
            ))
        })
    }

    /// Uploads an input tensor as a plain buffer (to the foreign device when the case says so).
    pub(crate) fn input(&mut self, name: &str) -> Result<Buffer> {
        let t = self.tensor(name)?;
        if self.case.foreign.iter().any(|f| f == name) {
            let foreign = match &mut self.foreign {
                Some(device) => device,
                slot => slot.insert(Box::new(specula_reference::ReferenceDevice::new())),
            };
            return Ok(foreign.upload_bytes(t.dtype, &t.bytes)?);
        }
        Ok(self.device.upload_bytes(t.dtype, &t.bytes)?)
    }

    /// Uploads an optional input tensor.
    pub(crate) fn optional(&mut self, name: &str) -> Result<Option<Buffer>> {
        match self.case.inputs.contains_key(name) {
            true => self.input(name).map(Some),
            false => Ok(None),
        }
    }

    /// The scores of a sampling op: the tensor `probs_name`, or with `logits` the tensor
    /// `logits_name` and the temperatures `temperature`.
    pub(crate) fn scores(
        &mut self,
        logits: bool,
        probs_name: &str,
        logits_name: &str,
    ) -> Result<ScoreBuffers> {
        if !logits {
            let matrix = self.input(probs_name)?;
            return Ok(ScoreBuffers {
                matrix,
                temperature: None,
            });
        }
        let host = self.host::<f32>("temperature")?;
        let [matrix, temperature] = self.inputs([logits_name, "temperature"])?;
        Ok(ScoreBuffers {
            matrix,
            temperature: Some((temperature, host)),
        })
    }

    /// The host copy of an input tensor, unless the case holds device-only contents (then the op
    /// gets no host copy and skips host validation).
    pub(crate) fn host<T: Element>(&self, name: &str) -> Result<Option<Vec<T>>> {
        if self.case.device_only {
            return Ok(None);
        }
        Ok(Some(self.tensor(name)?.to_vec::<T>()?))
    }

    /// Host copies of `seq_lens_this_time` and `seq_lens_encoder` (see [`Runner::host`]).
    pub(crate) fn host_lens(&self) -> Result<Option<HostLens>> {
        let this_time = self.host::<i32>("seq_lens_this_time")?;
        let encoder = self.host::<i32>("seq_lens_encoder")?;
        Ok(this_time
            .zip(encoder)
            .map(|(this_time, encoder)| HostLens { this_time, encoder }))
    }

    /// Uploads the input tensors `names`, in order (see [`Runner::input`]).
    pub(crate) fn inputs<const N: usize>(&mut self, names: [&str; N]) -> Result<[Buffer; N]> {
        let buffers: Vec<Buffer> = names
            .iter()
            .map(|name| self.input(name))
            .collect::<Result<_>>()?;
        Ok(buffers
            .try_into()
            .unwrap_or_else(|_| unreachable!("one buffer per name")))
    }

    /// Uploads `seq_lens_this_time` and `seq_lens_encoder`.
    pub(crate) fn lens(&mut self) -> Result<LensBuffers> {
        self.inputs(["seq_lens_this_time", "seq_lens_encoder"])
            .map(LensBuffers)
    }

    /// Uploads `cu_seqlens_q_output` and `batch_id_per_token_output`.
    pub(crate) fn layout(&mut self) -> Result<LayoutBuffers> {
        self.inputs(["cu_seqlens_q_output", "batch_id_per_token_output"])
            .map(LayoutBuffers)
    }

    fn guarded(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Option<&[u8]>,
    ) -> Result<usize> {
        let size = dtype.size_bytes();
        let guard = GUARD_BYTES / size;
        let len: usize = shape.iter().product();
        let mut bytes = vec![CANARY; (len + 2 * guard) * size];
        if let Some(init) = init {
            bytes[guard * size..guard * size + init.len()].copy_from_slice(init);
        }
        let mut buffer = self.device.upload_bytes(dtype, &bytes)?;
        buffer.set_window(guard, len)?;
        self.guarded.push(Guarded {
            name: name.to_owned(),
            shape: shape.to_vec(),
            guard,
            buffer,
        });
        Ok(self.guarded.len() - 1)
    }

    /// Guarded outputs `(name, dtype, shape)`, filled with the canary before the op, as disjoint
    /// `&mut` borrows.
    pub(crate) fn outputs<const N: usize>(
        &mut self,
        specs: [(&str, DType, &[usize]); N],
    ) -> Result<[&mut Buffer; N]> {
        let mut indices = [0; N];
        for (index, (name, dtype, shape)) in indices.iter_mut().zip(specs) {
            *index = self.guarded(name, dtype, shape, None)?;
        }
        Ok(self.pick(indices))
    }

    /// Guarded in/out buffers, each holding the input tensor of the same name, as disjoint `&mut`
    /// borrows.
    pub(crate) fn inouts<const N: usize>(&mut self, names: [&str; N]) -> Result<[&mut Buffer; N]> {
        let mut indices = [0; N];
        for (index, name) in indices.iter_mut().zip(names) {
            let t = self.tensor(name)?;
            *index = self.guarded(name, t.dtype, &t.shape, Some(&t.bytes))?;
        }
        Ok(self.pick(indices))
    }

    /// The guarded buffers `indices` as disjoint `&mut` borrows.
    fn pick<const N: usize>(&mut self, indices: [usize; N]) -> [&mut Buffer; N] {
        let mut refs: Vec<Option<&mut Buffer>> = self
            .guarded
            .iter_mut()
            .map(|g| Some(&mut g.buffer))
            .collect();
        indices.map(|i| {
            refs[i]
                .take()
                .unwrap_or_else(|| unreachable!("each guarded buffer is picked once"))
        })
    }

    /// Downloads every guarded buffer and checks its guards.
    pub(crate) fn finish(self) -> Result<Outputs> {
        let mut outputs = Outputs::default();
        self.device.synchronize()?;
        for mut g in self.guarded {
            let len = g.buffer.len();
            let dtype = g.buffer.dtype();
            g.buffer.reset_window();
            let all = self.device.download_bytes(&g.buffer)?;
            let size = dtype.size_bytes();
            let window = &all[g.guard * size..(g.guard + len) * size];
            for (i, chunk) in all.chunks_exact(size).enumerate() {
                let inside = i >= g.guard && i < g.guard + len;
                if !inside && chunk.iter().any(|&b| b != CANARY) {
                    outputs.guard_violations.push(GuardViolation {
                        tensor: g.name.clone(),
                        element: i as i64 - g.guard as i64,
                    });
                }
            }
            outputs.tensors.insert(
                g.name,
                HostTensor::from_bytes(dtype, g.shape, window.to_vec())?,
            );
        }
        Ok(outputs)
    }
}

/// Uploads the input tensors named as the fields of an op's struct of read buffers, binds each
/// buffer to its field's name and `$var` to the struct of their borrows: each name written once.
///
/// `named_inputs!(r, let inputs = SoftmaxInputs { logits, temperature });` is
/// `let [logits, temperature] = r.inputs(["logits", "temperature"])?;` followed by
/// `let inputs = SoftmaxInputs { logits: &logits, temperature: &temperature };`.
macro_rules! named_inputs {
    ($r:expr, let $var:ident = $ty:ident { $($field:ident),+ $(,)? }) => {
        let [$($field),+] = $r.inputs([$(stringify!($field)),+])?;
        let $var = $ty { $($field: &$field),+ };
    };
}
pub(crate) use named_inputs;

/// The struct `$ty` of the guarded in/out tensors named as its fields ([`Runner::inouts`]), each
/// name written once; `$rest` gives its other fields.
///
/// `named_inouts!(r, NgramOutputs { draft_tokens, seq_lens_this_time })` is
/// `NgramOutputs { draft_tokens, seq_lens_this_time }` of
/// `r.inouts(["draft_tokens", "seq_lens_this_time"])?`.
///
/// With `+ $opt if $cond`, the struct's optional field `$opt` is the tensor of that name when
/// `$cond` holds, else `None`.
macro_rules! named_inouts {
    ($r:expr, $ty:ident { $($field:ident),+ $(,)? } $(, $rest:ident: $value:expr)*) => {{
        let [$($field),+] = $r.inouts([$(stringify!($field)),+])?;
        $ty { $($field,)+ $($rest: $value),* }
    }};
    ($r:expr, $ty:ident { $($field:ident),+ $(,)? } + $opt:ident if $cond:expr) => {
        if $cond {
            let [$($field,)+ $opt] = $r.inouts([$(stringify!($field),)+ stringify!($opt)])?;
            $ty { $($field,)+ $opt: Some($opt) }
        } else {
            named_inouts!($r, $ty { $($field),+ }, $opt: None)
        }
    };
}
pub(crate) use named_inouts;

/// Host copies of a case's slot lengths (from [`Runner::host_lens`]).
pub(crate) struct HostLens {
    this_time: Vec<i32>,
    encoder: Vec<i32>,
}

impl HostLens {
    /// The copies as an op's host-side lengths.
    pub(crate) fn slot_lens(&self) -> HostSlotLens<'_> {
        HostSlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        }
    }
}

/// `seq_lens_this_time` and `seq_lens_encoder` on the device (from [`Runner::lens`]).
pub(crate) struct LensBuffers([Buffer; 2]);

impl LensBuffers {
    /// The buffers as an op's slot lengths.
    pub(crate) fn slot_lens(&self) -> SlotLens<'_> {
        let [this_time, encoder] = &self.0;
        SlotLens {
            seq_lens_this_time: this_time,
            seq_lens_encoder: encoder,
        }
    }
}

/// `cu_seqlens_q_output` and `batch_id_per_token_output` on the device (from
/// [`Runner::layout`]).
pub(crate) struct LayoutBuffers([Buffer; 2]);

impl LayoutBuffers {
    /// The buffers as an op's output layout.
    pub(crate) fn output_layout(&self) -> OutputLayout<'_> {
        let [cu_seqlens_q_output, batch_id_per_token_output] = &self.0;
        OutputLayout {
            cu_seqlens_q_output,
            batch_id_per_token_output,
        }
    }

    /// The rows of `batch_id_per_token_output`.
    pub(crate) fn rows(&self) -> usize {
        self.0[1].len()
    }
}
