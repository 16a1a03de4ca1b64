//! Sharded `accept_logprobs` (`docs/semantics.md` §5.11, §4d): ids and ranks exact, values
//! float.
//!
//! Every rank computes the outputs of the whole rows from a few exchanges over the rows that
//! accepted tokens come from: the row maximum (the rank-order row key) and, at `T == 0`, the
//! argmax (the argmax-order row key); the softmax normaliser, the ranks' `shard_exp_sum`
//! gathered and added in rank order (so the values differ from the unsharded op's only by the
//! order of that sum, within the tolerance of §1); each token's logit (its key, a MAX); its rank,
//! 1 + the SUM of the slices' counts of strictly larger logits; and the top-K, the first `K` of
//! the ranks' gathered records in argmax order.

use specula_backend_api::abi::MAX_LOGPROBS_TOP_K;
use specula_backend_api::logit_weights::effective_temperature;
use specula_backend_api::ops::{
    LogprobsInputs, LogprobsOutputs, LogprobsParams, Scores, ShardExpSumInputs, ShardExpSumParams,
    ShardRecordsParams, ShardRows,
};
use specula_backend_api::shard::{
    KeyOrder, NO_KEY, above_value, key_id, key_ord, key_value, ord_value,
};
use specula_backend_api::{Buffer, DeviceExt};

use crate::error::{Result, ShardError};
use crate::rows::{Shard, SliceRows, pair_rounds};
use crate::sample::walk_with;

/// One packed entry: an accepted token and the row it is scored against (if it exists).
#[derive(Clone, Copy, Debug)]
struct Entry {
    token: i32,
    row: Option<usize>,
}

/// The distribution of one whole logits row (`docs/semantics.md` §5.5).
#[derive(Clone, Copy, Debug)]
enum Distribution {
    /// `T == 0`: everything on the argmax.
    OneHot(usize),
    /// The maximum is +inf: uniform over the `count` entries equal to +inf.
    PosInf { count: f32 },
    /// Every logit is −inf (or NaN): uniform over the vocabulary.
    Uniform { vocab: usize },
    /// `exp(y) / sum` with `y = (l − max) / t`.
    Scaled { max: f32, t: f32, sum: f32 },
}

impl Distribution {
    /// The log-probability of token `id` whose logit is `l`.
    fn logprob(&self, id: usize, l: f32) -> f32 {
        match *self {
            Distribution::OneHot(arg) if id == arg => 0.0,
            Distribution::OneHot(_) => f32::NEG_INFINITY,
            Distribution::PosInf { count } if l == f32::INFINITY => -count.ln(),
            Distribution::PosInf { .. } => f32::NEG_INFINITY,
            Distribution::Uniform { vocab } => -(vocab as f32).ln(),
            Distribution::Scaled { max, t, sum } => scaled(l, max, t) - sum.ln(),
        }
    }
}

/// `(l − max) / t` (f32, subtract first) with NaN and −inf logits at −inf, and every finite
/// logit at 0 when `t = +inf`.
fn scaled(l: f32, max: f32, t: f32) -> f32 {
    if l.is_nan() || l == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else if t == f32::INFINITY {
        0.0
    } else {
        (l - max) / t
    }
}

/// The packed outputs on the host.
struct Packed {
    cu_accept: Vec<i32>,
    token_ids: Vec<i32>,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    top_ids: Vec<i32>,
    top_logprobs: Vec<f32>,
}

