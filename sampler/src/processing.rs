//! Logits processing in the decoder (`docs/semantics.md` §4c): the per-slot device state of
//! `process_logits` and its host mirrors.
//!
//! The state is allocated on the first request that uses a parameter (or the first step given a
//! token bitmask); until then a decoder pays nothing for it. From then on `update_state` keeps
//! every slot's token counts on the device, a request's insert zeroes its slot's counts and writes
//! its prompt and allowed-token masks, and the small per-slot tables (penalties, min_tokens, the
//! bias and bad-word lists) are uploaded before a step when a request came or went.

use specula_backend_api::ops::process_logits::{PENALTY_FIELDS, mask_words, penalty};
use specula_backend_api::ops::{ProcessingTables, SlotProcessing, TokenHistory};
use specula_backend_api::{Buffer, Device, DeviceExt, WriteAt};

use crate::config::{Request, SamplerConfig};
use crate::error::Result;

/// One slot's rows of the per-slot device state, on the host ([`Processing::prepare`]).
#[derive(Debug)]
pub(crate) struct SlotRows {
    slot: usize,
    /// `[V]` token counts of its history.
    counts: Vec<i32>,
    /// The mask of its prompt's tokens.
    prompt: Vec<u32>,
    /// The mask of its allowed tokens (every token when it names none).
    allowed: Vec<u32>,
}

/// One slot's parameters as the device tables hold them.
#[derive(Clone, Debug, Default)]
struct SlotLists {
    bias: Vec<(i32, f32)>,
    bad_words: Vec<Vec<i32>>,
}

/// The device state of logits processing and its host mirrors.
#[derive(Debug)]
pub(crate) struct Processing {
    vocab: usize,
    /// Per slot: whether its request uses a parameter.
    uses: Vec<bool>,
    penalties: Vec<f32>,
    min_tokens: Vec<i32>,
    lists: Vec<SlotLists>,
    /// The per-slot tables changed since they were last uploaded.
    dirty: bool,
    /// `[max_bsz, V]` i32, kept by `update_state`.
    pub(crate) token_counts: Buffer,
    prompt_mask: Buffer,
    allowed: Buffer,
    tables: ProcessingTables,
}

/// A slot's penalty row for a request (or the defaults for an empty slot).
fn penalty_row(request: Option<&Request>) -> [f32; PENALTY_FIELDS] {
    let mut row = [1.0, 1.0, 0.0, 0.0, 0.0];
    if let Some(r) = request {
        row[penalty::REPETITION] = r.repetition_penalty;
        row[penalty::REPETITION_INVERSE] = 1.0 / r.repetition_penalty;
        row[penalty::FREQUENCY] = r.frequency_penalty;
        row[penalty::PRESENCE] = r.presence_penalty;
        row[penalty::MIN_P] = r.min_p;
    }
    row
}

/// The mask row of `tokens` (`ceil(V / 32)` words).
fn mask_of(tokens: &[i32], vocab: usize) -> Vec<u32> {
    let mut mask = vec![0u32; mask_words(vocab)];
    for v in tokens.iter().filter_map(|&t| usize::try_from(t).ok()) {
        if v < vocab {
            mask[v / 32] |= 1 << (v % 32);
        }
    }
    mask
}

/// The counts row of `tokens` (`V` entries).
fn counts_of(tokens: &[i32], vocab: usize) -> Vec<i32> {
    let mut counts = vec![0i32; vocab];
    for v in tokens.iter().filter_map(|&t| usize::try_from(t).ok()) {
        if v < vocab {
            counts[v] = counts[v].saturating_add(1);
        }
    }
    counts
}

/// Per-slot lists flattened with their `[max_bsz + 1]` offsets; one unused `pad` when empty.
fn flatten<T: Copy>(lists: impl Iterator<Item = Vec<T>>, pad: T) -> (Vec<i32>, Vec<T>) {
    let mut offsets = vec![0i32];
    let mut flat = Vec::new();
    for list in lists {
        flat.extend(list);
        offsets.push(i32::try_from(flat.len()).unwrap_or(i32::MAX));
    }
    if flat.is_empty() {
        flat.push(pad);
    }
    (offsets, flat)
}

impl Processing {
    /// Allocates the state for `config`, with every slot empty.
    pub(crate) fn new(device: &dyn Device, config: &SamplerConfig) -> Result<Self> {
        let (n, vocab) = (config.max_bsz, config.vocab);
        let words = mask_words(vocab);
        Ok(Processing {
            vocab,
            uses: vec![false; n],
            penalties: penalty_row(None).repeat(n),
            min_tokens: vec![0; n],
            lists: vec![SlotLists::default(); n],
            dirty: true,
            token_counts: device.alloc::<i32>(n * vocab)?,
            prompt_mask: device.alloc::<u32>(n * words)?,
            allowed: device.upload(&vec![u32::MAX; n * words])?,
            tables: ProcessingTables {
                penalties: device.upload(&penalty_row(None).repeat(n))?,
                min_tokens: device.alloc::<i32>(n)?,
                bias_offsets: device.alloc::<i32>(n + 1)?,
                bias_ids: device.alloc::<i32>(1)?,
                bias_values: device.alloc::<f32>(1)?,
                bad_word_offsets: device.alloc::<i32>(n + 1)?,
                bad_words: device.alloc::<i32>(1)?,
            },
        })
    }

    /// Loads `request` into `slot`, whose history holds `generated` (empty for a new request):
    /// its counts, prompt and allowed-token masks on the device (one batched write), its
    /// parameters in the mirrors.
    pub(crate) fn load(
        &mut self,
        device: &dyn Device,
        slot: usize,
        request: &Request,
        generated: &[i32],
    ) -> Result<()> {
        let rows = self.prepare(slot, request, generated);
        device.write_many(&mut self.writes(&rows))?;
        Ok(())
    }

