//! Sharded `verify_draft_tokens` (`docs/semantics.md` §5.8, §4d).
//!
//! GREEDY, TARGET_MATCH and TOPP read only their targets (tokens, candidates), which the sharded
//! ops give every rank alike: the op runs replicated on every rank's device. REJECTION reads the
//! rows themselves. Every rank decides each tested draft from the few values of the whole rows
//! it needs — `wp[d]` and `wq[d]` from the rank that holds `d` (the token's key, a MAX), the
//! target's kept mass `Wp` and threshold (the sharded sample's selection), the draft's total
//! `Wq` (a gather) — and draws a rejected draft's correction from the residual as the sharded
//! sample draws (§4d step 4, with the residual weights of `shard_walk`). The decisions then
//! become the targets of a TARGET_MATCH verification on the rank's device, which emits exactly
//! REJECTION's tokens with its stop rules: an accepted draft is its row's target, a rejected
//! one is replaced by -1 (which no target matches) and its row's target is the correction, a
//! phase-2 row's target is its sample.

use std::collections::BTreeMap;

use specula_backend_api::ops::{
    RejectionInputs, Scores, ShardResidual, ShardRows, StrategyInputs, VerifyInputs, VerifyOutputs,
    VerifyParams,
};
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::shard::{KeyOrder, NO_KEY, SliceWeigher, key_value};
use specula_backend_api::{Buffer, DType, Device, DeviceExt, FloatElement};

use crate::error::{Result, ShardError};
use crate::rows::{Fallback, HostRows, Shard, SliceRows};
use crate::sample::{Draws, Selected, draw_selected, draw_walks, gather_rows, select, walk};

/// A probability row of this total weight is not a distribution (`2^41`).
const NOT_A_DISTRIBUTION: u64 = 1 << 41;

/// `rows` widened to f32 (exact), on the rank's device.
fn widen(shard: &Shard<'_>, rows: &Buffer) -> Result<Buffer> {
    let device = shard.device;
    let values: Vec<f32> = match rows.dtype() {
        DType::F16 => widened::<half::f16>(device, rows)?,
        DType::BF16 => widened::<half::bf16>(device, rows)?,
        _ => device.download(rows)?,
    };
    Ok(device.upload(&values)?)
}

fn widened<T: FloatElement>(device: &dyn Device, rows: &Buffer) -> Result<Vec<f32>> {
    let values: Vec<T> = device.download(rows)?;
    Ok(values.into_iter().map(FloatElement::to_f32).collect())
}

/// What REJECTION's target rows carry beyond the strategy's inputs (`docs/semantics.md` §4d):
/// the per-row min_p a slice's `process_logits` leaves to the sharded ops, and the rows'
/// fallbacks (in place of [`RejectionInputs::fallback`], which must be `None`).
#[derive(Clone, Copy, Debug, Default)]
pub struct TargetExtras<'a> {
    /// Optional `[rows]` f32 per-row min_p of the target rows, on the device.
    pub min_p: Option<&'a Buffer>,
    /// The target rows' fallbacks.
    pub fallback: Option<Fallback<'a>>,
}