/// `accept_logprobs` of sharded rows: `inputs.logits` is this rank's `[rows, slice.len]` slice
/// of the logits, `params.shape` the whole `[rows, V]`; every rank writes the outputs the
/// unsharded op writes, the ids, ranks and offsets exactly, the log-probabilities within the
/// tolerance of a reordered normaliser (`docs/semantics.md` §1).
pub fn accept_logprobs(
    shard: &Shard<'_>,
    inputs: &LogprobsInputs<'_>,
    out: &mut LogprobsOutputs<'_>,
    params: &LogprobsParams<'_>,
) -> Result<()> {
    validate(params)?;
    let device = shard.device;
    let (rows, k) = (params.shape.rows, params.top_k);
    let entries = entries(shard, inputs, params)?;
    let packed_len = params.dims.max_bsz * params.dims.max_step_tokens;
    let temperature: Vec<f32> = device.download(inputs.temperature)?;
    let logits = Scores::logits(inputs.logits, inputs.temperature);
    let mut used: Vec<usize> = entries.1.iter().filter_map(|e| e.row).collect();
    used.sort_unstable();
    used.dedup();
    let rank_keys = shard.row_keys(&SliceRows::new(logits), rows, KeyOrder::Rank)?;
    let argmax_keys = shard.row_keys(&SliceRows::new(logits), rows, KeyOrder::Argmax)?;
    let key_buffer = device.upload(&rank_keys)?;
    let sums = exp_sums(shard, inputs, &key_buffer, &used)?;
    let mut dist = vec![Distribution::Uniform { vocab: 0 }; rows];
    for (&r, &sum) in used.iter().zip(&sums) {
        dist[r] = distribution(
            (rank_keys[r], argmax_keys[r]),
            effective_temperature(temperature[r]),
            sum,
            params.shape.vocab,
        );
    }
    let scored: Vec<(usize, usize, i32)> = entries
        .1
        .iter()
        .enumerate()
        .take(packed_len)
        .filter_map(|(p, e)| {
            let id = usize::try_from(e.token).ok()?;
            (id < params.shape.vocab).then_some((p, e.row?, e.token))
        })
        .collect();
    let pairs: Vec<(usize, i32)> = scored.iter().map(|&(_, r, t)| (r, t)).collect();
    let token_keys = shard.token_keys(logits, rows, &pairs, KeyOrder::Rank)?;
    let larger = counts_above(shard, (logits, &key_buffer), rows, &pairs, &token_keys)?;
    let top = top_records(shard, (logits, &key_buffer), rows, &used, k)?;
    let mut packed = Packed {
        cu_accept: entries.0,
        token_ids: vec![-1; packed_len],
        logprobs: vec![f32::NEG_INFINITY; packed_len],
        ranks: vec![0; packed_len],
        top_ids: vec![-1; packed_len * k],
        top_logprobs: vec![f32::NEG_INFINITY; packed_len * k],
    };
    for (p, e) in entries.1.iter().enumerate().take(packed_len) {
        packed.token_ids[p] = e.token;
        let Some(r) = e.row else { continue };
        let best = used.binary_search(&r).ok().map(|i| &top[i]);
        for (j, &key) in best.into_iter().flatten().enumerate() {
            let id = key_id(key);
            packed.top_ids[p * k + j] = id as i32;
            packed.top_logprobs[p * k + j] = dist[r].logprob(id, ord_value(key_ord(key)));
        }
    }
    for ((&(p, r, token), key), count) in scored.iter().zip(token_keys).zip(larger) {
        packed.logprobs[p] = dist[r].logprob(token as usize, key_value(key));
        packed.ranks[p] = i32::try_from(count.saturating_add(1)).unwrap_or(i32::MAX);
    }
    write(shard, out, &packed)
}

/// `K ≤ 64`, and host temperatures (when given) not negative and not NaN.
fn validate(params: &LogprobsParams<'_>) -> Result<()> {
    if params.top_k > MAX_LOGPROBS_TOP_K {
        return Err(ShardError::InvalidArgument {
            what: format!("accept_logprobs: top_k {} above 64", params.top_k),
        });
    }
    if let Some(t) = params
        .host_temperature
        .and_then(|t| t.iter().find(|t| t.is_nan() || **t < 0.0))
    {
        return Err(ShardError::InvalidArgument {
            what: format!("accept_logprobs: host temperature {t}"),
        });
    }
    Ok(())
}

/// The packed entries, slot by slot, and `cu_accept` (their exclusive prefix sum per slot).
fn entries(
    shard: &Shard<'_>,
    inputs: &LogprobsInputs<'_>,
    params: &LogprobsParams<'_>,
) -> Result<(Vec<i32>, Vec<Entry>)> {
    let device = shard.device;
    let dims = params.dims;
    let s = dims.max_step_tokens;
    let accept_tokens: Vec<i32> = device.download(inputs.accept_tokens)?;
    let accept_num: Vec<i32> = device.download(inputs.accept_num)?;
    let encoder: Vec<i32> = device.download(inputs.seq_lens_encoder)?;
    let cu_out: Vec<i32> = device.download(inputs.cu_seqlens_q_output)?;
    let mut cu_accept = vec![0i32; dims.max_bsz + 1];
    let mut out = Vec::new();
    for b in 0..dims.max_bsz {
        let n = match b < dims.real_bsz {
            true => usize::try_from(accept_num[b]).unwrap_or(0).min(s),
            false => 0,
        };
        for k in 0..n {
            let row = cu_out.get(b).and_then(|&base| {
                let r = i64::from(base) + if encoder[b] > 0 { 0 } else { k as i64 };
                usize::try_from(r).ok().filter(|&r| r < params.shape.rows)
            });
            out.push(Entry {
                token: accept_tokens[b * s + k],
                row,
            });
        }
        cu_accept[b + 1] = i32::try_from(out.len()).unwrap_or(i32::MAX);
    }
    Ok((cu_accept, out))
}

