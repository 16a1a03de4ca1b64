//! Host values as the `u32` words of kernel parameters, shared by the shader prelude
//! (`kernels.rs`) and the ops' host code (`ops/`).

/// A count as a kernel parameter (inputs are validated far below `u32::MAX`; saturate anyway).
pub(crate) fn u(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// The low and high 32-bit halves of a 64-bit host value, for a `*_lo`, `*_hi` field pair.
pub(crate) fn split_u64(x: u64) -> (u32, u32) {
    (x as u32, (x >> 32) as u32)
}
