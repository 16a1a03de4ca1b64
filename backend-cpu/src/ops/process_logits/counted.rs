//! The counted words of a count table, kept between calls.
//!
//! The penalties change only tokens with a positive count (or in the prompt). Finding them in a
//! `[slots, V]` i32 table is a scan of the whole table (39 MB at 64 × 151936), as costly as a
//! fifth of the sampling pass it serves, and nearly all of it finds nothing: a slot's counts change
//! by a handful of tokens a step. So the CPU device keeps, per count table, one bit per token
//! with a positive count ([`Counted`]), and brings it up to date instead of scanning again:
//!
//! - the table is identified by its host memory's [`stamp`], which changes at every mutable
//!   access; a cache whose stamp is not the buffer's is dropped and the table scanned again;
//! - `update_state`, the op that counts tokens, sets the bits of the tokens it counted and
//!   records the table's new stamp;
//! - a `write` to the table (a runner or the Decoder setting a slot's counts) marks the slots it
//!   covers stale and records the new stamp, so only those slots are scanned again.
//!
//! The bits are a function of the table's contents, so the processed values never depend on the
//! cache: a stale or missing cache only costs a scan.

use std::sync::Mutex;

use rayon::prelude::*;
use specula_backend_api::Buffer;
use specula_backend_api::host::stamp;
use specula_backend_api::ops::process_logits::mask_words;

use super::super::token_index;
use crate::sampling::scan::{compiled_for, dispatch};
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};

/// How many count tables a device keeps the bits of (one per Decoder, typically).
const KEPT_TABLES: usize = 4;

/// Which count table, and which window of it, bits were derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TableKey {
    /// The table's host memory stamp.
    stamp: u64,
    /// The window's byte range in the allocation.
    window: (usize, usize),
    /// The row length of the table.
    vocab: usize,
}

impl TableKey {
    /// The key of `table` (a `[slots, vocab]` i32 buffer) as it is now; `None` when it is not
    /// host memory.
    fn of(table: &Buffer, vocab: usize) -> Option<Self> {
        Some(TableKey {
            stamp: stamp(table)?,
            window: byte_window(table),
            vocab,
        })
    }
}

/// A buffer's window as a byte range of its allocation.
fn byte_window(buffer: &Buffer) -> (usize, usize) {
    let size = buffer.dtype().size_bytes();
    (
        buffer.offset() * size,
        (buffer.offset() + buffer.len()) * size,
    )
}

/// The counted bits of one count table: per slot, `mask_words(vocab)` words whose bit `v mod 32`
/// of word `v / 32` is set when the slot's count of `v` is positive. Only the slots marked
/// current hold their bits; the others are zero until [`Counted::bring_up_to_date`] scans them.
#[derive(Debug)]
pub(super) struct Counted {
    key: Option<TableKey>,
    current: Vec<bool>,
    words: Vec<u32>,
}

impl Counted {
    /// No slot current, for a table of `slots` rows of `vocab`.
    fn empty(key: Option<TableKey>, slots: usize, vocab: usize) -> Self {
        Counted {
            key,
            current: vec![false; slots],
            words: vec![0; slots * mask_words(vocab)],
        }
    }

    /// The bits of every slot (only the current ones are meaningful).
    pub(super) fn words(&self) -> &[u32] {
        &self.words
    }

    /// Scans the slots of `wanted` that are not current from `counts` (the table's `[slots,
    /// vocab]` values), on the caller's rayon pool.
    pub(super) fn bring_up_to_date(&mut self, counts: &[i32], vocab: usize, wanted: &[bool]) {
        let words = mask_words(vocab);
        self.words
            .par_chunks_mut(words.max(1))
            .zip(self.current.par_iter_mut())
            .zip(counts.par_chunks(vocab.max(1)))
            .enumerate()
            .filter(|(b, ((_, current), _))| wanted.get(*b) == Some(&true) && !**current)
            .for_each(|(_, ((bits, current), counts))| {
                dispatch!(count_words_generic::<32>(counts, bits) via count_words_avx512, count_words_avx2);
                *current = true;
            });
    }

    /// Sets the bits of `tokens` whose count in slot `b`'s row `counts` is now positive.
    fn counted(&mut self, b: usize, counts: &[i32], tokens: &[i32]) {
        let words = mask_words(counts.len());
        if self.current.get(b) != Some(&true) {
            return;
        }
        for v in tokens.iter().filter_map(|&t| token_index(t, counts.len())) {
            if counts[v] > 0 {
                self.words[b * words + v / 32] |= 1 << (v % 32);
            }
        }
    }
}