/// The whole row's distribution from its row keys (rank order: the maximum; argmax order: the
/// argmax), its effective temperature and its normaliser `sum` (the count of +inf logits when
/// the maximum is +inf).
fn distribution(
    (rank_key, argmax_key): (u64, u64),
    t: f32,
    sum: f32,
    vocab: usize,
) -> Distribution {
    if t == 0.0 {
        return Distribution::OneHot(key_id(argmax_key));
    }
    let max = key_value(rank_key);
    if max == f32::INFINITY {
        return Distribution::PosInf { count: sum };
    }
    if max == f32::NEG_INFINITY || rank_key == NO_KEY {
        return Distribution::Uniform { vocab };
    }
    Distribution::Scaled { max, t, sum }
}

/// The normaliser of each row of `used`: the ranks' `shard_exp_sum`, gathered and added in rank
/// order.
fn exp_sums(
    shard: &Shard<'_>,
    inputs: &LogprobsInputs<'_>,
    row_key: &Buffer,
    used: &[usize],
) -> Result<Vec<f32>> {
    let device = shard.device;
    let rows = row_key.len();
    let mut sums = device.alloc::<f32>(rows)?;
    device.shard_exp_sum(
        &ShardExpSumInputs {
            logits: inputs.logits,
            temperature: inputs.temperature,
            row_key,
        },
        &mut sums,
        &ShardExpSumParams {
            shape: shard.shape(rows),
        },
    )?;
    let local: Vec<f32> = device.download(&sums)?;
    let send: Vec<u64> = used
        .iter()
        .map(|&r| u64::from(local[r].to_bits()))
        .collect();
    let gathered = shard.group.all_gather(&send)?;
    Ok((0..used.len())
        .map(|i| {
            (0..shard.group.ranks())
                .map(|rank| f32::from_bits(gathered[rank * used.len() + i] as u32))
                .fold(0.0f32, |sum, x| sum + x)
        })
        .collect())
}

/// For each `(row, token)` pair of key `keys[i]`: the number of tokens of the whole row whose
/// logit is strictly larger (the SUM of the slices' counts of keys at or above
/// `above_value(key)`). A row named more than once is counted again in another round.
fn counts_above(
    shard: &Shard<'_>,
    (logits, row_key): (Scores<'_>, &Buffer),
    rows: usize,
    pairs: &[(usize, i32)],
    keys: &[u64],
) -> Result<Vec<u64>> {
    let weighed = ShardRows::new(logits, row_key);
    let mut counts = vec![0u64; pairs.len()];
    for members in pair_rounds(pairs, rows) {
        let mut threshold = vec![u64::MAX; rows];
        for &i in &members {
            threshold[pairs[i].0] = above_value(keys[i]);
        }
        let walked = walk_with(shard, &weighed, (&threshold, &vec![u64::MAX; rows]), None)?;
        let mut found: Vec<u64> = members.iter().map(|&i| walked.count[pairs[i].0]).collect();
        shard.group.sum_u64(&mut found)?;
        for (&i, count) in members.iter().zip(found) {
            counts[i] = count;
        }
    }
    Ok(counts)
}

/// The first `k` keys in argmax order of each row of `used`: the ranks' first `k` records,
/// gathered and merged.
fn top_records(
    shard: &Shard<'_>,
    (logits, row_key): (Scores<'_>, &Buffer),
    rows: usize,
    used: &[usize],
    k: usize,
) -> Result<Vec<Vec<u64>>> {
    if k == 0 || used.is_empty() {
        return Ok(vec![Vec::new(); used.len()]);
    }
    let device = shard.device;
    let mut records = device.alloc::<u64>(rows * k * 2)?;
    device.shard_records(
        &ShardRows::new(logits, row_key),
        &mut records,
        &ShardRecordsParams {
            shape: shard.shape(rows),
            records: k,
            order: KeyOrder::Argmax,
        },
    )?;
    let local: Vec<u64> = device.download(&records)?;
    let send: Vec<u64> = used
        .iter()
        .flat_map(|&r| (0..k).map(move |j| (r * k + j) * 2))
        .map(|at| local[at])
        .collect();
    let gathered = shard.group.all_gather(&send)?;
    let per_rank = send.len();
    Ok((0..used.len())
        .map(|i| {
            let mut keys: Vec<u64> = (0..shard.group.ranks())
                .flat_map(|rank| {
                    gathered[rank * per_rank + i * k..rank * per_rank + (i + 1) * k].to_vec()
                })
                .filter(|&key| key != NO_KEY)
                .collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            keys.truncate(k);
            keys
        })
        .collect())
}

/// Writes the packed outputs to the rank's output buffers.
fn write(shard: &Shard<'_>, out: &mut LogprobsOutputs<'_>, packed: &Packed) -> Result<()> {
    let device = shard.device;
    device.write(out.cu_accept, &packed.cu_accept)?;
    device.write(out.token_ids, &packed.token_ids)?;
    device.write(out.logprobs, &packed.logprobs)?;
    device.write(out.ranks, &packed.ranks)?;
    device.write(out.top_ids, &packed.top_ids)?;
    device.write(out.top_logprobs, &packed.top_logprobs)?;
    Ok(())
}