/// `verify_draft_tokens` of sharded rows: every rank writes the outputs the unsharded op writes
/// for the whole rows. The inputs are the op's, except that a REJECTION strategy's `target` and
/// `draft` rows are this rank's slices of them (`[rows, slice.len]` and `[n, slice.len]`), with
/// `extras`. `params.vocab` is the whole vocabulary.
///
/// Target and draft rows of two dtypes are widened to f32 (exactly, on the rank's device). With
/// logits rows, a draft row tested against two rows of different temperatures (a compact index
/// naming it twice) is a [`ShardError::InvalidArgument`].
pub fn verify_draft_tokens(
    shard: &Shard<'_>,
    inputs: &VerifyInputs<'_>,
    extras: TargetExtras<'_>,
    out: &mut VerifyOutputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<()> {
    let StrategyInputs::Rejection(rejection) = inputs.strategy else {
        shard.device.verify_draft_tokens(inputs, out, params)?;
        return Ok(());
    };
    if rejection.fallback.is_some() {
        return Err(ShardError::InvalidArgument {
            what: "sharded REJECTION takes the target rows' fallbacks in TargetExtras".into(),
        });
    }
    let min_p = extras.min_p;
    // Rows of two dtypes are both widened to f32 (exactly): the residual walk reads the draft
    // rows in the dtype of the target rows.
    let widened = match rejection.target.matrix().dtype() == rejection.draft.dtype() {
        true => None,
        false => Some((
            widen(shard, rejection.target.matrix())?,
            widen(shard, rejection.draft)?,
        )),
    };
    let rejection = match &widened {
        None => rejection,
        Some((target, draft)) => RejectionInputs {
            target: match rejection.target {
                Scores::Logits(l) => Scores::Logits(specula_backend_api::ops::Logits {
                    logits: target,
                    ..l
                }),
                Scores::Probs(_) => Scores::Probs(target),
            },
            draft,
            ..rejection
        },
    };
    let slots = Slots::download(shard, inputs, params)?;
    let host = RowParams::download(shard, &rejection, min_p, inputs.seeds)?;
    if host.top_k.len() != params.rows {
        return Err(ShardError::InvalidArgument {
            what: format!(
                "REJECTION's per-row inputs hold {} rows, verification reads {}",
                host.top_k.len(),
                params.rows
            ),
        });
    }
    let host_rows = host.rows();
    let target = SliceRows {
        scores: rejection.target,
        min_p,
        fallback: extras.fallback,
    };
    let selected = select(shard, &target, &host_rows)?;
    let weighed = Shard::weighed(&target, &selected.key_buffer);
    let samples = draw_selected(shard, &weighed, &host_rows, &selected.rows)?;
    let draft_rows = rejection.draft.len() / shard.partition.mine().len.max(1);
    let steps = slots.steps(params, draft_rows, host.draft_index.as_deref());
    let tests: Vec<Test> = steps.iter().flatten().filter_map(Step::test).collect();
    let judged = Judge {
        shard,
        rejection: &rejection,
        host: &host,
        selected: &selected,
        weighed: &weighed,
        draft_rows,
    };
    let (verdicts, draft) = judged.verdicts(&tests)?;
    let mut plan = slots.plan(&steps, &verdicts, &samples);
    let corrections = judged.residuals(&plan.residual, &draft, &samples)?;
    for (row, token) in corrections {
        plan.need(row, token);
    }
    run_plan(shard, inputs, (out, params), &slots, plan)
}

/// The host copies of the per-row parameters REJECTION reads (every rank holds the same).
struct RowParams {
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    seed: Vec<u64>,
    temperature: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    draft_index: Option<Vec<i32>>,
}

impl RowParams {
    fn download(
        shard: &Shard<'_>,
        rejection: &RejectionInputs<'_>,
        min_p: Option<&Buffer>,
        seeds: &Buffer,
    ) -> Result<Self> {
        let device = shard.device;
        Ok(RowParams {
            top_k: device.download(rejection.top_k)?,
            top_p: device.download(rejection.top_p)?,
            seed: device.download(seeds)?,
            temperature: rejection
                .target
                .temperature()
                .map(|t| device.download(t))
                .transpose()?,
            min_p: min_p.map(|m| device.download(m)).transpose()?,
            draft_index: rejection
                .draft_index
                .map(|i| device.download(i))
                .transpose()?,
        })
    }

    fn rows(&self) -> HostRows<'_> {
        HostRows {
            top_k: &self.top_k,
            top_p: &self.top_p,
            seed: &self.seed,
            temperature: self.temperature.as_deref(),
            min_p: self.min_p.as_deref(),
        }
    }
}

/// The host copies of the slot state verification reads (every rank holds the same).
struct Slots {
    s: usize,
    real_bsz: usize,
    rows: usize,
    vocab: usize,
    accept_all: bool,
    reject_all: bool,
    draft_tokens: Vec<i32>,
    this_time: Vec<i32>,
    encoder: Vec<i32>,
    cu_out: Vec<i32>,
    stop_flags: Vec<u8>,
    is_block_step: Vec<u8>,
    reasoning_status: Vec<i32>,
}

