//! Constants shared by the Rust code and every kernel language. Kernels receive them as `-D`
//! defines (CUDA, OpenCL) or a generated prelude (WGSL); they are defined here once.

/// Philox multiplier M0.
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Philox multiplier M1.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Philox key increment W0 (golden ratio).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Philox key increment W1 (sqrt(3) - 1).
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Philox rounds.
pub const PHILOX_ROUNDS: usize = 10;

/// Seeds are kept modulo this value (`2^63 - 2`), so every seed sum stays below `2^64`.
pub const MAX_INFER_SEED: u64 = (1 << 63) - 2;
/// How far the seed advances per emitted token (one step of 4 per token: one per purpose).
pub const SEED_STRIDE: u64 = 4;

/// Fixed-point weights are `floor(p · 2^WEIGHT_BITS)`.
pub const WEIGHT_BITS: u32 = 40;
/// `top_p` in fixed point is `ceil(top_p · 2^TOP_P_BITS)`.
pub const TOP_P_BITS: u32 = 24;
/// The largest vocabulary an op accepts (`2^20`, so a row's total weight stays ≤ `2^60`).
pub const MAX_VOCAB: usize = 1 << 20;
/// The largest number of TOPP candidates per row.
pub const MAX_CANDIDATES: usize = 128;
/// The largest top-K of `accept_logprobs`.
pub const MAX_LOGPROBS_TOP_K: usize = 64;
/// A REJECTION row whose total weight reaches this is not a distribution (`2^41`).
pub const REJECTION_MAX_TOTAL_WEIGHT: u64 = 1 << 41;
/// Default global draft-token budget of `ngram_match`.
pub const DEFAULT_NGRAM_THRESHOLD: usize = 128;