    /// Takes `request`'s parameters into the mirrors of `slot` and returns its device rows, for
    /// [`writes`](Processing::writes) to put on the device.
    pub(crate) fn prepare(
        &mut self,
        slot: usize,
        request: &Request,
        generated: &[i32],
    ) -> SlotRows {
        let vocab = self.vocab;
        let allowed = match &request.allowed_token_ids {
            Some(ids) => mask_of(ids, vocab),
            None => vec![u32::MAX; mask_words(vocab)],
        };
        self.set_slot(slot, Some(request));
        SlotRows {
            slot,
            counts: counts_of(generated, vocab),
            prompt: mask_of(&request.prompt, vocab),
            allowed,
        }
    }

    /// The writes of a slot's rows: its counts, prompt mask and allowed-token mask.
    pub(crate) fn writes<'a>(&'a mut self, rows: &'a SlotRows) -> [WriteAt<'a, 'a>; 3] {
        let (vocab, words) = (self.vocab, mask_words(self.vocab));
        [
            WriteAt::new(&mut self.token_counts, rows.slot * vocab, &rows.counts),
            WriteAt::new(&mut self.prompt_mask, rows.slot * words, &rows.prompt),
            WriteAt::new(&mut self.allowed, rows.slot * words, &rows.allowed),
        ]
    }

    /// Resets `slot`'s parameters (its request left).
    pub(crate) fn clear(&mut self, slot: usize) {
        self.set_slot(slot, None);
    }

    fn set_slot(&mut self, slot: usize, request: Option<&Request>) {
        let row = penalty_row(request);
        self.penalties[slot * PENALTY_FIELDS..(slot + 1) * PENALTY_FIELDS].copy_from_slice(&row);
        self.min_tokens[slot] =
            request.map_or(0, |r| i32::try_from(r.min_tokens).unwrap_or(i32::MAX));
        self.lists[slot] = SlotLists {
            bias: request.map_or_else(Vec::new, |r| r.logit_bias.clone()),
            bad_words: request.map_or_else(Vec::new, |r| r.bad_words.clone()),
        };
        self.uses[slot] = request.is_some_and(Request::processes_logits);
        self.dirty = true;
    }

    /// Whether some slot's request uses a parameter.
    pub(crate) fn in_use(&self) -> bool {
        self.uses.iter().any(|&u| u)
    }

    /// Uploads the per-slot tables if a request came or went since the last upload: the
    /// fixed-size tables in one batched write, the variable-length lists as new buffers.
    pub(crate) fn sync(&mut self, device: &dyn Device) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let (bias_offsets, ids) = flatten(
            self.lists
                .iter()
                .map(|l| l.bias.iter().map(|b| b.0).collect()),
            0,
        );
        let (_, values) = flatten(
            self.lists
                .iter()
                .map(|l| l.bias.iter().map(|b| b.1).collect()),
            0.0,
        );
        let encoded = self.lists.iter().map(|l| {
            l.bad_words
                .iter()
                .flat_map(|w| {
                    std::iter::once(i32::try_from(w.len()).unwrap_or(i32::MAX))
                        .chain(w.iter().copied())
                })
                .collect()
        });
        let (word_offsets, words) = flatten(encoded, 0);
        device.write_many(&mut [
            WriteAt::new(&mut self.tables.penalties, 0, &self.penalties),
            WriteAt::new(&mut self.tables.min_tokens, 0, &self.min_tokens),
            WriteAt::new(&mut self.tables.bias_offsets, 0, &bias_offsets),
            WriteAt::new(&mut self.tables.bad_word_offsets, 0, &word_offsets),
        ])?;
        self.tables.bias_ids = device.upload(&ids)?;
        self.tables.bias_values = device.upload(&values)?;
        self.tables.bad_words = device.upload(&words)?;
        self.dirty = false;
        Ok(())
    }

    /// The history buffers of `process_logits` (the slot state's own beside these).
    pub(crate) fn history<'a>(
        &'a self,
        token_ids_all: &'a Buffer,
        prompt_lens: &'a Buffer,
        step_idx: &'a Buffer,
        draft_tokens: &'a Buffer,
    ) -> TokenHistory<'a> {
        TokenHistory {
            token_ids_all,
            prompt_lens,
            step_idx,
            draft_tokens,
            token_counts: &self.token_counts,
            prompt_mask: &self.prompt_mask,
        }
    }

    /// The per-slot parameters of `process_logits`.
    pub(crate) fn slots<'a>(&'a self, end_tokens: &'a Buffer) -> SlotProcessing<'a> {
        self.tables.slots(end_tokens, Some(&self.allowed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_flatten_with_offsets_and_a_pad() {
        let (offsets, flat) = flatten([vec![1, 2], vec![], vec![3]].into_iter(), 0);
        assert_eq!((offsets, flat), (vec![0, 2, 2, 3], vec![1, 2, 3]));
        let (offsets, flat) = flatten([vec![], vec![]].into_iter(), 9);
        assert_eq!((offsets, flat), (vec![0, 0, 0], vec![9]));
    }

    #[test]
    fn masks_and_counts_ignore_ids_outside_the_vocabulary() {
        assert_eq!(mask_of(&[0, 33, 33, -1, 40], 40), vec![1, 2]);
        assert_eq!(counts_of(&[2, 2, 5, 7], 6), vec![0, 0, 2, 0, 0, 1]);
    }
}
