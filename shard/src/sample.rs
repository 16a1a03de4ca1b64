//! Sharded `top_k_top_p_sample` (`docs/semantics.md` §5.6, §4d): every rank gets the token of
//! the whole row.

use specula_backend_api::DeviceExt;
use specula_backend_api::abi::{MAX_SHARD_RECORDS, TOP_P_BITS};
use specula_backend_api::fixed_point::{reaches_top_p, scale_draw, top_p_fixed, top_p_target_mass};
use specula_backend_api::ops::{
    ShardRecordsParams, ShardRows, ShardWalkInputs, ShardWalkOutputs, ShardWalkParams,
};
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::shard::{KeyOrder, NO_KEY, key_id};

use crate::error::Result;
use crate::rows::{HostRows, Shard, SliceRows};
use crate::search::{RowSearch, Target, search};

/// A gathered `(key, weight)` record.
pub(crate) type Record = (u64, u64);

/// The token of a row whose survivors weigh nothing: its first token in rank order (the
/// fallback's, with processing), -1 when every token is masked.
pub(crate) fn first_token(row_key: u64) -> i32 {
    match row_key {
        NO_KEY => -1,
        key => key_id(key) as i32,
    }
}

/// `top_k_top_p_sample` of the whole rows of which this rank holds `rows`: the same tokens on
/// every rank, those of the unsharded op (with `rows.fallback`, those of the composition with
/// `process_logits`).
pub fn top_k_top_p_sample(
    shard: &Shard<'_>,
    rows: &SliceRows<'_>,
    host: &HostRows<'_>,
) -> Result<Vec<i32>> {
    let n = host.rows();
    host.validate(n)?;
    let vocab = shard.partition.vocab();
    let row_keys = shard.row_keys(rows, n, KeyOrder::Rank)?;
    let key_buffer = shard.device.upload(&row_keys)?;
    let weighed = Shard::weighed(rows, &key_buffer);
    let mut tokens = vec![-1; n];
    let mut records = vec![0usize; n];
    let mut searched = Vec::new();
    for r in 0..n {
        let k = host.top_k[r];
        if host.argmax_only(r, row_keys[r]) || row_keys[r] == NO_KEY {
            tokens[r] = first_token(row_keys[r]);
        } else if k > 0 && (k as usize) < vocab && k as usize <= MAX_SHARD_RECORDS {
            records[r] = k as usize;
        } else {
            searched.push(r);
        }
    }
    if records.iter().any(|&k| k > 0) {
        let gathered = gather_records(shard, &weighed, &records)?;
        for (r, records) in gathered {
            tokens[r] = sample_records(records, records_k(host.top_k, r), host, r, row_keys[r]);
        }
    }
    if !searched.is_empty() {
        for (r, token) in searched_tokens(shard, &weighed, host, &row_keys, &searched)? {
            tokens[r] = token;
        }
    }
    Ok(tokens)
}

fn records_k(top_k: &[i32], r: usize) -> usize {
    top_k[r].max(0) as usize
}

/// Each rank's first `k[r]` records of every row with `k[r] > 0`, gathered: per such row, the
/// records of every rank (padding dropped).
pub(crate) fn gather_records(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    k: &[usize],
) -> Result<Vec<(usize, Vec<Record>)>> {
    let n = k.len();
    let width = k.iter().copied().max().unwrap_or(0).max(1);
    let mut out = shard.device.alloc::<u64>(n * width * 2)?;
    let params = ShardRecordsParams {
        shape: shard.shape(n),
        records: width,
        order: KeyOrder::Rank,
    };
    shard.device.shard_records(rows, &mut out, &params)?;
    let local: Vec<u64> = shard.device.download(&out)?;
    let send: Vec<u64> = (0..n)
        .flat_map(|r| local[r * width * 2..r * width * 2 + k[r] * 2].to_vec())
        .collect();
    let gathered = shard.group.all_gather(&send)?;
    let per_rank = send.len();
    let mut result = Vec::new();
    let mut at = 0;
    for (r, &kr) in k.iter().enumerate() {
        if kr == 0 {
            continue;
        }
        let records = (0..shard.group.ranks())
            .flat_map(|rank| {
                let start = rank * per_rank + at;
                gathered[start..start + 2 * kr]
                    .chunks(2)
                    .map(|c| (c[0], c[1]))
            })
            .filter(|&(key, _)| key != NO_KEY)
            .collect();
        result.push((r, records));
        at += 2 * kr;
    }
    Ok(result)
}

/// The token of a top-k row from its gathered records: the first `k` by key are the survivors,
/// the kept prefix reaches top_p of their weight, the draw walks it in ascending id order.
fn sample_records(
    mut records: Vec<Record>,
    k: usize,
    host: &HostRows<'_>,
    r: usize,
    row_key: u64,
) -> i32 {
    records.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
    records.truncate(k);
    let total: u64 = records.iter().map(|&(_, w)| w).sum();
    if total == 0 {
        return first_token(row_key);
    }
    let p = top_p_fixed(host.top_p[r]);
    let mut mass = 0u64;
    let mut kept = records.len();
    for (i, &(_, w)) in records.iter().enumerate() {
        mass += w;
        if reaches_top_p(mass, p, total) {
            kept = i + 1;
            break;
        }
    }
    records.truncate(kept);
    draw_in_id_order(&mut records, host.seed[r])
}

/// The SAMPLE draw over `records` walked in ascending id order.
fn draw_in_id_order(records: &mut [Record], seed: u64) -> i32 {
    records.sort_unstable_by_key(|&(key, _)| key_id(key));
    let mass: u64 = records.iter().map(|&(_, w)| w).sum();
    let t = scale_draw(draw(seed, Purpose::Sample), mass);
    let mut running = 0u64;
    for &(key, w) in records.iter() {
        running += w;
        if running > t {
            return key_id(key) as i32;
        }
    }
    -1
}

