//! `process_logits` (`docs/semantics.md` §5.12): work in progress.

use specula_backend_api::ops::process_logits::OpCall;
use specula_backend_api::{BackendKind, Error, Op, Result};

use crate::CpuDevice;

/// Work in progress.
pub(crate) fn run(_device: &CpuDevice, _call: OpCall<'_, '_>) -> Result<()> {
    Err(Error::Unsupported {
        backend: BackendKind::Cpu,
        op: Op::ProcessLogits,
        what: "logits processing".to_owned(),
    })
}
