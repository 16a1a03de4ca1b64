//! Launch geometry: block sizes, the split of a row over several blocks, scratch layouts and the
//! alignment tests for vector loads. Pure functions, unit-tested on any machine.

/// Threads per block of the rank-selection kernels (sample, candidates, REJECTION, logprobs).
pub const SELECT_BLOCK: u32 = 512;
/// Consecutive elements each thread of a selection kernel reads per chunk.
pub const SELECT_ITEMS: u32 = 16;
/// Elements a selection block reads per chunk.
pub const SELECT_CHUNK: u32 = SELECT_BLOCK * SELECT_ITEMS;
/// Histogram bins of one radix pass (digits of 11, 11 and 10 bits).
pub const SELECT_BINS: u64 = 2048;
/// Global histogram regions of one split row (a sample uses at most 6: top-k 3, top-p 3).
pub const SELECT_MAX_PASSES: u32 = 8;
/// Threads per block of the one-block-per-row float kernels (argmax, softmax).
pub const ROW_BLOCK: u32 = 256;
/// Threads per block of the batch-level kernels (one thread per slot or per output row).
pub const BATCH_BLOCK: u32 = 256;

/// A split row is worth it from this many chunks per block upwards.
pub const SPLIT_MIN_CHUNKS_PER_BLOCK: u32 = 1;
/// Rows at or below this count may be split over several blocks each.
pub const SPLIT_MAX_ROWS: usize = 8;
/// Vocabularies at or above this size may be split.
pub const SPLIT_MIN_VOCAB: usize = 4 * SELECT_CHUNK as usize;

/// Blocks per row for `top_k_top_p_sample`: 1 (one block per row), or more for a few rows of a
/// large vocabulary, bounded so that every block of the grid fits on the device at once (one
/// block per multiprocessor is always resident for these kernels).
pub fn sample_splits(rows: usize, vocab: usize, multiprocessors: u32) -> u32 {
    if rows == 0 || rows > SPLIT_MAX_ROWS || vocab < SPLIT_MIN_VOCAB {
        return 1;
    }
    let by_work = vocab.div_ceil((SELECT_CHUNK * SPLIT_MIN_CHUNKS_PER_BLOCK) as usize);
    let by_device = multiprocessors as usize / rows;
    let splits = by_work.min(by_device);
    if splits < 2 { 1 } else { splits as u32 }
}

/// Elements of the row each block of a split row reads (a whole number of chunks); the kernel
/// computes the same value (`row_part_split` in `select.cuh`).
pub fn split_slice(vocab: u32, splits: u32) -> u32 {
    let per = vocab.div_ceil(splits.max(1));
    per.div_ceil(SELECT_CHUNK) * SELECT_CHUNK
}

/// Bytes of the scratch one split row needs (any content: the blocks zero what they accumulate
/// into): the first-token word and 8 bytes unused, the histogram regions (u32 counts and u64
/// masses), and the per-block exchange (u64 + u32), rounded up to 256.
pub fn split_row_scratch_bytes(splits: u32) -> u64 {
    let fixed = 16u64;
    let hist = 12 * u64::from(SELECT_MAX_PASSES) * SELECT_BINS;
    let exchange = 12 * u64::from(splits);
    (fixed + hist + exchange).div_ceil(256) * 256
}

/// Bytes of a split row's barrier words (an epoch and an arrival word, `select.cuh`): kept per
/// row index apart from the scratch, zeroed once, and only ever written by the split kernel.
pub const GRID_SYNC_BYTES: u64 = 16;

/// Whether rows starting at `ptr` with `vocab` elements of `elem_bytes` each can be read four
/// elements at a time (every row start aligned to four elements).
pub fn vector_loads_ok(ptr: u64, elem_bytes: usize, vocab: usize) -> bool {
    let quad = 4 * elem_bytes as u64;
    ptr.is_multiple_of(quad) && vocab.is_multiple_of(4)
}

