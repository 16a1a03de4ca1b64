//! Backend kinds, device descriptions and capabilities.

use crate::{DType, Op};

/// The kinds of backend Specula has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// The `rayon` CPU reference.
    Cpu,
    /// NVIDIA GPUs through `cudarc`.
    Cuda,
    /// Any Vulkan/Metal/DX12 GPU through `wgpu`.
    Wgpu,
    /// OpenCL kernels written in the style of Kunlun XPU kernels.
    XpuSim,
}

impl BackendKind {
    /// Every kind, in the registry's preference order for `auto` (fastest first, CPU last).
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Cuda,
        BackendKind::Wgpu,
        BackendKind::XpuSim,
        BackendKind::Cpu,
    ];

    /// The name used in the registry and in trial names (`cpu`, `cuda`, `wgpu`, `xpu-sim`).
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::XpuSim => "xpu-sim",
        }
    }
}

impl_named!(BackendKind, "backend");

/// What an opened device is.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The backend kind.
    pub kind: BackendKind,
    /// Index of the device within its backend (`wgpu:1` has ordinal 1).
    pub ordinal: usize,
    /// Human-readable device name (`llvmpipe`, `NVIDIA H200`, `cpu (2 threads)`).
    pub name: String,
    /// Driver or platform description.
    pub driver: String,
}

/// What a device can do; ops outside it return [`Error::Unsupported`](crate::Error::Unsupported).
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// Float dtypes accepted for probabilities, logits and the gathered hidden states.
    pub float_dtypes: Vec<DType>,
    /// Largest single buffer in bytes, if the device has a limit.
    pub max_buffer_bytes: Option<u64>,
    /// Whether the sampling ops (`top_k_top_p_sample`, `top_p_candidates`, REJECTION) accept
    /// logits rows (`Scores::Logits`, `docs/semantics.md` §4b).
    pub logits: bool,
    /// Whether the device runs `process_logits`, the `fallback` input of the sampling ops and the
    /// token counts of `update_state` (`docs/semantics.md` §4c).
    pub processing: bool,
    /// Whether `process_logits` processes one rank's slice of sharded rows
    /// ([`ProcessParams::slice`](crate::ops::ProcessParams::slice), `docs/semantics.md` §4d).
    /// Without it a slice is [`Error::Unsupported`](crate::Error::Unsupported).
    pub sliced_processing: bool,
    /// Whether `top_k_top_p_sample` applies `process_logits` to its rows itself
    /// ([`Device::top_k_top_p_sample_processed`](crate::Device::top_k_top_p_sample_processed)
    /// runs a fused kernel, reading the logits once and writing no processed rows): the gate of
    /// the op table's entry `top_k_top_p_sample_processed`. Without it the front runs that
    /// entry's fallback, the composition `process_logits` then `top_k_top_p_sample` through
    /// scratch buffers of every row; the results are the same (`docs/semantics.md` §5.12).
    pub fused_processing: bool,
    /// A hint for callers that process and sample a step's rows: the bytes of `f32` rows a block
    /// of rows should hold, so that `process_logits` of a block ([`RowBlock`](crate::ops::RowBlock))
    /// and the sampling op that reads it run while the block is in the device's caches (a CPU).
    /// `None`: all rows at once (a GPU).
    pub row_block_bytes: Option<usize>,
    /// Whether the device runs the per-rank ops of sharded rows (`shard_key`, `shard_records`,
    /// `shard_histogram`, `shard_walk`, `shard_exp_sum`; `docs/semantics.md` §4d). Without it they
    /// are [`Error::Unsupported`](crate::Error::Unsupported).
    pub sharded: bool,
}

impl Capabilities {
    /// Every op on every float dtype, with no buffer limit: logits rows, processing (sliced as
    /// well) and the sharded ops, but no fused processed sample and no row-block hint. A device
    /// states what it adds or lacks with struct update syntax
    /// (`Capabilities { fused_processing: true, ..Capabilities::every_op() }`).
    pub fn every_op() -> Self {
        Capabilities {
            float_dtypes: DType::FLOATS.to_vec(),
            max_buffer_bytes: None,
            logits: true,
            processing: true,
            sliced_processing: true,
            fused_processing: false,
            row_block_bytes: None,
            sharded: true,
        }
    }

    /// Whether `op` accepts float inputs of `dtype` on this device.
    pub fn supports(&self, op: Op, dtype: DType) -> bool {
        match op {
            // gather copies bits: integer rows are fine as well.
            Op::GatherNextToken => !dtype.is_float() || self.float_dtypes.contains(&dtype),
            _ => self.float_dtypes.contains(&dtype),
        }
    }

    /// Whether the device runs `op` at all (`process_logits` needs [`Capabilities::processing`];
    /// every other op of the table runs on every device). What a backend's warm-up builds
    /// kernels for.
    pub fn runs(&self, op: Op) -> bool {
        match op {
            Op::Memory => false,
            Op::ProcessLogits => self.processing,
            op if op.is_sharded() => self.sharded,
            _ => true,
        }
    }
}
