//! Host code of each op: validated arguments become bindings, uniform parameters and dispatches,
//! recorded and submitted together (one submission per op call; nothing is read back).

pub(crate) mod layout;
pub(crate) mod logprobs;
pub(crate) mod rows;
pub(crate) mod state;
pub(crate) mod verify;

use specula_backend_api::{Buffer, Op, Result};

use crate::gpu::{Bound, Dispatch};
use crate::kernels::{Kernel, WG};

/// A count as a kernel parameter (inputs are validated far below `u32::MAX`; saturate anyway).
pub(crate) fn u(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// Workgroups for `n` invocations of `per` each.
pub(crate) fn groups_for(n: usize, per: u32) -> u32 {
    u(n.div_ceil(per as usize))
}

/// Collects the bindings of one dispatch and their element offsets (passed as parameters, so any
/// window works whatever the adapter's binding-offset alignment).
pub(crate) struct Binder<'d> {
    device: &'d crate::WgpuDevice,
    op: Op,
    pub(crate) bindings: Vec<(u32, Bound)>,
    pub(crate) offsets: Vec<u32>,
}

impl<'d> Binder<'d> {
    pub(crate) fn new(device: &'d crate::WgpuDevice, op: Op) -> Self {
        Binder {
            device,
            op,
            bindings: Vec::new(),
            offsets: Vec::new(),
        }
    }

    /// Binds a whole buffer window and records its offset parameter.
    pub(crate) fn buffer(&mut self, binding: u32, buffer: &Buffer) -> Result<()> {
        let bound = self.device.gpu.bind(self.op, buffer)?;
        self.offsets.push(bound.index);
        self.bindings.push((binding, bound));
        Ok(())
    }

    /// Binds an already computed range and records its offset parameter.
    pub(crate) fn bound(&mut self, binding: u32, bound: Bound) {
        self.offsets.push(bound.index);
        self.bindings.push((binding, bound));
    }

    /// Binds a placeholder (no offset parameter).
    pub(crate) fn dummy(&mut self, binding: u32) {
        self.bindings.push((binding, self.device.gpu.dummy()));
    }

    pub(crate) fn dispatch(
        self,
        kernel: Kernel,
        entry: String,
        params_binding: u32,
        params: Vec<u32>,
        groups: u32,
    ) -> Dispatch {
        Dispatch {
            kernel,
            entry,
            params_binding,
            params,
            bindings: self.bindings,
            groups,
        }
    }
}

/// Workgroups of a per-element kernel with WG invocations per group.
pub(crate) fn element_groups(n: usize) -> u32 {
    groups_for(n, WG)
}
