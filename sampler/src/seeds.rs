//! The per-token seed schedule (`docs/semantics.md` §3).
//!
//! A request's seed is reduced modulo [`MAX_INFER_SEED`] when it is inserted; the slot's
//! `infer_seed` then advances by 4 per token actually emitted (not per step), so the token at
//! generated position `n` always uses `(request_seed + 4n) mod MAX_INFER_SEED`, however many drafts
//! were proposed or accepted on the way. That is what makes TARGET_MATCH speculative decoding
//! produce exactly the tokens of non-speculative decoding.
//!
//! ```
//! use specula_sampler::seeds;
//! let s = seeds::request_seed(7);
//! assert_eq!(seeds::token_seed(s, 0), 7);
//! assert_eq!(seeds::token_seed(s, 3), 19);
//! assert_eq!(seeds::infer_seed_after(s, 3), seeds::token_seed(s, 3));
//! ```

pub use specula_backend_api::abi::{MAX_INFER_SEED, SEED_STRIDE};
use specula_backend_api::rng;

/// The `infer_seed` a request starts with: its seed reduced modulo [`MAX_INFER_SEED`].
pub fn request_seed(seed: u64) -> u64 {
    seed % MAX_INFER_SEED
}

/// The seed of the token at generated position `position` (0 = the first generated token):
/// `(request_seed + 4 · position) mod MAX_INFER_SEED`.
pub fn token_seed(request_seed: u64, position: u64) -> u64 {
    rng::row_seed(request_seed, position)
}

/// A slot's `infer_seed` after it has emitted `emitted` tokens: the seed of the next token.
pub fn infer_seed_after(request_seed: u64, emitted: u64) -> u64 {
    rng::advance_seed(request_seed, emitted)
}
