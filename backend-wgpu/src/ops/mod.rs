//! Host code of each op, one file per op, named as the op (mirroring `shaders/<op>.wgsl`): the
//! validated call becomes bindings, one typed argument struct per kernel and dispatches, recorded
//! and submitted together (one submission per op call; nothing is read back).
//!
//! Every kernel's uniform parameters are a [`kernel_args!`](specula_backend_api::kernel_args)
//! struct declared beside the op's host code with the kernel's [`Entry`] (entry point, uniform
//! binding and the [`Head`] before the struct: the row kernels' [`RowHead`], which
//! [`row_chunk_dispatches`] fills). The module's `KERNEL` ([`KernelFacts`]) lists them, with the
//! shared WGSL files the shader module is built on and its float kernels; `Kernel::facts`
//! collects every op's from the op table. The WGSL `struct` of the same name (head fields first)
//! is generated from each into the shader module (`kernels.rs`, checked with naga by its tests).
//! WGSL has no 64-bit integers, so a 64-bit value is two `u32` fields `*_lo`, `*_hi`; every field
//! is a `u32`, so the uniform layout is `4·i` with no padding.

pub(crate) mod accept_logprobs;
pub(crate) mod argmax;
pub(crate) mod build_output_layout;
pub(crate) mod build_sampling_params;
pub(crate) mod gather_next_token;
pub(crate) mod ngram_match;
pub(crate) mod process_logits;
pub(crate) mod shard_exp_sum;
pub(crate) mod shard_histogram;
pub(crate) mod shard_key;
pub(crate) mod shard_records;
pub(crate) mod shard_walk;
pub(crate) mod sharded;
pub(crate) mod softmax;
pub(crate) mod top_k_top_p_sample;
pub(crate) mod top_p_candidates;
pub(crate) mod update_state;
pub(crate) mod verify_draft_tokens;

use specula_backend_api::abi::KernelArgs;
use specula_backend_api::ops::{BatchDims, RowShape};
use specula_backend_api::{Buffer, DType, Op, Result};

use crate::WgpuDevice;
use crate::gpu::{Bound, Dispatch, WgpuStorage};
use crate::kernels::{BatchHead, Entry, Head, Kernel, KernelFacts, RowHead, WG};
pub(crate) use crate::words::{split_u64, u};

/// Collects the `KERNEL` of every op module from the op table.
macro_rules! kernel_facts {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        impl Kernel {
            /// What the op's host code (`ops/<op>.rs`, its `KERNEL`) declares about this module:
            /// the shared files it is built on, its float kernels and its argument structs.
            /// Generated from the op table, so an op without its facts does not compile.
            pub(crate) const fn facts(self) -> &'static KernelFacts {
                match self {
                    $(Kernel::$variant => &$name::KERNEL,)*
                }
            }
        }
    };
}

specula_backend_api::for_each_op!(kernel_facts);

/// Workgroups for `n` invocations of `per` each.
pub(crate) fn groups_for(n: usize, per: u32) -> u32 {
    u(n.div_ceil(per as usize))
}

/// Workgroups of a per-element kernel with WG invocations per group.
pub(crate) fn element_groups(n: usize) -> u32 {
    groups_for(n, WG)
}

/// Row chunks of a `[rows, row_len]` matrix, or one empty chunk when there are no rows (for the
/// ops whose first dispatch must still run to write the outputs of rows without a source).
pub(crate) fn chunks_or_empty(
    device: &WgpuDevice,
    matrix: &Buffer,
    rows: usize,
    row_len: usize,
) -> Vec<(usize, usize)> {
    let chunks = device.gpu.row_chunks(matrix, rows, row_len);
    if chunks.is_empty() {
        vec![(0, 0)]
    } else {
        chunks
    }
}

/// Collects the bindings of one dispatch. Each binding method returns the element offset of the
/// window inside its binding, which the caller stores in the kernel's argument struct (so any
/// window works whatever the adapter's binding-offset alignment).
pub(crate) struct Binder<'d> {
    device: &'d WgpuDevice,
    op: Op,
    bindings: Vec<(u32, Bound)>,
}

impl<'d> Binder<'d> {
    pub(crate) fn new(device: &'d WgpuDevice, op: Op) -> Self {
        Binder {
            device,
            op,
            bindings: Vec::new(),
        }
    }

    /// Binds a whole buffer window; returns its element offset.
    pub(crate) fn buffer(&mut self, binding: u32, buffer: &Buffer) -> Result<u32> {
        let bound = self.device.gpu.bind(self.op, buffer)?;
        Ok(self.bound(binding, bound))
    }

    /// Binds rows `lo .. hi` of a `[rows, row_len]` matrix; returns their element offset.
    pub(crate) fn rows(
        &mut self,
        binding: u32,
        matrix: &Buffer,
        row_len: usize,
        chunk: (usize, usize),
    ) -> Result<u32> {
        let bound = self.device.gpu.bind_rows(self.op, matrix, row_len, chunk)?;
        Ok(self.bound(binding, bound))
    }

