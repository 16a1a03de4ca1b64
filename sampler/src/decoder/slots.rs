//! The slot table: the host's view of a decoder's slots.
//!
//! Each slot is empty or holds a [`SlotHost`] (the request, its tokens and its KV-cache lengths).
//! Next to the slots the table keeps the host mirrors of the per-slot device values the ops
//! validate against and the plan is built from: this step's `seq_lens_this_time` and
//! `seq_lens_encoder`, the draft row (the last accepted token, then the drafts), `top_p` and
//! `temperature`. The device side of inserting and removing a request is
//! `SlotBuffers::load_request` / `SlotBuffers::clear_slot`; this table only does the host
//! bookkeeping.

use specula_backend_api::ops::HostSlotLens;

use crate::config::{Request, SamplerConfig};
use crate::step::FinishReason;

/// The host's view of an occupied slot.
#[derive(Clone, Debug)]
pub(super) struct SlotHost {
    /// The request as inserted.
    pub request: Request,
    /// Prompt then generated tokens.
    pub tokens: Vec<i32>,
    /// `seq_lens_encoder`: the prompt length until the prefill step, then 0.
    pub encoder: usize,
    /// `seq_lens_decoder`: tokens in the KV cache.
    pub decoder: usize,
    /// Why the request stopped; `None` while it runs.
    pub finished: Option<FinishReason>,
}

impl SlotHost {
    /// A request that has not run yet: its first step is a prefill of the whole prompt.
    fn new(request: Request) -> Self {
        SlotHost {
            tokens: request.prompt.clone(),
            encoder: request.prompt.len(),
            decoder: 0,
            finished: None,
            request,
        }
    }

    /// The tokens generated so far.
    pub fn generated(&self) -> &[i32] {
        &self.tokens[self.request.prompt.len()..]
    }

    /// Whether the request has not stopped.
    pub fn is_running(&self) -> bool {
        self.finished.is_none()
    }

    /// The last token of the context (-1 for an empty one): the first token a decode step feeds.
    pub fn last_token(&self) -> i32 {
        self.tokens.last().copied().unwrap_or(-1)
    }

    /// How many of `tokens` (what the device emitted for this slot in a step) the request keeps
    /// when the host ends it within them (`docs/semantics.md` §8): up to and including the
    /// first that is one of its stop tokens (past `min_tokens`) or its `max_dec_len`-th generated
    /// token (unless [`SamplerConfig::fastdeploy_max_dec_len`] leaves that to the device).
    /// `None`: the host does not end it this step.
    pub fn host_stop(&self, tokens: &[i32], config: &SamplerConfig) -> Option<usize> {
        let before = self.generated().len();
        let limit = (!config.fastdeploy_max_dec_len).then_some(self.request.max_dec_len);
        let ends = |(i, &token): (usize, &i32)| {
            let count = before + i + 1;
            self.request.stops_at(token, count) || limit.is_some_and(|l| count >= l)
        };
        tokens.iter().enumerate().position(ends).map(|i| i + 1)
    }

    /// Takes in the tokens a step emitted (cut by [`host_stop`](SlotHost::host_stop)): a
    /// prefill moves the prompt into the KV cache, a decode step the emitted tokens; `stopped`
    /// (the device's stop flag or a host stop) sets the finish reason once (`masked`: the last
    /// token's row had every token masked).
    pub fn accept(&mut self, tokens: &[i32], stopped: bool, masked: bool, config: &SamplerConfig) {
        self.tokens.extend_from_slice(tokens);
        if !tokens.is_empty() {
            if self.encoder > 0 {
                self.decoder += self.encoder;
                self.encoder = 0;
            } else {
                self.decoder += tokens.len();
            }
        }
        if stopped && self.finished.is_none() {
            self.finished = Some(match masked {
                true => FinishReason::Masked,
                false => self.finish_reason(config),
            });
        }
    }