/// The slice's kept mass of each row (keys at or above `threshold[r]`), walking from `offset`
/// (`u64::MAX`: none): the tokens where the walks end and the masses.
pub(crate) fn walk(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    threshold: &[u64],
    offset: &[u64],
) -> Result<(Vec<i32>, Vec<u64>)> {
    let n = threshold.len();
    let device = shard.device;
    let threshold = device.upload(threshold)?;
    let offset = device.upload(offset)?;
    let mut tokens = device.alloc::<i32>(n)?;
    let mut mass = device.alloc::<u64>(n)?;
    let mut count = device.alloc::<u64>(n)?;
    device.shard_walk(
        &ShardWalkInputs {
            rows: *rows,
            threshold: &threshold,
            offset: &offset,
            residual: None,
        },
        &mut ShardWalkOutputs {
            tokens: &mut tokens,
            mass: &mut mass,
            count: &mut count,
        },
        &ShardWalkParams {
            shape: shard.shape(n),
        },
    )?;
    Ok((device.download(&tokens)?, device.download(&mass)?))
}

/// The rows sampled with the radix search (no top-k, or one above 1024): the survivors (a count
/// search), their weight, the kept threshold (a mass search), the kept masses, the draw.
fn searched_tokens(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    host: &HostRows<'_>,
    row_keys: &[u64],
    searched: &[usize],
) -> Result<Vec<(usize, i32)>> {
    let n = host.rows();
    let vocab = shard.partition.vocab() as u64;
    // Survivors of a top-k above the records: the key of the top_k-th token.
    let mut floor = vec![0u64; n];
    let counted: Vec<RowSearch> = searched
        .iter()
        .filter(|&&r| host.top_k[r] > 0 && (host.top_k[r] as u64) < vocab)
        .map(|&r| RowSearch {
            row: r,
            row_key: row_keys[r],
            floor: 0,
            need: host.top_k[r] as u64,
        })
        .collect();
    for (s, t) in counted
        .iter()
        .zip(search(shard, rows, host, &counted, Target::Count)?)
    {
        floor[s.row] = t;
    }
    let (_, mass) = walk(shard, rows, &floor, &vec![u64::MAX; n])?;
    let masses = gather_rows(shard, &mass, searched)?;
    let mut out = Vec::new();
    let mut cut = Vec::new();
    for (i, &r) in searched.iter().enumerate() {
        let total: u64 = masses[i].iter().sum();
        let p = top_p_fixed(host.top_p[r]);
        if total == 0 {
            out.push((r, first_token(row_keys[r])));
        } else if p < 1 << TOP_P_BITS {
            cut.push(RowSearch {
                row: r,
                row_key: row_keys[r],
                floor: floor[r],
                need: top_p_target_mass(p, total),
            });
        }
    }
    let mut threshold = floor;
    for (s, t) in cut
        .iter()
        .zip(search(shard, rows, host, &cut, Target::Mass)?)
    {
        threshold[s.row] = t;
    }
    let drawn: Vec<usize> = searched
        .iter()
        .copied()
        .filter(|r| !out.iter().any(|(o, _)| o == r))
        .collect();
    let kept = match cut.is_empty() {
        true => masses,
        false => {
            let (_, mass) = walk(shard, rows, &threshold, &vec![u64::MAX; n])?;
            gather_rows(shard, &mass, searched)?
        }
    };
    let kept: Vec<Vec<u64>> = searched
        .iter()
        .zip(kept)
        .filter(|(r, _)| drawn.contains(r))
        .map(|(_, m)| m)
        .collect();
    out.extend(draw_walks(shard, rows, host, &threshold, &drawn, &kept)?);
    Ok(out)
}

/// Every rank's value of `local[r]` for each row of `rows`: `[row][rank]`.
pub(crate) fn gather_rows(
    shard: &Shard<'_>,
    local: &[u64],
    rows: &[usize],
) -> Result<Vec<Vec<u64>>> {
    let send: Vec<u64> = rows.iter().map(|&r| local[r]).collect();
    let gathered = shard.group.all_gather(&send)?;
    Ok((0..rows.len())
        .map(|i| {
            (0..shard.group.ranks())
                .map(|rank| gathered[rank * rows.len() + i])
                .collect()
        })
        .collect())
}

/// The draw of `docs/semantics.md` §4d step 4: for each row of `drawn` with the ranks' kept
/// masses `kept[i]`, the rank whose range holds `t` walks from its offset, and a MAX gives its
/// token to every rank.
pub(crate) fn draw_walks(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    host: &HostRows<'_>,
    threshold: &[u64],
    drawn: &[usize],
    kept: &[Vec<u64>],
) -> Result<Vec<(usize, i32)>> {
    if drawn.is_empty() {
        return Ok(Vec::new());
    }
    let n = host.rows();
    let me = shard.group.rank();
    let mut offset = vec![u64::MAX; n];
    for (&r, masses) in drawn.iter().zip(kept) {
        let total: u64 = masses.iter().sum();
        let mut t = scale_draw(draw(host.seed[r], Purpose::Sample), total);
        for (rank, &m) in masses.iter().enumerate() {
            if t < m {
                if rank == me {
                    offset[r] = t;
                }
                break;
            }
            t -= m;
        }
    }
    let (tokens, _) = walk(shard, rows, threshold, &offset)?;
    let mut found: Vec<u64> = drawn.iter().map(|&r| (tokens[r] + 1) as u64).collect();
    shard.group.max_u64(&mut found)?;
    Ok(drawn
        .iter()
        .zip(found)
        .map(|(&r, t)| (r, t as i32 - 1))
        .collect())
}
