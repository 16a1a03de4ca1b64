//! `process_logits` (`docs/semantics.md` §5.12): not yet on this backend. Its capabilities say
//! `processing: false`, so the front answers `Unsupported` before this is reached.

use specula_backend_api::ops::ProcessLogitsCall;
use specula_backend_api::{BackendKind, Error, Op, Result};

use crate::runtime::Runtime;

/// Reports the op as unsupported on this backend.
pub(crate) fn run(_device: &Runtime, _call: ProcessLogitsCall<'_, '_>) -> Result<()> {
    Err(Error::Unsupported {
        backend: BackendKind::XpuSim,
        op: Op::ProcessLogits,
        what: "logits processing".to_owned(),
    })
}

/// No kernels yet.
pub(crate) const ARGS: &[super::ArgsStruct] = &[];