    /// Why a slot that stopped has stopped, from its last token (see [`FinishReason`] for the
    /// order when several reasons hold).
    fn finish_reason(&self, config: &SamplerConfig) -> FinishReason {
        let generated = self.generated();
        let count = generated.len();
        let length = count >= self.request.max_dec_len;
        let end = generated
            .last()
            .is_some_and(|&t| config.end_tokens.contains(&t) || self.request.stops_at(t, count));
        if length && config.fastdeploy_max_dec_len {
            FinishReason::Length
        } else if end {
            FinishReason::EndToken
        } else if length {
            FinishReason::Length
        } else {
            FinishReason::MaxModelLen
        }
    }
}

/// The slots of a decoder and the host mirrors of their per-slot device values (`[max_bsz]`,
/// `[max_bsz · S]` for the draft rows).
#[derive(Debug)]
pub(super) struct SlotTable {
    slots: Vec<Option<SlotHost>>,
    /// `S`: the length of a draft row.
    step_tokens: usize,
    this_time: Vec<i32>,
    encoder: Vec<i32>,
    /// Per slot: the last accepted token, then the drafts.
    drafts: Vec<i32>,
    top_p: Vec<f32>,
    temperature: Vec<f32>,
}

impl SlotTable {
    /// `max_bsz` empty slots whose draft rows hold `step_tokens` tokens.
    pub fn new(max_bsz: usize, step_tokens: usize) -> Self {
        SlotTable {
            slots: vec![None; max_bsz],
            step_tokens,
            this_time: vec![0; max_bsz],
            encoder: vec![0; max_bsz],
            drafts: vec![-1; max_bsz * step_tokens],
            top_p: vec![1.0; max_bsz],
            temperature: vec![1.0; max_bsz],
        }
    }

    // ----- occupancy and lookups -----

    /// The number of slots (`max_bsz`).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The request in `slot`, if any (`None` also for a slot out of range).
    pub fn get(&self, slot: usize) -> Option<&SlotHost> {
        self.slots.get(slot)?.as_ref()
    }

    /// The request in `slot`, mutably.
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut SlotHost> {
        self.slots.get_mut(slot)?.as_mut()
    }

    /// Whether `slot` holds a request.
    pub fn is_occupied(&self, slot: usize) -> bool {
        self.get(slot).is_some()
    }

    /// Whether `slot` holds a request that has not stopped.
    pub fn is_running(&self, slot: usize) -> bool {
        self.get(slot).is_some_and(SlotHost::is_running)
    }

    /// Whether any slot holds a request that has not stopped.
    pub fn has_running(&self) -> bool {
        (0..self.len()).any(|b| self.is_running(b))
    }

    /// The occupied slots, in order.
    pub fn occupied(&self) -> Vec<usize> {
        (0..self.len()).filter(|&b| self.is_occupied(b)).collect()
    }