/// One step of a slot's phase 1, in order.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// `accept_all` accepts the in-vocabulary draft `draft` at `row` without a test.
    Accepted { row: usize, draft: i32 },
    /// The row does not exist: the draft is rejected, and phase 2 finds no token.
    Missing,
    /// Draft `i + 1` of `slot` is tested against `row`.
    Tested(Test),
}

impl Step {
    fn test(&self) -> Option<Test> {
        match *self {
            Step::Tested(test) => Some(test),
            _ => None,
        }
    }
}

/// A draft tested against its row.
#[derive(Clone, Copy, Debug)]
struct Test {
    i: usize,
    row: usize,
    draft: i32,
    /// The draft model's row (`None`: the index names none).
    draft_row: Option<usize>,
}

/// What a test decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The draft is emitted.
    Accept,
    /// Rejected; the correction is the target row's sample.
    Sample,
    /// Rejected; the correction is drawn from the residual.
    Residual,
}

/// What the TARGET_MATCH verification is given: the target each row must hold for each slot
/// that reads it, and the drafts with every rejected one replaced by -1.
struct Plan {
    /// `(row, slot) → target`.
    needs: BTreeMap<usize, Vec<(usize, i32)>>,
    /// The slot reading the rows being planned.
    slot: usize,
    drafts: Vec<i32>,
    /// The tests whose correction is drawn from the residual.
    residual: Vec<Test>,
}

impl Plan {
    /// Row `row` must hold `token` for the slot that reads it.
    fn need(&mut self, row: usize, token: i32) {
        self.needs.entry(row).or_default().push((self.slot, token));
    }

    /// Whether two slots need different targets of one row (only hostile layouts, whose slots
    /// share rows).
    fn conflicts(&self) -> bool {
        self.needs
            .values()
            .any(|n| n.iter().any(|&(_, t)| t != n[0].1))
    }
}

