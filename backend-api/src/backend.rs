//! What a backend implements: [`Backend`], whose methods receive arguments that the front
//! ([`Device`](crate::Device)) has already validated.
//!
//! A runner calls [`Device`](crate::Device); every type that implements [`Backend`] is a `Device`
//! through one blanket implementation, which validates the arguments, opens the op's tracing span
//! and applies the zero-row rule before it calls the backend. The argument types of the backend
//! methods ([`Call`], [`Alloc`], [`Upload`], [`Write`], [`Download`]) have private fields and no
//! public constructor: only that validation builds them, so a backend cannot be handed (or forget
//! to check) an unvalidated argument.

use std::fmt::Debug;

pub use crate::call::{Alloc, Call, DeviceDesc, Download, Upload, Write};
use crate::transfer::PendingDownload;
use crate::{Buffer, Op, Result};

macro_rules! any_call {
    (
        [$($gated:ident $gname:ident $base:ident $capability:ident $gsection:literal $gsummary:literal,)*]
        $($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*
    ) => {
        /// One validated call of any op: what [`Backend::run`] receives. One variant per op of the
        /// op table ([`for_each_op!`](crate::for_each_op)) and per gated entry of the table (an op
        /// a device runs itself when a capability says so), holding that op's [`Call`].
        #[derive(Debug)]
        pub enum AnyCall<'c, 'o: 'c> {
            $(
                #[doc = concat!("`", stringify!($name), "` (`docs/semantics.md` §", $section, ").")]
                $variant(crate::ops::$name::OpCall<'c, 'o>),
            )*
            $(
                #[doc = concat!(
                    "`", stringify!($gname), "` (`docs/semantics.md` §", $gsection, "): ", $gsummary,
                    ". Reaches a backend whose `Capabilities::", stringify!($capability), "` is set."
                )]
                $gated(crate::ops::$gname::OpCall<'c, 'o>),
            )*
        }

        impl AnyCall<'_, '_> {
            /// The op of this call (a gated entry's errors name the op it stands for).
            pub fn op(&self) -> Op {
                match self {
                    $(AnyCall::$variant(_) => Op::$variant,)*
                    $(AnyCall::$gated(_) => Op::$base,)*
                }
            }

            /// The name of this call's op or gated entry, as its tracing span reports it.
            pub fn name(&self) -> &'static str {
                match self {
                    $(AnyCall::$variant(_) => stringify!($name),)*
                    $(AnyCall::$gated(_) => stringify!($gname),)*
                }
            }

            /// `(rows, width)` of the call ([`Call::extent`]).
            pub fn extent(&self) -> (usize, usize) {
                match self {
                    $(AnyCall::$variant(call) => call.extent(),)*
                    $(AnyCall::$gated(call) => call.extent(),)*
                }
            }

            /// Whether the call writes nothing ([`Call::launches_nothing`]).
            pub fn launches_nothing(&self) -> bool {
                match self {
                    $(AnyCall::$variant(call) => call.launches_nothing(),)*
                    $(AnyCall::$gated(call) => call.launches_nothing(),)*
                }
            }
        }
    };
}

/// Hands the gated entries to [`any_call!`] ahead of the op table.
macro_rules! any_call_with_gated {
    ($($gated:tt)*) => {
        crate::__op_table! { [[$($gated)*]] any_call }
    };
}

crate::__gated_op_table! { [] any_call_with_gated }

