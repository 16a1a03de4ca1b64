//! Scratch memory without a driver call per op: one block per device, grown on demand and reused.
//!
//! An op that needs scratch (REJECTION's per-row stats, `ngram_match`'s proposals,
//! `accept_logprobs`' packed entries, a split row's histograms) takes it from the device's
//! [`Arena`]: the block is allocated when a call needs more than the arena holds, to the next
//! power of two (at least [`MIN_BLOCK_BYTES`]), and every later call of that size or less reuses
//! it. Nothing is zeroed per call: every kernel writes the scratch it reads before reading it
//! (proved on the host emulator with scratch full of garbage, `tests/emulated_kernels.rs`).
//!
//! All ops of a device run in order on one stream, so scratch is free again for the next op as
//! soon as the last kernel of an op is enqueued; an op holds the arena (its lock) while it enqueues
//! its kernels, so two threads cannot interleave their kernels on one block. A block left behind
//! by a growth is freed stream-ordered (after the kernels enqueued before), or kept alive by a
//! captured step that recorded its address ([`Arena::blocks`]).
//!
//! The logic is plain Rust over [`Allocate`], so the tests drive it with a fake allocator.

use std::sync::Arc;

/// The smallest block: the scratch of a 384-row REJECTION step is ~25 KB, a split row ~200 KB.
pub(crate) const MIN_BLOCK_BYTES: usize = 1 << 20;

/// Where an [`Arena`] gets its memory: the device ([`crate::driver::Driver`]) or a test's fake.
pub(crate) trait Allocate {
    /// A block of memory (freed when the last `Arc` of it is dropped).
    type Block;
    /// What an allocation can fail with.
    type Error;
    /// A new block of `bytes` bytes.
    fn allocate(&self, bytes: usize) -> Result<Self::Block, Self::Error>;
    /// The device address of a block's first byte.
    fn address(block: &Self::Block) -> u64;
}

/// A reusable block of scratch memory, grown on demand.
pub(crate) struct Arena<B> {
    block: Option<Arc<B>>,
    capacity: usize,
}

impl<B> Default for Arena<B> {
    fn default() -> Self {
        Arena {
            block: None,
            capacity: 0,
        }
    }
}

/// The size a request of `bytes` grows the arena to: the next power of two, at least
/// [`MIN_BLOCK_BYTES`] (`None` past the address space).
pub(crate) fn grown_size(bytes: u64) -> Option<usize> {
    let bytes = usize::try_from(bytes).ok()?;
    Some(bytes.checked_next_power_of_two()?.max(MIN_BLOCK_BYTES))
}

impl<B> Arena<B> {
    /// The address of at least `bytes` bytes of scratch (any content), allocating a larger block
    /// when the current one is too small. On an error the arena keeps its current block.
    pub(crate) fn reserve<A>(&mut self, alloc: &A, bytes: u64) -> Result<u64, Option<A::Error>>
    where
        A: Allocate<Block = B>,
    {
        if let Some(block) = self
            .block
            .as_ref()
            .filter(|_| bytes <= self.capacity as u64)
        {
            return Ok(A::address(block));
        }
        let size = grown_size(bytes).ok_or(None)?;
        let block = Arc::new(alloc.allocate(size).map_err(Some)?);
        let address = A::address(&block);
        self.block = Some(block);
        self.capacity = size;
        Ok(address)
    }

    /// The bytes the current block holds (0 before the first reservation).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The current block, shared: what a captured step keeps alive for its replays.
    pub(crate) fn block(&self) -> Option<Arc<B>> {
        self.block.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_backend_api::transfer::DriverCounters;

    /// Hands out addresses from a counter and counts its allocations as the device driver does.
    #[derive(Default)]
    struct FakeAllocator {
        counters: DriverCounters,
        next: std::cell::Cell<u64>,
        fail_above: Option<usize>,
    }

    impl Allocate for FakeAllocator {
        type Block = (u64, usize);
        type Error = &'static str;
        fn allocate(&self, bytes: usize) -> Result<(u64, usize), &'static str> {
            if self.fail_above.is_some_and(|limit| bytes > limit) {
                return Err("out of memory");
            }
            self.counters.allocated();
            let at = self.next.get() + 0x1000;
            self.next.set(at + bytes as u64);
            Ok((at, bytes))
        }
        fn address(block: &(u64, usize)) -> u64 {
            block.0
        }
    }

    #[test]
    fn after_the_largest_request_nothing_is_allocated() {
        let fake = FakeAllocator::default();
        let mut arena = Arena::default();
        // A decoding loop's scratch requests: verify's stats, ngram's proposals, a split row.
        let step = [25_000u64, 16 * 64, 8 * 393_216 + 8, 1_572_864, 24];
        for bytes in step {
            arena.reserve(&fake, bytes).expect("fits");
        }
        let warm = fake.counters.snapshot();
        let mut addresses = Vec::new();
        for _ in 0..100 {
            for bytes in step {
                addresses.push(arena.reserve(&fake, bytes).expect("fits"));
            }
        }
        let steps = fake.counters.snapshot().since(&warm);
        assert_eq!(steps.allocations, 0, "no allocation after the warm-up");
        assert!(
            addresses.windows(2).all(|w| w[0] == w[1]),
            "one block reused"
        );
        assert!(arena.capacity() >= 1_572_864);
    }

    #[test]
    fn growth_is_by_powers_of_two_so_a_rising_request_allocates_few_times() {
        let fake = FakeAllocator::default();
        let mut arena = Arena::default();
        for bytes in (1..=64u64).map(|k| k * 100_000) {
            arena.reserve(&fake, bytes).expect("fits");
        }
        // 100 kB .. 6.4 MB: 1, 2, 4, 8 MiB.
        assert_eq!(fake.counters.snapshot().allocations, 4);
        assert_eq!(arena.capacity(), 8 << 20);
    }

    #[test]
    fn an_empty_request_still_has_an_address() {
        let fake = FakeAllocator::default();
        let mut arena = Arena::default();
        let at = arena.reserve(&fake, 0).expect("fits");
        assert_ne!(at, 0);
        assert_eq!(arena.capacity(), MIN_BLOCK_BYTES);
    }

    #[test]
    fn a_failed_growth_keeps_the_block_and_reports_the_error() {
        let fake = FakeAllocator {
            fail_above: Some(4 << 20),
            ..FakeAllocator::default()
        };
        let mut arena = Arena::default();
        let at = arena.reserve(&fake, 1000).expect("fits");
        assert_eq!(arena.reserve(&fake, 5 << 20), Err(Some("out of memory")));
        assert_eq!(
            arena.reserve(&fake, 1000),
            Ok(at),
            "the old block is still there"
        );
        assert_eq!(
            arena.reserve(&fake, u64::MAX),
            Err(None),
            "past the address space"
        );
    }

    #[test]
    fn a_captured_step_keeps_its_block_alive_across_a_growth() {
        let fake = FakeAllocator::default();
        let mut arena = Arena::default();
        arena.reserve(&fake, 10).expect("fits");
        let kept = arena.block().expect("a block");
        arena.reserve(&fake, 10 << 20).expect("fits");
        assert_eq!(
            Arc::strong_count(&kept),
            1,
            "the arena moved on; the capture holds it"
        );
        assert_ne!(arena.block().map(|b| b.0), Some(kept.0));
    }
}