impl Slots {
    fn download(
        shard: &Shard<'_>,
        inputs: &VerifyInputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<Self> {
        let device = shard.device;
        let state = &inputs.state;
        Ok(Slots {
            s: params.dims.max_step_tokens,
            real_bsz: params.dims.real_bsz,
            rows: params.rows,
            vocab: params.vocab,
            accept_all: params.accept_all,
            reject_all: params.reject_all,
            draft_tokens: device.download(inputs.draft_tokens)?,
            this_time: device.download(inputs.lens.seq_lens_this_time)?,
            encoder: device.download(inputs.lens.seq_lens_encoder)?,
            cu_out: device.download(inputs.cu_seqlens_q_output)?,
            stop_flags: device.download(state.stop_flags)?,
            is_block_step: device.download(state.is_block_step)?,
            reasoning_status: device.download(state.reasoning_status)?,
        })
    }

    /// The tokens slot `b` feeds this step (0: it emits nothing).
    fn tokens_this_step(&self, b: usize) -> usize {
        if b >= self.real_bsz || self.stop_flags[b] != 0 || self.is_block_step[b] != 0 {
            return 0;
        }
        usize::try_from(self.this_time[b]).unwrap_or(0).min(self.s)
    }

    /// Whether phase 1 runs for slot `b` (not a prefill, not reasoning, not `reject_all`).
    fn checks_drafts(&self, b: usize) -> bool {
        self.encoder[b] <= 0 && self.reasoning_status[b] != 1 && !self.reject_all
    }

    /// Output row `base + i` of slot `b`, if it exists (computed in 64 bits).
    fn row(&self, b: usize, i: usize) -> Option<usize> {
        let row = i64::from(self.cu_out[b]) + i as i64;
        usize::try_from(row).ok().filter(|&r| r < self.rows)
    }

    fn in_vocab(&self, token: i32) -> bool {
        usize::try_from(token).is_ok_and(|t| t < self.vocab)
    }

    /// The phase-1 steps of every slot (empty for a slot without phase 1), up to the first
    /// missing row.
    fn steps(
        &self,
        params: &VerifyParams<'_>,
        draft_rows: usize,
        index: Option<&[i32]>,
    ) -> Vec<Vec<Step>> {
        let per_slot = params.dims.max_step_tokens.saturating_sub(1);
        (0..self.real_bsz)
            .map(|b| {
                let n = self.tokens_this_step(b);
                if n == 0 || !self.checks_drafts(b) {
                    return Vec::new();
                }
                let mut steps = Vec::new();
                for i in 0..n - 1 {
                    let draft = self.draft_tokens[b * self.s + i + 1];
                    let Some(row) = self.row(b, i) else {
                        steps.push(Step::Missing);
                        break;
                    };
                    if self.accept_all && self.in_vocab(draft) {
                        steps.push(Step::Accepted { row, draft });
                        continue;
                    }
                    let dense = b * per_slot + i;
                    let draft_row = match index {
                        None => Some(dense),
                        Some(index) => index.get(dense).and_then(|&q| usize::try_from(q).ok()),
                    };
                    steps.push(Step::Tested(Test {
                        i,
                        row,
                        draft,
                        draft_row: draft_row.filter(|&q| q < draft_rows),
                    }));
                }
                steps
            })
            .collect()
    }

    /// The targets and drafts that make TARGET_MATCH emit REJECTION's tokens, given each
    /// test's verdict (in the order of `steps`) and every row's sample.
    fn plan(&self, steps: &[Vec<Step>], verdicts: &[Verdict], samples: &[i32]) -> Plan {
        let mut plan = Plan {
            needs: BTreeMap::new(),
            slot: 0,
            drafts: self.draft_tokens.clone(),
            residual: Vec::new(),
        };
        let mut next = 0;
        for (b, steps) in steps.iter().enumerate() {
            plan.slot = b;
            // The verdicts of this slot's tests, in order.
            let tested = steps.iter().filter(|s| s.test().is_some()).count();
            let mut verdict = verdicts[next..next + tested].iter();
            next += tested;
            let mut passed = 0;
            let mut ended = false;
            for step in steps {
                match *step {
                    Step::Accepted { row, draft } => plan.need(row, draft),
                    Step::Missing => ended = true,
                    Step::Tested(test) => match verdict.next() {
                        Some(Verdict::Accept) => plan.need(test.row, test.draft),
                        Some(Verdict::Sample) | None => {
                            plan.drafts[b * self.s + test.i + 1] = -1;
                            plan.need(test.row, samples[test.row]);
                            ended = true;
                        }
                        Some(Verdict::Residual) => {
                            plan.drafts[b * self.s + test.i + 1] = -1;
                            plan.residual.push(test);
                            ended = true;
                        }
                    },
                }
                if ended {
                    break;
                }
                passed += 1;
            }
            if !ended
                && self.tokens_this_step(b) > 0
                && let Some(row) = self.row(b, passed)
            {
                plan.need(row, samples[row]);
            }
        }
        plan
    }
}

/// What the REJECTION decisions read.
struct Judge<'a> {
    shard: &'a Shard<'a>,
    rejection: &'a RejectionInputs<'a>,
    host: &'a RowParams,
    selected: &'a Selected,
    weighed: &'a ShardRows<'a>,
    draft_rows: usize,
}

/// The draft rows as the decisions weigh them: each at the temperature of the row it is
/// tested against, with its row key and total weight.
struct DraftRows {
    temperature: Option<Buffer>,
    keys: Vec<u64>,
    key_buffer: Buffer,
    /// `Wq` of each tested draft row.
    totals: BTreeMap<usize, u64>,
}

