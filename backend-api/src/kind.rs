//! Backend kinds, op names, device descriptions and capabilities.

use std::fmt;
use std::str::FromStr;

use crate::{DType, Error};

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

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::Parse {
                what: "backend",
                input: s.to_owned(),
            })
    }
}

/// The ops of the contract (plus the memory operations), for errors, spans and trial names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Allocation, upload, download.
    Memory,
    /// `build_output_layout` (contract §1).
    BuildOutputLayout,
    /// `gather_next_token` (§4.1).
    GatherNextToken,
    /// `build_sampling_params` (§2).
    BuildSamplingParams,
    /// `argmax` (§4.2).
    Argmax,
    /// `softmax` (§4.9).
    Softmax,
    /// `top_k_top_p_sample` (§4.3).
    TopKTopPSample,
    /// `top_p_candidates` (§4.4).
    TopPCandidates,
    /// `verify_draft_tokens` (§4.5).
    VerifyDraftTokens,
    /// `update_state` (§4.6).
    UpdateState,
    /// `ngram_match` (§4.7).
    NgramMatch,
    /// `accept_logprobs` (§4.8).
    AcceptLogprobs,
}

impl Op {
    /// Every op of the contract (memory operations excluded).
    pub const ALL: [Op; 11] = [
        Op::BuildOutputLayout,
        Op::GatherNextToken,
        Op::BuildSamplingParams,
        Op::Argmax,
        Op::Softmax,
        Op::TopKTopPSample,
        Op::TopPCandidates,
        Op::VerifyDraftTokens,
        Op::UpdateState,
        Op::NgramMatch,
        Op::AcceptLogprobs,
    ];

    /// The snake_case name, as in kernel file names and entry points.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Memory => "memory",
            Op::BuildOutputLayout => "build_output_layout",
            Op::GatherNextToken => "gather_next_token",
            Op::BuildSamplingParams => "build_sampling_params",
            Op::Argmax => "argmax",
            Op::Softmax => "softmax",
            Op::TopKTopPSample => "top_k_top_p_sample",
            Op::TopPCandidates => "top_p_candidates",
            Op::VerifyDraftTokens => "verify_draft_tokens",
            Op::UpdateState => "update_state",
            Op::NgramMatch => "ngram_match",
            Op::AcceptLogprobs => "accept_logprobs",
        }
    }

    /// The kernel entry-point name for this op and dtype, identical on every backend
    /// (`top_k_top_p_sample_f32`).
    pub fn entry_point(self, dtype: DType) -> String {
        format!("{}_{}", self.name(), dtype.name())
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Op::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| Error::Parse {
                what: "op",
                input: s.to_owned(),
            })
    }
}

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

/// What a device can do; ops outside it return [`Error::Unsupported`].
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// Float dtypes accepted for probabilities, logits and the gathered hidden states.
    pub float_dtypes: Vec<DType>,
    /// Largest single buffer in bytes, if the device has a limit.
    pub max_buffer_bytes: Option<u64>,
}

impl Capabilities {
    /// Whether `op` accepts float inputs of `dtype` on this device.
    pub fn supports(&self, op: Op, dtype: DType) -> bool {
        match op {
            // gather copies bits: integer rows are fine as well.
            Op::GatherNextToken => !dtype.is_float() || self.float_dtypes.contains(&dtype),
            _ => self.float_dtypes.contains(&dtype),
        }
    }
}
