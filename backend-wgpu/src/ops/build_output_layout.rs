//! `build_output_layout` (`shaders/build_output_layout.wgsl`): two dispatches, the prefix sums (one
//! invocation), then the slot of every output row (parallel).

use specula_backend_api::ops::BuildOutputLayoutCall;
use specula_backend_api::{DType, Op, Result};

use super::{Binder, element_groups, u};
use crate::WgpuDevice;
use crate::kernels::{BatchHead, Entry, Kernel, KernelFacts};

specula_backend_api::kernel_args! {
    /// `build_output_layout_i32`, after its [`BatchHead`]: rows per slot and both prefix sums.
    pub(crate) struct BuildOutputLayoutArgs {
        this_time_off: u32,
        encoder_off: u32,
        seq_lens_output_off: u32,
        cu_q_off: u32,
        cu_out_off: u32,
    }

    /// `build_output_layout_rows_i32`: the slot of every output row.
    pub(crate) struct BuildOutputLayoutRowsArgs {
        real_bsz: u32,
        capacity: u32,
        cu_out_off: u32,
        batch_id_off: u32,
    }
}

/// `build_output_layout_i32`.
const SUMS: Entry<BuildOutputLayoutArgs, BatchHead> =
    Entry::new(Kernel::BuildOutputLayout, None, 0);
/// `build_output_layout_rows_i32`.
const ROWS: Entry<BuildOutputLayoutRowsArgs> =
    Entry::new(Kernel::BuildOutputLayout, Some("rows"), 6);

/// The facts of `shaders/build_output_layout.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::batch(&[SUMS.args(), ROWS.args()]);

/// Records and submits both dispatches.
pub(crate) fn run(device: &WgpuDevice, mut call: BuildOutputLayoutCall<'_, '_>) -> Result<()> {
    let op = Op::BuildOutputLayout;
    let (lens, out, params, &capacity) = call.parts();
    let dims = &params.dims;
    let mut b = Binder::new(device, op);
    let args = BuildOutputLayoutArgs {
        this_time_off: b.buffer(1, lens.seq_lens_this_time)?,
        encoder_off: b.buffer(2, lens.seq_lens_encoder)?,
        seq_lens_output_off: b.buffer(3, out.seq_lens_output)?,
        cu_q_off: b.buffer(4, out.cu_seqlens_q)?,
        cu_out_off: b.buffer(5, out.cu_seqlens_q_output)?,
    };
    let sums = b.batch_dispatch(&SUMS, dims, &args, 1);

    let mut b = Binder::new(device, op);
    let args = BuildOutputLayoutRowsArgs {
        real_bsz: u(dims.real_bsz),
        capacity: u(capacity),
        cu_out_off: b.buffer(7, out.cu_seqlens_q_output)?,
        batch_id_off: b.buffer(8, out.batch_id_per_token_output)?,
    };
    let rows = b.dispatch(&ROWS, DType::I32, &args, element_groups(capacity));
    device.gpu.run(op, vec![sums, rows])
}