    /// The running slots past their prefill (their next step is a decode step), in order.
    pub fn decoding(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&b| {
                self.get(b)
                    .is_some_and(|h| h.is_running() && h.encoder == 0)
            })
            .collect()
    }

    /// The number of free slots.
    pub fn free_count(&self) -> usize {
        self.slots.iter().filter(|s| s.is_none()).count()
    }

    /// The lowest free slot.
    pub fn first_free(&self) -> Option<usize> {
        self.slots.iter().position(Option::is_none)
    }

    /// One past the last running slot: the `real_bsz` of the next step.
    pub fn real_bsz(&self) -> usize {
        self.slots
            .iter()
            .rposition(|h| h.as_ref().is_some_and(SlotHost::is_running))
            .map_or(0, |b| b + 1)
    }

    // ----- insert and remove -----

    /// Puts `request` into the free `slot` and mirrors its sampling parameters.
    pub fn insert(&mut self, slot: usize, request: Request) {
        self.top_p[slot] = request.top_p;
        self.temperature[slot] = request.temperature;
        self.slots[slot] = Some(SlotHost::new(request));
    }

    /// Takes the request out of `slot` and resets the slot's sampling mirrors.
    pub fn remove(&mut self, slot: usize) -> Option<SlotHost> {
        let host = self.slots.get_mut(slot)?.take()?;
        self.top_p[slot] = 1.0;
        self.temperature[slot] = 1.0;
        Some(host)
    }

    // ----- host mirrors -----

    /// The slot lengths of this step, for the ops' host-side validation.
    pub fn host_lens(&self) -> HostSlotLens<'_> {
        HostSlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        }
    }

    /// `seq_lens_this_time`, `[max_bsz]`.
    pub fn this_time(&self) -> &[i32] {
        &self.this_time
    }

    /// The `(seq_lens_this_time, seq_lens_encoder)` of `slot` this step.
    pub fn lens(&self, slot: usize) -> (i32, i32) {
        (self.this_time[slot], self.encoder[slot])
    }

    /// Sets the lengths of `slot` for this step (saturating at `i32::MAX`).
    pub fn set_lens(&mut self, slot: usize, this_time: usize, encoder: usize) {
        self.this_time[slot] = i32::try_from(this_time).unwrap_or(i32::MAX);
        self.encoder[slot] = i32::try_from(encoder).unwrap_or(i32::MAX);
    }

    /// Sets the first token of `slot`'s draft row: the last accepted token.
    pub fn set_last_token(&mut self, slot: usize, token: i32) {
        self.drafts[slot * self.step_tokens] = token;
    }

    /// The first `n` tokens of `slot`'s draft row: what a decode step feeds.
    pub fn step_tokens(&self, slot: usize, n: usize) -> &[i32] {
        let start = slot * self.step_tokens;
        &self.drafts[start..start + n]
    }

    /// The first `n` drafts of `slot` (its draft row after the last accepted token).
    pub fn drafts(&self, slot: usize, n: usize) -> &[i32] {
        let start = slot * self.step_tokens + 1;
        &self.drafts[start..start + n]
    }

    /// Sets the drafts of `slot` and its `seq_lens_this_time` (`this_time`).
    pub fn set_drafts(&mut self, slot: usize, drafts: &[i32], this_time: i32) {
        let start = slot * self.step_tokens + 1;
        self.drafts[start..start + drafts.len()].copy_from_slice(drafts);
        self.this_time[slot] = this_time;
    }

    /// Replaces the mirrors of `seq_lens_this_time` with what the device holds.
    pub fn replace_this_time(&mut self, this_time: Vec<i32>) {
        self.this_time = this_time;
    }

    /// Replaces the mirrors of the draft rows with what the device holds.
    pub fn replace_drafts(&mut self, drafts: Vec<i32>) {
        self.drafts = drafts;
    }

    /// `top_p` per slot, `[max_bsz]`.
    pub fn top_p(&self) -> &[f32] {
        &self.top_p
    }

    /// `temperature` per slot, `[max_bsz]`.
    pub fn temperature(&self) -> &[f32] {
        &self.temperature
    }
}

#[cfg(test)]
mod tests {
    use specula_backend_api::Strategy;

    use super::*;

    fn config() -> SamplerConfig {
        SamplerConfig::new(Strategy::Greedy, 4, 16, 32, vec![0])
    }

    #[test]
    fn occupancy_follows_insert_and_remove() {
        let mut table = SlotTable::new(4, 3);
        assert_eq!((table.first_free(), table.free_count()), (Some(0), 4));
        assert_eq!(table.real_bsz(), 0);
        table.insert(
            2,
            Request::new(vec![1, 2]).with_params(
                crate::SamplingParams::default()
                    .with_top_p(0.5)
                    .with_temperature(0.7),
            ),
        );
        assert_eq!((table.first_free(), table.free_count()), (Some(0), 3));
        assert_eq!(table.occupied(), vec![2]);
        assert!(table.is_running(2) && table.has_running() && !table.is_occupied(1));
        assert_eq!(table.real_bsz(), 3);
        assert_eq!((table.top_p()[2], table.temperature()[2]), (0.5, 0.7));
        let host = table.remove(2).expect("occupied");
        assert_eq!(host.tokens, vec![1, 2]);
        assert_eq!((table.top_p()[2], table.temperature()[2]), (1.0, 1.0));
        assert!(table.remove(2).is_none() && table.remove(9).is_none());
        assert_eq!((table.real_bsz(), table.free_count()), (0, 4));
    }

