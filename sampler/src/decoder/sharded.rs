//! One rank of a tensor-parallel decoder (`docs/semantics.md` §4d, `docs/runner.md`): the group
//! and the agreed partition, the agreement on what every rank must hold alike, and the sharded
//! targets of a step.
//!
//! Every rank runs the same decoder on its own device: the scheduler, the proposer, the layout,
//! verification and `update_state` are replicated (the same inputs give the same outputs), and
//! only the stages that read the rows join the ranks: `process_logits` over the rank's slice,
//! the strategy's targets (the sharded `argmax`, `top_k_top_p_sample` or `top_p_candidates`,
//! written into the step's target buffers), REJECTION's verification and `accept_logprobs`.

use specula_backend_api::ops::{Scores, VocabSlice};
use specula_backend_api::{Buffer, Device, DeviceExt, Strategy};
use specula_shard::{
    ExchangeStats, Fallback, Group, HostRows, Partition, Shard, ShardError, SliceRows, TargetExtras,
};

use super::slots::SlotTable;
use crate::config::{Request, SamplerConfig};
use crate::error::Result;
use crate::step::StepPlan;

/// One rank of a tensor-parallel decoder: its group of ranks and the partition of the vocabulary
/// every rank agreed on.
#[derive(Debug)]
pub struct Sharding {
    group: Group,
    partition: Partition,
    /// Per slot, the fingerprint of its request (0: empty).
    requests: Vec<u64>,
}

/// A 64-bit FNV-1a fingerprint of bytes.
fn bytes_fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The fingerprint of a value's debug form (every field, the same on every rank of one build).
fn debug_fingerprint(value: &impl std::fmt::Debug) -> u64 {
    bytes_fingerprint(format!("{value:?}").as_bytes())
}

impl Sharding {
    /// Agrees with the other ranks of `group` on the partition (this rank holds `slice`) and on
    /// the configuration, and checks that `device` runs the per-rank ops: a collective call,
    /// whose failure is the same typed error on every rank.
    pub(crate) fn agree(
        device: &dyn Device,
        config: &SamplerConfig,
        group: Group,
        slice: VocabSlice,
    ) -> Result<Self> {
        let partition = Partition::agree(&group, slice)?;
        let capabilities = device.capabilities();
        let runs = capabilities.sharded && capabilities.sliced_processing;
        group.agree(
            "the configuration (its fingerprint) and whether the device runs sharded rows \
             (Capabilities::sharded and sliced_processing: 1)",
            &[debug_fingerprint(config), u64::from(runs)],
        )?;
        if !runs {
            return Err(ShardError::InvalidArgument {
                what: format!(
                    "{} does not run the per-rank ops of sharded rows",
                    device.info().name
                ),
            }
            .into());
        }
        if partition.vocab() != config.vocab {
            return Err(ShardError::Mismatch {
                what: format!(
                    "the slices partition a vocabulary of {}, the configuration has V = {}",
                    partition.vocab(),
                    config.vocab
                ),
            }
            .into());
        }
        Ok(Sharding {
            group,
            partition,
            requests: vec![0; config.max_bsz],
        })
    }

    /// The group of ranks.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The partition of the vocabulary every rank agreed on.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// What this rank has exchanged so far (collective calls and bytes).
    pub fn exchanged(&self) -> ExchangeStats {
        self.group.stats()
    }

    /// Records the request inserted into `slot` (`None`: the slot is emptied), for the step
    /// agreement.
    pub(super) fn set_request(&mut self, slot: usize, request: Option<&Request>) {
        if let Some(r) = self.requests.get_mut(slot) {
            *r = request.map_or(0, debug_fingerprint);
        }
    }

    /// The rank's view of a sharded call on `device`.
    pub(crate) fn shard<'a>(&'a self, device: &'a dyn Device) -> Shard<'a> {
        Shard {
            device,
            group: &self.group,
            partition: &self.partition,
        }
    }