impl Judge<'_> {
    /// The temperature of each draft row: that of the row it is tested against.
    fn draft_temperatures(&self, tests: &[Test]) -> Result<Option<Vec<f32>>> {
        let Some(t) = &self.host.temperature else {
            return Ok(None);
        };
        let mut out: Vec<Option<f32>> = vec![None; self.draft_rows];
        for test in tests {
            let Some(q) = test.draft_row else { continue };
            let want = t[test.row];
            match out[q] {
                Some(have) if have.to_bits() != want.to_bits() => {
                    return Err(ShardError::InvalidArgument {
                        what: format!(
                            "draft row {q} is tested against rows of temperatures {have} and {want}"
                        ),
                    });
                }
                _ => out[q] = Some(want),
            }
        }
        Ok(Some(out.into_iter().map(|t| t.unwrap_or(1.0)).collect()))
    }

    fn draft_scores<'b>(&'b self, temperature: Option<&'b Buffer>) -> Scores<'b> {
        match temperature {
            Some(t) => Scores::logits(self.rejection.draft, t),
            None => Scores::probs(self.rejection.draft),
        }
    }

    /// The draft rows' keys and the totals of the tested ones.
    fn draft_rows(&self, tests: &[Test]) -> Result<DraftRows> {
        let shard = self.shard;
        let temperature = self
            .draft_temperatures(tests)?
            .map(|t| shard.device.upload(&t))
            .transpose()?;
        let scores = self.draft_scores(temperature.as_ref());
        let keys = shard.row_keys(&SliceRows::new(scores), self.draft_rows, KeyOrder::Rank)?;
        let key_buffer = shard.device.upload(&keys)?;
        let mut tested: Vec<usize> = tests.iter().filter_map(|t| t.draft_row).collect();
        tested.sort_unstable();
        tested.dedup();
        let mut totals = BTreeMap::new();
        if !tested.is_empty() {
            let rows = ShardRows::new(scores, &key_buffer);
            let (_, mass) = walk(
                shard,
                &rows,
                &vec![0; self.draft_rows],
                &vec![u64::MAX; self.draft_rows],
            )?;
            for (q, masses) in tested.iter().zip(gather_rows(shard, &mass, &tested)?) {
                totals.insert(*q, masses.iter().sum());
            }
        }
        Ok(DraftRows {
            temperature,
            keys,
            key_buffer,
            totals,
        })
    }

    /// Every test's verdict, and the draft rows they read.
    fn verdicts(&self, tests: &[Test]) -> Result<(Vec<Verdict>, DraftRows)> {
        let shard = self.shard;
        let rows = self.host.top_k.len();
        let draft = self.draft_rows(tests)?;
        let pairs: Vec<(usize, i32)> = tests.iter().map(|t| (t.row, t.draft)).collect();
        let p_keys = shard.token_keys(self.rejection.target, rows, &pairs, KeyOrder::Rank)?;
        let tested: Vec<&Test> = tests.iter().filter(|t| t.draft_row.is_some()).collect();
        let q_pairs: Vec<(usize, i32)> = tested
            .iter()
            .filter_map(|t| Some((t.draft_row?, t.draft)))
            .collect();
        let scores = self.draft_scores(draft.temperature.as_ref());
        let q_keys = shard.token_keys(scores, self.draft_rows, &q_pairs, KeyOrder::Rank)?;
        let raw_totals = self.raw_target_totals(tests)?;
        let mut q_key = q_keys.into_iter();
        let verdicts = tests
            .iter()
            .zip(p_keys)
            .map(|(test, p_key)| {
                let Some(q) = test.draft_row else {
                    return Verdict::Sample;
                };
                let q_key = q_key.next().unwrap_or(NO_KEY);
                let wq_total = draft.totals.get(&q).copied().unwrap_or(0);
                let raw = raw_totals.get(&test.row).copied().unwrap_or(0);
                if self.host.temperature.is_none()
                    && (raw >= NOT_A_DISTRIBUTION || wq_total >= NOT_A_DISTRIBUTION)
                {
                    return Verdict::Sample;
                }
                let selection = &self.selected.rows[test.row];
                let wp = match p_key != NO_KEY && p_key >= selection.threshold() {
                    true => self
                        .host
                        .rows()
                        .weigher(test.row, self.selected.row_keys[test.row])
                        .weight(key_value(p_key), test.draft as usize),
                    false => 0,
                };
                let wq = match q_key {
                    NO_KEY => 0,
                    key => {
                        let t = self.host.temperature.as_ref().map(|t| t[test.row]);
                        SliceWeigher::new(draft.keys[q], t, None)
                            .weight(key_value(key), test.draft as usize)
                    }
                };
                let u = draw(self.host.seed[test.row], Purpose::Accept);
                match accepts((wp, wq), (selection.mass(), wq_total), u) {
                    true => Verdict::Accept,
                    false => Verdict::Residual,
                }
            })
            .collect();
        Ok((verdicts, draft))
    }

    /// The raw total weight (before top-k and top-p) of each tested probability row (empty for
    /// logits rows, which are always distributions).
    fn raw_target_totals(&self, tests: &[Test]) -> Result<BTreeMap<usize, u64>> {
        if self.host.temperature.is_some() || tests.is_empty() {
            return Ok(BTreeMap::new());
        }
        let rows = self.host.top_k.len();
        let mut tested: Vec<usize> = tests.iter().map(|t| t.row).collect();
        tested.sort_unstable();
        tested.dedup();
        let (_, mass) = walk(
            self.shard,
            self.weighed,
            &vec![0; rows],
            &vec![u64::MAX; rows],
        )?;
        let gathered = gather_rows(self.shard, &mass, &tested)?;
        Ok(tested
            .into_iter()
            .zip(gathered)
            .map(|(r, m)| (r, m.iter().sum()))
            .collect())
    }

    /// The corrections of the tests rejected for the residual: drawn from it, or the row's
    /// sample when it is empty.
    fn residuals(
        &self,
        tests: &[Test],
        draft: &DraftRows,
        samples: &[i32],
    ) -> Result<Vec<(usize, i32)>> {
        if tests.is_empty() {
            return Ok(Vec::new());
        }
        let shard = self.shard;
        let rows = self.host.top_k.len();
        let (mut threshold, mut target_mass) = (vec![u64::MAX; rows], vec![0u64; rows]);
        let (mut draft_mass, mut draft_row) = (vec![0u64; rows], vec![-1i32; rows]);
        for test in tests {
            let r = test.row;
            let selection = &self.selected.rows[r];
            threshold[r] = selection.threshold();
            target_mass[r] = selection.mass();
            if let Some(q) = test.draft_row {
                draft_mass[r] = draft.totals.get(&q).copied().unwrap_or(0);
                draft_row[r] = i32::try_from(q).unwrap_or(-1);
            }
        }
        let device = shard.device;
        let (target_mass, draft_mass) = (device.upload(&target_mass)?, device.upload(&draft_mass)?);
        let draft_row = device.upload(&draft_row)?;
        let residual = ShardResidual {
            draft: self.rejection.draft,
            draft_key: &draft.key_buffer,
            draft_row: &draft_row,
            target_mass: &target_mass,
            draft_mass: &draft_mass,
        };
        let walked = crate::sample::walk_with(
            shard,
            self.weighed,
            (&threshold, &vec![u64::MAX; rows]),
            Some(residual),
        )?;
        let rejected: Vec<usize> = tests.iter().map(|t| t.row).collect();
        let masses = gather_rows(shard, &walked.mass, &rejected)?;
        let mut out = Vec::new();
        let (mut drawn, mut kept) = (Vec::new(), Vec::new());
        for (&r, masses) in rejected.iter().zip(masses) {
            match masses.iter().sum::<u64>() {
                0 => out.push((r, samples[r])),
                _ => {
                    drawn.push(r);
                    kept.push(masses);
                }
            }
        }
        let draws = Draws {
            purpose: Purpose::Residual,
            seed: &self.host.seed,
            residual: Some(residual),
        };
        out.extend(draw_walks(
            shard,
            self.weighed,
            draws,
            &threshold,
            (&drawn, &kept),
        )?);
        Ok(out)
    }
}