    /// Binds an already computed range; returns its element offset.
    pub(crate) fn bound(&mut self, binding: u32, bound: Bound) -> u32 {
        let index = bound.index;
        self.bindings.push((binding, bound));
        index
    }

    /// Binds a whole internal scratch buffer (offset 0).
    pub(crate) fn scratch(&mut self, binding: u32, storage: &WgpuStorage) {
        self.bindings
            .push((binding, self.device.gpu.bind_scratch(storage)));
    }

    /// Binds an optional buffer's whole window, or the placeholder when it is absent; returns its
    /// element offset.
    pub(crate) fn optional(&mut self, binding: u32, buffer: Option<&Buffer>) -> Result<u32> {
        match buffer {
            Some(buffer) => self.buffer(binding, buffer),
            None => Ok(self.dummy(binding)),
        }
    }

    /// Binds a placeholder for a binding this call does not use; returns its offset (0).
    pub(crate) fn dummy(&mut self, binding: u32) -> u32 {
        self.bound(binding, self.device.gpu.dummy())
    }

    /// The dispatch of `kernel`'s entry point for `dtype` over `groups` workgroups, with `args`
    /// as its uniform.
    pub(crate) fn dispatch<A: KernelArgs + bytemuck::Pod>(
        self,
        kernel: &Entry<A>,
        dtype: DType,
        args: &A,
        groups: u32,
    ) -> Dispatch {
        self.dispatch_with_head(kernel, dtype, (&(), args), groups)
    }

    /// The dispatch of the batch kernel `kernel`'s `i32` entry point over `groups` workgroups,
    /// with the [`BatchHead`] of `dims` then `args` as its uniform.
    pub(crate) fn batch_dispatch<A: KernelArgs + bytemuck::Pod>(
        self,
        kernel: &Entry<A, BatchHead>,
        dims: &BatchDims,
        args: &A,
        groups: u32,
    ) -> Dispatch {
        self.dispatch_with_head(kernel, DType::I32, (&BatchHead::of(dims), args), groups)
    }

    /// The dispatch of `kernel`'s entry point for `dtype` over `groups` workgroups, with `head`
    /// then `args` as its uniform.
    pub(crate) fn dispatch_with_head<A: KernelArgs + bytemuck::Pod, H: Head>(
        self,
        kernel: &Entry<A, H>,
        dtype: DType,
        (head, args): (&H, &A),
        groups: u32,
    ) -> Dispatch {
        Dispatch {
            kernel: kernel.kernel(),
            entry: kernel.name(dtype),
            params_binding: kernel.args_binding(),
            params: [bytemuck::bytes_of(head), bytemuck::bytes_of(args)].concat(),
            bindings: self.bindings,
            groups,
        }
    }
}

/// The dispatches of a kernel with one workgroup per row, recorded for `op`: one per row chunk of
/// the `[rows, vocab]` matrix `matrix` (chunks that fit the largest binding), each with the
/// chunk's [`RowHead`]. `args` binds the chunk's buffers and returns the kernel's own arguments.
pub(crate) fn row_chunk_dispatches<A: KernelArgs + bytemuck::Pod>(
    device: &WgpuDevice,
    op: Op,
    (kernel, dtype): (&Entry<A, RowHead>, DType),
    matrix: &Buffer,
    shape: &RowShape,
    mut args: impl FnMut(&mut Binder<'_>, (usize, usize)) -> Result<A>,
) -> Result<Vec<Dispatch>> {
    let chunks = device.gpu.row_chunks(matrix, shape.rows, shape.vocab);
    chunks
        .into_iter()
        .map(|chunk| {
            let mut b = Binder::new(device, op);
            let head = RowHead {
                rows: u(chunk.1 - chunk.0),
                vocab: u(shape.vocab),
                row0: u(chunk.0),
            };
            let chunk_args = args(&mut b, chunk)?;
            Ok(b.dispatch_with_head(kernel, dtype, (&head, &chunk_args), head.rows))
        })
        .collect()
}

/// The dispatches of a kernel with one workgroup per row of the `[rows, vocab]` matrix `matrix`,
/// which it reads at binding 1 ([`row_chunk_dispatches`]): `args` gets the element offset of the
/// chunk's rows there, binds the kernel's other buffers and returns its arguments.
pub(crate) fn matrix_row_dispatches<A: KernelArgs + bytemuck::Pod>(
    device: &WgpuDevice,
    op: Op,
    kernel: (&Entry<A, RowHead>, DType),
    matrix: &Buffer,
    shape: &RowShape,
    mut args: impl FnMut(&mut Binder<'_>, u32) -> Result<A>,
) -> Result<Vec<Dispatch>> {
    row_chunk_dispatches(device, op, kernel, matrix, shape, |b, chunk| {
        let matrix_off = b.rows(1, matrix, shape.vocab, chunk)?;
        args(b, matrix_off)
    })
}