/// Dispatches an [`AnyCall`] to the backend's host file of its op: `ops::<op>::run(backend, call)`
/// for every op of the op table — the body of a backend's [`Backend::run`]. The calling module has
/// an `ops` module with one submodule per op, named as the op, each with
/// `fn run(backend: &B, call: OpCall<'_, '_>) -> Result<()>`: a backend missing an op's host file
/// does not compile.
///
/// A gated entry of the table (`top_k_top_p_sample_processed`, gated by
/// [`Capabilities::fused_processing`](crate::Capabilities::fused_processing)) reaches a backend
/// only when it sets the entry's capability; such a backend names the entry's host code after a
/// `;` (`Variant => path`). An entry a backend does not name is
/// [`Error::Unsupported`](crate::Error::Unsupported), which the front never lets happen on a
/// device without the capability (it runs the entry's fallback instead).
///
/// ```ignore
/// fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
///     specula_backend_api::dispatch_ops!(self, call)
/// }
///
/// // A backend that runs the fused processed sample itself:
/// fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
///     specula_backend_api::dispatch_ops!(self, call;
///         TopKTopPSampleProcessed => ops::process_logits::run_processed_sample)
/// }
/// ```
#[macro_export]
macro_rules! dispatch_ops {
    ($backend:expr, $call:expr) => {
        $crate::__gated_op_table! { [[$backend, $call]] $crate::__dispatch_ops_with_gated }
    };
    ($backend:expr, $call:expr; $($gated:ident => $run:path),+ $(,)?) => {
        match $call {
            $($crate::backend::AnyCall::$gated(call) => $run($backend, call),)+
            call => $crate::dispatch_ops!($backend, call),
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __dispatch_ops_with_gated {
    ([$backend:expr, $call:expr] $($gated:tt)*) => {
        $crate::__op_table! { [[$backend, $call] [$($gated)*]] $crate::__dispatch_ops }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __dispatch_ops {
    (
        [$backend:expr, $call:expr]
        [$($gated:ident $gname:ident $base:ident $capability:ident $gsection:literal $gsummary:literal,)*]
        $($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*
    ) => {
        match $call {
            $($crate::backend::AnyCall::$variant(call) => ops::$name::run($backend, call),)*
            $($crate::backend::AnyCall::$gated(call) => Err($crate::ops::$gname::not_dispatched(&call)),)*
        }
    };
}

/// The operations a backend implements, each on arguments that are already validated.
///
/// Implement this trait (not [`Device`](crate::Device)): every `Backend` is a `Device`, whose
/// methods — the validating front — check the arguments, open the tracing span and apply the
/// zero-row rule once for every backend, then call [`Backend::run`] with the op's validated
/// [`Call`]. A backend keeps one host file per op (`ops/<op>.rs`, beside its kernel file of the
/// same name) and dispatches to them with [`dispatch_ops!`](crate::dispatch_ops).
///
/// [`Backend::run`] is only called when the op has something to do (see each op's call type for
/// its zero-row rule).
pub trait Backend: Send + Sync + Debug {
    /// The device's id, description and capabilities.
    fn desc(&self) -> &DeviceDesc;

    /// Allocates zeroed memory.
    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer>;
    /// Allocates a buffer holding the upload's bytes. Blocks until copied.
    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer>;
    /// Overwrites a window. Blocks until copied.
    fn run_write(&self, write: Write<'_, '_>) -> Result<()>;
    /// Copies a window to the host. Blocks until the device has finished writing it.
    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>>;
    /// Waits for every enqueued op; reports execution faults.
    fn run_synchronize(&self) -> Result<()>;

    /// Whether this device's buffers are host memory ([`host::HostMemory`](crate::host)): then
    /// [`DeviceExt::borrow_host`](crate::DeviceExt::borrow_host) lends the caller's slice to it
    /// without a copy. The default is `false` (the slice is uploaded); the CPU backend and the
    /// reference device say `true`.
    fn host_memory(&self) -> bool {
        false
    }

    /// Starts copying several windows to the host behind every enqueued op, returning without
    /// waiting when the backend can; [`PendingDownload::wait`] then waits once for all of them.
    ///
    /// The default copies each window at once with [`Backend::run_download`] and returns
    /// [`PendingDownload::ready`] (right for a host backend, whose ops have already run). A
    /// device backend overrides it with its asynchronous copies: one staging buffer and one map
    /// (wgpu), non-blocking reads and one wait (OpenCL), copies on the stream and one
    /// synchronisation (CUDA).
    fn run_start_download(&self, downloads: &[Download<'_>]) -> Result<PendingDownload> {
        downloads
            .iter()
            .map(|&d| self.run_download(d))
            .collect::<Result<Vec<_>>>()
            .map(PendingDownload::ready)
    }

    /// Overwrites several windows, in order, as one batched write. The default calls
    /// [`Backend::run_write`] for each; a backend that can enqueue its writes and wait once
    /// overrides it.
    fn run_write_many(&self, writes: Vec<Write<'_, '_>>) -> Result<()> {
        writes.into_iter().try_for_each(|w| self.run_write(w))
    }

    /// Runs one validated op call (usually `dispatch_ops!(self, call)`).
    fn run(&self, call: AnyCall<'_, '_>) -> Result<()>;

    /// Builds every kernel, pipeline or program the backend would otherwise build lazily at the
    /// first call that needs it, for the ops and score dtypes of `plan` (already narrowed to what
    /// this device runs and supports, [`WarmUp::for_device`](crate::WarmUp::for_device)).
    /// Idempotent: what is built is cached and not built again. A kernel that fails to build is
    /// [`Error::KernelBuild`](crate::Error::KernelBuild), naming the op's kernel.
    ///
    /// The default builds nothing (a backend without compiled kernels: the CPU backend, the
    /// reference device).
    fn run_warm_up(&self, plan: &crate::WarmUp) -> Result<()> {
        let _ = plan;
        Ok(())
    }
}
