//! Philox4x32-10 and the seed rule (`docs/semantics.md` §3), as plain Rust every backend tests its
//! kernels against.

use crate::abi::{
    MAX_INFER_SEED, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1, SEED_STRIDE,
};

/// What a draw is for; the purpose is the first word of the Philox counter, so the draws of one
/// token seed for different purposes are independent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Purpose {
    /// The token of a row (`top_k_top_p_sample`, REJECTION fallbacks).
    Sample = 0,
    /// The TOPP phase-2 draw among candidates.
    Candidate = 1,
    /// The REJECTION acceptance test.
    Accept = 2,
    /// The REJECTION resample from the residual.
    Residual = 3,
}

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32 with 10 rounds (Salmon et al., SC'11, the Random123 constants).
///
/// ```
/// use specula_backend_api::rng::philox4x32_10;
/// assert_eq!(
///     philox4x32_10([0; 4], [0; 2]),
///     [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
/// );
/// ```
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..PHILOX_ROUNDS {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let (hi0, lo0) = mulhilo(PHILOX_M0, c[0]);
        let (hi1, lo1) = mulhilo(PHILOX_M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The 64-bit draw of a token seed for a purpose: `x = philox((purpose, 0, 0, 0), (lo(s), hi(s)))`,
/// `R = x0 | x1 << 32`.
#[inline]
pub fn draw(seed: u64, purpose: Purpose) -> u64 {
    let x = philox4x32_10(
        [purpose as u32, 0, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    u64::from(x[0]) | (u64::from(x[1]) << 32)
}

/// The seed of output row `j` of a slot whose `infer_seed` is `infer_seed`:
/// `(infer_seed + 4·j) mod MAX_INFER_SEED`. A prefill row uses `j = 0`.
///
/// `infer_seed` values at or above `MAX_INFER_SEED` (which a runner should never store) are reduced
/// first, so the result is defined for every `u64`.
#[inline]
pub fn row_seed(infer_seed: u64, j: u64) -> u64 {
    let m = u128::from(MAX_INFER_SEED);
    let step = u128::from(j) * u128::from(SEED_STRIDE) % m;
    ((u128::from(infer_seed) % m + step) % m) as u64
}

/// `infer_seed` after a step that emitted `n` tokens: advanced by 4 per emitted token.
#[inline]
pub fn advance_seed(infer_seed: u64, emitted: u64) -> u64 {
    row_seed(infer_seed, emitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn draw_uses_purpose_as_counter_and_seed_as_key() {
        let s = 0x0123_4567_89ab_cdef_u64;
        let x = philox4x32_10([2, 0, 0, 0], [0x89ab_cdef, 0x0123_4567]);
        assert_eq!(
            draw(s, Purpose::Accept),
            u64::from(x[0]) | u64::from(x[1]) << 32
        );
        assert_ne!(draw(s, Purpose::Sample), draw(s, Purpose::Accept));
    }

    #[test]
    fn seeds_wrap_modulo_max_infer_seed() {
        assert_eq!(row_seed(100, 2), 108);
        assert_eq!(row_seed(MAX_INFER_SEED - 4, 1), 0);
        assert_eq!(row_seed(MAX_INFER_SEED - 1, 1), 3);
        assert_eq!(row_seed(u64::MAX, 0), u64::MAX % MAX_INFER_SEED);
        assert_eq!(advance_seed(MAX_INFER_SEED - 8, 3), 4);
        // A token's seed depends only on the request seed and its generated position.
        assert_eq!(row_seed(advance_seed(7, 5), 2), row_seed(7, 7));
    }
}