/// REJECTION's acceptance test with `u` the ACCEPT draw: accept iff
/// `U · wq[d] · Wp < 2^32 · wp[d] · Wq` (`U` its high 32 bits; exact, in 192 bits); if
/// `wq[d] == 0`, iff `wp[d] > 0`.
fn accepts((wp, wq): (u64, u64), (wp_total, wq_total): (u64, u64), u: u64) -> bool {
    if wq == 0 {
        return wp > 0;
    }
    let left = u128::from(wq) * u128::from(wp_total);
    let right = u128::from(wp) * u128::from(wq_total);
    let u = u128::from(u >> 32);
    // left · U against right · 2^32, as (high, low) pairs in base 2^64.
    const LOW: u128 = u64::MAX as u128;
    let low = (left & LOW) * u;
    let product = ((left >> 64) * u + (low >> 64), low & LOW);
    let shifted = (right >> 32, (right & 0xffff_ffff) << 32);
    product < shifted
}

/// Runs the planned TARGET_MATCH verification on the rank's device: at once when no two slots
/// need different targets of one row, else one slot at a time (the others stopped), joined.
fn run_plan(
    shard: &Shard<'_>,
    inputs: &VerifyInputs<'_>,
    (out, params): (&mut VerifyOutputs<'_>, &VerifyParams<'_>),
    slots: &Slots,
    plan: Plan,
) -> Result<()> {
    let device = shard.device;
    let drafts = device.upload(&plan.drafts)?;
    let targets_of = |slot: Option<usize>| -> Vec<i32> {
        let mut targets = vec![-1; slots.rows];
        for (&row, needs) in &plan.needs {
            let need = needs.iter().find(|&&(b, _)| slot.is_none_or(|s| s == b));
            if let Some(&(_, token)) = need {
                targets[row] = token;
            }
        }
        targets
    };
    let verify = |targets: &[i32], stop_flags: &Buffer, out: &mut VerifyOutputs<'_>| {
        let targets = device.upload(targets)?;
        let mut state = inputs.state;
        state.stop_flags = stop_flags;
        let inputs = VerifyInputs {
            draft_tokens: &drafts,
            state,
            strategy: StrategyInputs::TargetMatch {
                target_tokens: &targets,
            },
            ..*inputs
        };
        device.verify_draft_tokens(&inputs, out, params)?;
        Ok::<(), ShardError>(())
    };
    if !plan.conflicts() {
        return verify(&targets_of(None), inputs.state.stop_flags, out);
    }
    let s = slots.s;
    let mut accept_tokens = vec![-1i32; slots.stop_flags.len() * s];
    let mut accept_num = vec![0i32; slots.stop_flags.len()];
    for b in (0..slots.real_bsz).filter(|&b| slots.tokens_this_step(b) > 0) {
        let mut stopped = vec![1u8; slots.stop_flags.len()];
        stopped[b] = 0;
        verify(&targets_of(Some(b)), &device.upload(&stopped)?, out)?;
        let tokens: Vec<i32> = device.download(out.accept_tokens)?;
        let num: Vec<i32> = device.download(out.accept_num)?;
        accept_tokens[b * s..(b + 1) * s].copy_from_slice(&tokens[b * s..(b + 1) * s]);
        accept_num[b] = num[b];
    }
    device.write(out.accept_tokens, &accept_tokens)?;
    device.write(out.accept_num, &accept_num)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::accepts;

    #[test]
    fn acceptance_is_exact_beyond_128_bits() {
        // wq · Wp · U reaches 2^40 · 2^60 · 2^32 = 2^132; p(d) = q(d) / 2: accept iff
        // U < 2^31.
        let (w, total) = (1u64 << 40, 1u64 << 60);
        let u = u64::MAX;
        assert!(!accepts((w / 2, w), (total, total), u));
        assert!(!accepts((w / 2, w), (total, total), 1 << 63));
        assert!(accepts((w / 2, w), (total, total), (1 << 63) - 1));
        assert!(accepts((w / 2, w), (total, total), 0));
        // wp / Wp = wq / Wq (the same distribution): accept iff U < 2^32, always.
        assert!(accepts((3, 6), (12, 24), u));
        assert!(accepts((5, 0), (10, 10), u));
        assert!(!accepts((0, 0), (10, 10), 0));
        // wp = 0 < wq: never.
        assert!(!accepts((0, 1), (10, 10), 0));
    }
}