/// The widest unit (16, 8, 4, 2 or 1 bytes) that divides the row size and both row bases, for the
/// bit copy of `gather_next_token`.
pub fn copy_unit(src: u64, dst: u64, row_bytes: u64) -> u32 {
    for unit in [16u64, 8, 4, 2] {
        if src.is_multiple_of(unit) && dst.is_multiple_of(unit) && row_bytes.is_multiple_of(unit) {
            return unit as u32;
        }
    }
    1
}

/// Blocks of `block` threads covering `items` items, at least 1 (the kernels bound-check).
pub fn blocks_for(items: usize, block: u32) -> u32 {
    let blocks = items.div_ceil(block as usize).max(1);
    u32::try_from(blocks).unwrap_or(u32::MAX)
}

/// The strategy codes the verify kernel switches on (`-DSPECULA_STRATEGY_*`).
pub const STRATEGY_GREEDY: u32 = 0;
/// TARGET_MATCH.
pub const STRATEGY_TARGET_MATCH: u32 = 1;
/// TOPP.
pub const STRATEGY_TOPP: u32 = 2;
/// REJECTION.
pub const STRATEGY_REJECTION: u32 = 3;

/// Grid dimension x limit of every CUDA device since compute capability 3.0.
pub const MAX_GRID_X: usize = (1 << 31) - 1;
/// Grid dimension y limit.
pub const MAX_GRID_Y: usize = 65_535;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_rows_and_batches_stay_on_one_block() {
        assert_eq!(
            sample_splits(1, 32_000, 132),
            1,
            "32k is below the split size"
        );
        assert_eq!(
            sample_splits(64, 151_936, 132),
            1,
            "a large batch fills the device"
        );
        assert_eq!(sample_splits(0, 151_936, 132), 1);
        assert_eq!(sample_splits(1, 151_936, 1), 1, "one multiprocessor");
    }

    #[test]
    fn batch_one_large_vocab_splits_within_the_device() {
        let s = sample_splits(1, 151_936, 132);
        assert_eq!(s, 151_936usize.div_ceil(SELECT_CHUNK as usize) as u32);
        assert!(s >= 2);
        let s4 = sample_splits(4, 1 << 20, 132);
        assert!(s4 as usize * 4 <= 132);
        // Every block gets a slice; the slices cover the row.
        for (rows, vocab) in [(1usize, 151_936u32), (4, 1 << 20), (2, 128_256)] {
            let splits = sample_splits(rows, vocab as usize, 132);
            let slice = split_slice(vocab, splits);
            assert_eq!(slice % SELECT_CHUNK, 0);
            assert!(u64::from(slice) * u64::from(splits) >= u64::from(vocab));
        }
    }

    #[test]
    fn split_scratch_holds_every_region() {
        let bytes = split_row_scratch_bytes(19);
        assert_eq!(bytes % 256, 0);
        assert!(bytes >= 16 + 12 * 8 * 2048 + 12 * 19);
    }

    #[test]
    fn vector_loads_need_aligned_rows() {
        assert!(vector_loads_ok(0x1000, 4, 32_000));
        assert!(
            !vector_loads_ok(0x1004, 4, 32_000),
            "window offset of one f32"
        );
        assert!(!vector_loads_ok(0x1000, 4, 32_001), "odd vocabulary");
        assert!(
            vector_loads_ok(0x1008, 2, 128),
            "f16 rows need 8-byte alignment"
        );
    }

    #[test]
    fn copy_units() {
        assert_eq!(copy_unit(0x100, 0x200, 4096), 16);
        assert_eq!(copy_unit(0x104, 0x200, 4096), 4);
        assert_eq!(copy_unit(0x100, 0x200, 6), 2);
        assert_eq!(copy_unit(0x101, 0x200, 4096), 1);
    }

    #[test]
    fn blocks_cover_items() {
        assert_eq!(blocks_for(0, 256), 1);
        assert_eq!(blocks_for(256, 256), 1);
        assert_eq!(blocks_for(257, 256), 2);
    }
}
