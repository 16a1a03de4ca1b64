//! `shard_exp_sum` (`docs/semantics.md` §5.17, `shaders/shard_exp_sum.wgsl`): not yet written for this backend.
//!
//! The device reports `Capabilities::sharded = false`, so the front answers
//! `Error::Unsupported` before a call reaches `run`; `run` answers the same if it is ever called.

use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::{BackendKind, Error, Op, Result};

use crate::WgpuDevice;
use crate::kernels::ArgsStruct;

/// Reports the op unsupported on this backend.
pub(crate) fn run(_device: &WgpuDevice, _call: OpCall<'_, '_>) -> Result<()> {
    Err(Error::Unsupported {
        backend: BackendKind::Wgpu,
        op: Op::ShardExpSum,
        what: "sharded rows (its kernel is not written yet)".to_owned(),
    })
}

/// The argument structs of `shaders/shard_exp_sum.wgsl`: none until its kernels are written.
pub(crate) const ARGS: &[ArgsStruct] = &[];