    #[test]
    fn real_bsz_ends_at_the_last_running_slot() {
        let config = config();
        let mut table = SlotTable::new(4, 1);
        table.insert(0, Request::new(vec![1]));
        table.insert(2, Request::new(vec![1]));
        assert_eq!(table.real_bsz(), 3);
        let host = table.get_mut(2).expect("occupied");
        host.accept(&[0], true, false, &config);
        assert!(!table.is_running(2) && table.is_occupied(2));
        assert_eq!(table.real_bsz(), 1);
    }

    #[test]
    fn accept_moves_the_prompt_then_the_tokens_into_the_kv_cache() {
        let config = config();
        let mut host = SlotHost::new(Request::new(vec![3, 4, 5]).with_max_dec_len(4));
        assert_eq!((host.encoder, host.decoder), (3, 0));
        host.accept(&[6], false, false, &config);
        assert_eq!((host.encoder, host.decoder), (0, 3));
        host.accept(&[7, 8], false, false, &config);
        host.accept(&[], false, false, &config);
        assert_eq!((host.encoder, host.decoder), (0, 5));
        assert_eq!((host.generated(), host.last_token()), (&[6, 7, 8][..], 8));
        assert!(host.is_running());
        // The fourth token reaches max_dec_len; it is also end token 0, which wins (as in vLLM)
        // unless FastDeploy's op replaced it.
        let mut fastdeploy = host.clone();
        host.accept(&[0], true, false, &config);
        assert_eq!(host.finished, Some(FinishReason::EndToken));
        let fd_config = config.with_fastdeploy_max_dec_len();
        fastdeploy.accept(&[0], true, false, &fd_config);
        assert_eq!(fastdeploy.finished, Some(FinishReason::Length));
    }

    #[test]
    fn a_stop_flag_sets_the_finish_reason_once() {
        let config = config();
        let mut end = SlotHost::new(Request::new(vec![3]).with_max_dec_len(10));
        end.accept(&[4, 0], true, false, &config);
        assert_eq!(end.finished, Some(FinishReason::EndToken));
        end.accept(&[5], true, false, &config);
        assert_eq!(end.finished, Some(FinishReason::EndToken));
        let mut full = SlotHost::new(Request::new(vec![3]).with_max_dec_len(10));
        full.accept(&[4], true, false, &config);
        assert_eq!(full.finished, Some(FinishReason::MaxModelLen));
    }

    #[test]
    fn the_host_stops_at_the_first_stop_token_or_at_max_dec_len() {
        let config = config();
        let request = Request::new(vec![3])
            .with_max_dec_len(5)
            .with_stop_tokens(vec![9])
            .with_params(crate::SamplingParams::default().with_min_tokens(1));
        let mut host = SlotHost::new(request);
        // A stop token within min_tokens does not stop.
        assert_eq!(host.host_stop(&[9, 4, 9, 5], &config), Some(3));
        host.accept(&[9, 4], false, false, &config);
        assert_eq!(host.host_stop(&[5, 6, 7], &config), Some(3));
        assert_eq!(host.host_stop(&[5, 6], &config), None);
        let fastdeploy = config.clone().with_fastdeploy_max_dec_len();
        assert_eq!(host.host_stop(&[5, 6, 7], &fastdeploy), None);
        host.accept(&[5, 6, 7], true, false, &config);
        assert_eq!(host.finished, Some(FinishReason::Length));
        let mut stop = SlotHost::new(Request::new(vec![3]).with_stop_tokens(vec![9]));
        stop.accept(&[4, 9], true, false, &config);
        assert_eq!(stop.finished, Some(FinishReason::EndToken));
    }

    #[test]
    fn draft_rows_hold_the_last_token_then_the_drafts() {
        let mut table = SlotTable::new(2, 3);
        table.set_last_token(1, 9);
        table.set_drafts(1, &[4, 5], 3);
        assert_eq!(table.step_tokens(1, 3), &[9, 4, 5]);
        assert_eq!(table.drafts(1, 2), &[4, 5]);
        assert_eq!(table.step_tokens(0, 3), &[-1, -1, -1]);
        assert_eq!(table.lens(1), (3, 0));
        table.set_lens(0, usize::MAX, 2);
        assert_eq!(table.lens(0), (i32::MAX, 2));
        assert_eq!(table.host_lens().seq_lens_this_time, &[i32::MAX, 3]);
    }
}