compiled_for!(avx512, fn count_words_avx512 [const W: usize]
    (counts: &[i32], bits: &mut [u32]) -> () = count_words_generic [W]);
compiled_for!(avx2, fn count_words_avx2 [const W: usize]
    (counts: &[i32], bits: &mut [u32]) -> () = count_words_generic [W]);

/// Per `W`-token word of a slot's `counts` (`W` = 32, the bits of a mask word), the bits of its
/// tokens of a positive count.
#[inline(always)]
fn count_words_generic<const W: usize>(counts: &[i32], bits: &mut [u32]) {
    for (chunk, bits) in counts.chunks(W).zip(bits.iter_mut()) {
        // A fold, not `any`: the compare of the whole word vectorises.
        *bits = chunk
            .iter()
            .enumerate()
            .fold(0, |word, (j, &c)| word | u32::from(c > 0) << j);
    }
}

/// The counted bits of the count tables a device has seen, each valid while its table's stamp
/// is the one recorded.
#[derive(Debug, Default)]
pub(crate) struct CountedTables {
    kept: Mutex<Vec<Counted>>,
}

impl CountedTables {
    /// The bits of `table` (`[slots, vocab]` i32), taken out of the cache: the kept ones if its
    /// stamp and window are those recorded, else none current. Hand them back with [`put`].
    ///
    /// [`put`]: CountedTables::put
    pub(super) fn take(&self, table: &Buffer, vocab: usize) -> Counted {
        let key = TableKey::of(table, vocab);
        let slots = table.len() / vocab.max(1);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        match kept.iter().position(|c| c.key.is_some() && c.key == key) {
            Some(i) => kept.swap_remove(i),
            None => Counted::empty(key, slots, vocab),
        }
    }

    /// Keeps `counted` for the next call (dropping the oldest beyond [`KEPT_TABLES`]).
    pub(super) fn put(&self, counted: Counted) {
        if counted.key.is_none() {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|c| c.key != counted.key);
        kept.push(counted);
        if kept.len() > KEPT_TABLES {
            kept.remove(0);
        }
    }

    /// Before `update_state` counts tokens into `table`: the bits recorded at its current
    /// stamp, to be brought along by [`TableUpdate::counted`] and [`TableUpdate::finish`].
    pub(crate) fn start_update(&self, table: &Buffer, vocab: usize) -> TableUpdate<'_> {
        let key = TableKey::of(table, vocab);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let counted = kept
            .iter()
            .position(|c| c.key.is_some() && c.key == key)
            .map(|i| kept.swap_remove(i));
        TableUpdate {
            tables: self,
            counted,
        }
    }

    /// After a write to a window of `dst`, whose stamp was `before`: the kept bits of that
    /// allocation follow it to its new stamp, with the slots the window covers no longer current.
    pub(crate) fn written(&self, before: Option<u64>, dst: &Buffer) {
        let (Some(before), Some(after)) = (before, stamp(dst)) else {
            return;
        };
        let (start, end) = byte_window(dst);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        for counted in kept.iter_mut() {
            let Some(key) = counted.key.as_mut().filter(|k| k.stamp == before) else {
                continue;
            };
            key.stamp = after;
            let row_bytes = key.vocab * 4;
            let (table_start, table_end) = key.window;
            let (from, to) = (start.max(table_start), end.min(table_end));
            if from < to {
                let first = (from - table_start) / row_bytes;
                let last = (to - 1 - table_start) / row_bytes;
                for current in counted.current.iter_mut().take(last + 1).skip(first) {
                    *current = false;
                }
            }
        }
    }
}

/// The kept bits of a count table while `update_state` counts tokens into it.
#[derive(Debug)]
pub(crate) struct TableUpdate<'a> {
    tables: &'a CountedTables,
    counted: Option<Counted>,
}

impl TableUpdate<'_> {
    /// Slot `b` counted `tokens`; `counts` is its row of the table after counting them.
    pub(crate) fn counted(&mut self, b: usize, counts: &[i32], tokens: &[i32]) {
        if let Some(counted) = self.counted.as_mut() {
            counted.counted(b, counts, tokens);
        }
    }

    /// The update is done: the bits are kept at the table's new stamp.
    pub(crate) fn finish(self, table: &Buffer) {
        if let Some(mut counted) = self.counted {
            let vocab = counted.key.map_or(0, |k| k.vocab);
            counted.key = TableKey::of(table, vocab);
            self.tables.put(counted);
        }
    }
}