    /// Checks that every rank holds the same step: its plan, the requests of its slots and what
    /// they generated, and `scores` — a fingerprint of the scores' shape (or `None` when this
    /// rank's scores failed their checks) and of the token bitmask. One all-gather of a
    /// fingerprint; a difference is [`ShardError::Mismatch`] on every rank.
    pub(super) fn agree_on_step(
        &self,
        plan: &StepPlan,
        slots: &SlotTable,
        scores: Option<u64>,
    ) -> Result<()> {
        let mut words = vec![
            plan.step,
            plan.real_bsz as u64,
            plan.gather_rows as u64,
            debug_fingerprint(&plan.slots),
            debug_fingerprint(&plan.input_tokens),
            debug_fingerprint(&plan.output_rows),
            scores.unwrap_or(u64::MAX),
        ];
        for p in &plan.slots {
            let generated = slots.get(p.slot).map(|h| h.generated());
            words.push(self.requests.get(p.slot).copied().unwrap_or(0));
            words.push(generated.map_or(0, |g| debug_fingerprint(&g)));
        }
        let fingerprint = specula_shard::fingerprint(words);
        self.group.agree(
            "the step's replicated parameters (a fingerprint of the plan, the requests, what \
             they generated, the scores' shape and the bitmask)",
            &[fingerprint],
        )?;
        Ok(())
    }
}

/// The host copies of a step's per-row parameters a sharded op reads, and its replicated
/// per-row inputs on the device.
pub(crate) struct StepRows {
    pub top_k: Vec<i32>,
    pub top_p: Vec<f32>,
    pub seed: Vec<u64>,
    pub temperature: Option<Vec<f32>>,
    /// Per-row min_p when the rows are processed.
    pub min_p: Option<Vec<f32>>,
    pub min_p_buffer: Option<Buffer>,
    /// The whole rows' fallbacks when the rows are processed.
    pub fallback: Option<Vec<i32>>,
}

impl StepRows {
    /// The host rows, with `top_k` in place of the rows' own.
    pub(crate) fn host<'a>(&'a self, top_k: &'a [i32]) -> HostRows<'a> {
        HostRows {
            top_k,
            top_p: &self.top_p,
            seed: &self.seed,
            temperature: self.temperature.as_deref(),
            min_p: self.min_p.as_deref(),
        }
    }

    /// The rank's rows of `scores` with the step's min_p and fallbacks.
    pub(crate) fn rows<'a>(&'a self, scores: Scores<'a>) -> SliceRows<'a> {
        SliceRows {
            scores,
            min_p: self.min_p_buffer.as_ref(),
            fallback: self.fallback.as_deref().map(Fallback::Row),
        }
    }

    /// REJECTION's target extras.
    pub(crate) fn extras(&self) -> TargetExtras<'_> {
        TargetExtras {
            min_p: self.min_p_buffer.as_ref(),
            fallback: self.fallback.as_deref().map(Fallback::Row),
        }
    }
}

/// The sharded targets of the strategy (GREEDY: the argmax, or under processing the `top_k = 1`
/// sample; TARGET_MATCH: the sample; TOPP: the candidates), written into `tokens` or the
/// candidate buffers as the unsharded ops write them. REJECTION samples in verification.
pub(crate) fn targets(
    shard: &Shard<'_>,
    (strategy, processed): (Strategy, bool),
    scores: Scores<'_>,
    rows: &StepRows,
    (tokens, candidates): (&mut Buffer, Option<Candidates<'_>>),
) -> Result<()> {
    let device = shard.device;
    let n = rows.top_k.len();
    let sampled = match (strategy, processed) {
        (Strategy::Greedy, false) => Some(specula_shard::argmax(shard, scores, n)?),
        (Strategy::Greedy, true) => {
            let ones = vec![1; n];
            let host = rows.host(&ones);
            Some(specula_shard::top_k_top_p_sample(
                shard,
                &rows.rows(scores),
                &host,
            )?)
        }
        (Strategy::TargetMatch, _) => {
            let host = rows.host(&rows.top_k);
            Some(specula_shard::top_k_top_p_sample(
                shard,
                &rows.rows(scores),
                &host,
            )?)
        }
        (Strategy::TopP, _) => {
            let Some(c) = candidates else {
                return Ok(());
            };
            let found = specula_shard::top_p_candidates(
                shard,
                &rows.rows(scores),
                &rows.top_p,
                c.per_row,
                Some(c.padding),
            )?;
            device.write(c.ids, &found.ids)?;
            device.write(c.scores, &found.scores)?;
            device.write(c.lens, &found.lens)?;
            None
        }
        (Strategy::Rejection, _) => None,
    };
    if let Some(sampled) = sampled {
        device.write(tokens, &sampled)?;
    }
    Ok(())
}

/// TOPP's candidate outputs of the step's rows, and which rows are padding.
pub(crate) struct Candidates<'a> {
    pub ids: &'a mut Buffer,
    pub scores: &'a mut Buffer,
    pub lens: &'a mut Buffer,
    /// `C`.
    pub per_row: usize,
    /// Rows past `T_out`.
    pub padding: &'a [bool],
}
