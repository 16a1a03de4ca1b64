//! The table of the AVX2 loops that pack the lanes a mask selects to the front of a vector
//! (what AVX-512's `vpcompressd` does in one instruction): the probability band's listing of keys
//! and the logits band's listing of offsets.

/// For each mask of 8 lanes, the lanes it selects packed to the front: their indices, a byte
/// each, the first in the low byte (the rest 0). Widened to eight u32 lanes
/// (`_mm256_cvtepu8_epi32`), it is the order of `_mm256_permutevar8x32_epi32`.
pub(crate) const PACK8: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut mask = 0;
    while mask < 256 {
        let (mut lane, mut at, mut packed) = (0, 0, 0u64);
        while lane < 8 {
            if mask & (1 << lane) != 0 {
                packed |= (lane as u64) << (8 * at);
                at += 1;
            }
            lane += 1;
        }
        table[mask] = packed;
        mask += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::PACK8;

    /// Every mask's entry lists its set lanes in rising order, then zeros.
    #[test]
    fn every_mask_packs_its_lanes_in_order() {
        for (mask, &packed) in PACK8.iter().enumerate() {
            let lanes: Vec<u64> = (0..8).filter(|l| mask & (1 << l) != 0).collect();
            for (at, lane) in lanes.iter().enumerate() {
                assert_eq!((packed >> (8 * at)) & 0xff, *lane, "mask {mask:#x}");
            }
            for at in lanes.len()..8 {
                assert_eq!((packed >> (8 * at)) & 0xff, 0, "mask {mask:#x}");
            }
        }
    }
}
