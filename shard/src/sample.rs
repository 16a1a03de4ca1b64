//! Sharded `top_k_top_p_sample` (`docs/semantics.md` §5.6, §4d): every rank gets the token of
//! the whole row.

use specula_backend_api::abi::{MAX_SHARD_RECORDS, TOP_P_BITS};
use specula_backend_api::fixed_point::{reaches_top_p, scale_draw, top_p_fixed, top_p_target_mass};
use specula_backend_api::ops::{
    ShardRecordsParams, ShardResidual, ShardRows, ShardWalkInputs, ShardWalkOutputs,
    ShardWalkParams,
};
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::shard::{KeyOrder, NO_KEY, key_id, key_value};
use specula_backend_api::{Buffer, DeviceExt};

use crate::error::Result;
use crate::rows::{HostRows, Shard, SliceRows};
use crate::search::{RowSearch, Target, search};

/// A gathered `(key, weight)` record.
pub(crate) type Record = (u64, u64);

/// The first token in rank order of a row of row key `row_key` (-1 for [`NO_KEY`]).
pub(crate) fn first_token(row_key: u64) -> i32 {
    match row_key {
        NO_KEY => -1,
        key => key_id(key) as i32,
    }
}

/// How the token of a row is chosen (`docs/semantics.md` §4d): its kept set, found from the
/// gathered records or by the radix search, or a token decided without a draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Selection {
    /// Decided without a draw: the first token in rank order of a row whose weight is on that
    /// token alone (`T == 0`) or of a row that weighs nothing (-1: every token masked). The
    /// kept set is the keys at or above `threshold` (`u64::MAX`: none), of mass `mass`.
    Fixed {
        /// The token.
        token: i32,
        /// The kept threshold key.
        threshold: u64,
        /// The kept mass.
        mass: u64,
    },
    /// A top-k row within the records: its kept records (the kept prefix, in rank order).
    Records(Vec<Record>),
    /// A searched row: the kept threshold key and each rank's kept mass.
    Searched {
        /// The kept threshold key.
        threshold: u64,
        /// The kept mass of each rank.
        masses: Vec<u64>,
    },
}

impl Selection {
    /// The kept tokens are those whose rank key is at least this (`u64::MAX`: none).
    pub(crate) fn threshold(&self) -> u64 {
        match self {
            Selection::Fixed { threshold, .. } => *threshold,
            Selection::Records(kept) => kept.last().map_or(u64::MAX, |&(key, _)| key),
            Selection::Searched { threshold, .. } => *threshold,
        }
    }

    /// The kept mass of the whole row (`Wp`).
    pub(crate) fn mass(&self) -> u64 {
        match self {
            Selection::Fixed { mass, .. } => *mass,
            Selection::Records(kept) => kept.iter().map(|&(_, w)| w).sum(),
            Selection::Searched { masses, .. } => masses.iter().sum(),
        }
    }
}

/// The rows selected: their row keys (on the host and on the device) and each row's selection.
pub(crate) struct Selected {
    /// The row key of each whole row (rank order).
    pub(crate) row_keys: Vec<u64>,
    /// The same on the device.
    pub(crate) key_buffer: Buffer,
    /// Each row's selection.
    pub(crate) rows: Vec<Selection>,
}

/// `top_k_top_p_sample` of the whole rows of which this rank holds `rows`: the same tokens on
/// every rank, those of the unsharded op (with `rows.fallback` from the ranks' `process_logits`
/// over their slices, those of the composition with `process_logits`).
pub fn top_k_top_p_sample(
    shard: &Shard<'_>,
    rows: &SliceRows<'_>,
    host: &HostRows<'_>,
) -> Result<Vec<i32>> {
    let selected = select(shard, rows, host)?;
    let weighed = Shard::weighed(rows, &selected.key_buffer);
    draw_selected(shard, &weighed, host, &selected.rows)
}

/// The kept set of every row (`docs/semantics.md` §4d steps 1–3 and 5): the row keys, then the
/// top-k rows from their gathered records and the others by the radix search.
pub(crate) fn select(
    shard: &Shard<'_>,
    rows: &SliceRows<'_>,
    host: &HostRows<'_>,
) -> Result<Selected> {
    let n = host.rows();
    host.validate(n)?;
    let vocab = shard.partition.vocab();
    let row_keys = shard.row_keys(rows, n, KeyOrder::Rank)?;
    let zero = shard.zero_tokens(rows, &row_keys)?;
    let key_buffer = shard.device.upload(&row_keys)?;
    let weighed = Shard::weighed(rows, &key_buffer);
    let mut selection = vec![None; n];
    let mut records = vec![0usize; n];
    let mut searched = Vec::new();
    for r in 0..n {
        let k = host.top_k[r];
        if host.argmax_only(r, row_keys[r]) || row_keys[r] == NO_KEY {
            selection[r] = Some(fixed(host, r, row_keys[r], zero[r]));
        } else if k > 0 && (k as usize) < vocab && k as usize <= MAX_SHARD_RECORDS {
            records[r] = k as usize;
        } else {
            searched.push(r);
        }
    }
    if records.iter().any(|&k| k > 0) {
        for (r, gathered) in gather_records(shard, &weighed, &records)? {
            selection[r] = Some(kept_records(gathered, records[r], host.top_p[r], zero[r]));
        }
    }
    if !searched.is_empty() {
        let keys = (row_keys.as_slice(), zero.as_slice());
        for (r, s) in searched_selection(shard, &weighed, host, keys, &searched)? {
            selection[r] = Some(s);
        }
    }
    let rows = selection
        .into_iter()
        .map(|s| s.unwrap_or_else(|| nothing_kept(-1)))
        .collect();
    Ok(Selected {
        row_keys,
        key_buffer,
        rows,
    })
}

/// The token of every row from its selection: kept records are drawn from on the host, searched
/// rows by the walk of `docs/semantics.md` §4d step 4.
pub(crate) fn draw_selected(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    host: &HostRows<'_>,
    selection: &[Selection],
) -> Result<Vec<i32>> {
    let n = selection.len();
    let mut tokens = vec![-1; n];
    let (mut drawn, mut kept, mut threshold) = (Vec::new(), Vec::new(), vec![u64::MAX; n]);
    for (r, s) in selection.iter().enumerate() {
        match s {
            Selection::Fixed { token, .. } => tokens[r] = *token,
            Selection::Records(records) => {
                tokens[r] = draw_in_id_order(&mut records.clone(), host.seed[r]);
            }
            Selection::Searched {
                threshold: t,
                masses,
            } => {
                drawn.push(r);
                kept.push(masses.clone());
                threshold[r] = *t;
            }
        }
    }
    let draws = Draws {
        purpose: Purpose::Sample,
        seed: host.seed,
        residual: None,
    };
    for (r, token) in draw_walks(shard, rows, draws, &threshold, (&drawn, &kept))? {
        tokens[r] = token;
    }
    Ok(tokens)
}

/// A row whose kept set is empty: `token` (its first token in rank order, or -1).
fn nothing_kept(token: i32) -> Selection {
    Selection::Fixed {
        token,
        threshold: u64::MAX,
        mass: 0,
    }
}

/// A row decided by its row key alone (`T == 0` with a finite or −inf maximum, or no key): its
/// first token in rank order, kept alone, when it weighs anything, else `zero`.
fn fixed(host: &HostRows<'_>, r: usize, row_key: u64, zero: i32) -> Selection {
    let mass = match row_key {
        NO_KEY => 0,
        key => host.weigher(r, key).weight(key_value(key), key_id(key)),
    };
    match mass {
        0 => nothing_kept(zero),
        mass => Selection::Fixed {
            token: first_token(row_key),
            threshold: row_key,
            mass,
        },
    }
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

/// The kept set of a top-k row from its gathered records: the first `k` by key are the
/// survivors, the kept prefix reaches top_p of their weight (`zero` when they weigh nothing).
fn kept_records(mut records: Vec<Record>, k: usize, top_p: f32, zero: i32) -> Selection {
    records.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
    records.truncate(k);
    let total: u64 = records.iter().map(|&(_, w)| w).sum();
    if total == 0 {
        return nothing_kept(zero);
    }
    let p = top_p_fixed(top_p);
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
    Selection::Records(records)
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

/// What `shard_walk` found on this rank's slice, per row.
pub(crate) struct Walked {
    /// Where each walk ended (-1: not on this slice, or no walk).
    pub(crate) tokens: Vec<i32>,
    /// The slice's kept (or residual) mass.
    pub(crate) mass: Vec<u64>,
    /// The slice's kept tokens.
    pub(crate) count: Vec<u64>,
}

/// The slice's kept mass of each row (keys at or above `threshold[r]`), walking from `offset`
/// (`u64::MAX`: none), or with `residual` REJECTION's residual in place of the kept weights.
pub(crate) fn walk_with(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    (threshold, offset): (&[u64], &[u64]),
    residual: Option<ShardResidual<'_>>,
) -> Result<Walked> {
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
            residual,
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
    Ok(Walked {
        tokens: device.download(&tokens)?,
        mass: device.download(&mass)?,
        count: device.download(&count)?,
    })
}

/// The slice's kept mass of each row (keys at or above `threshold[r]`), walking from `offset`
/// (`u64::MAX`: none): the tokens where the walks end and the masses.
pub(crate) fn walk(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    threshold: &[u64],
    offset: &[u64],
) -> Result<(Vec<i32>, Vec<u64>)> {
    let walked = walk_with(shard, rows, (threshold, offset), None)?;
    Ok((walked.tokens, walked.mass))
}

/// The kept sets of the rows of the radix search (no top-k, or one above 1024): the survivors
/// (a count search), their weight, the kept threshold (a mass search) and the kept masses.
fn searched_selection(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    host: &HostRows<'_>,
    (row_keys, zero): (&[u64], &[i32]),
    searched: &[usize],
) -> Result<Vec<(usize, Selection)>> {
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
            out.push((r, nothing_kept(zero[r])));
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
    let kept = match cut.is_empty() {
        true => masses,
        false => {
            let (_, mass) = walk(shard, rows, &threshold, &vec![u64::MAX; n])?;
            gather_rows(shard, &mass, searched)?
        }
    };
    for (&r, masses) in searched.iter().zip(kept) {
        if !out.iter().any(|(o, _)| *o == r) {
            let threshold = threshold[r];
            out.push((r, Selection::Searched { threshold, masses }));
        }
    }
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

/// The draws of [`draw_walks`]: the purpose of the draw, the rows' seeds, and REJECTION's
/// residual in place of the kept weights when given.
#[derive(Clone, Copy)]
pub(crate) struct Draws<'a> {
    /// The purpose of each row's draw (`Sample`, or `Residual`).
    pub(crate) purpose: Purpose,
    /// Every row's seed.
    pub(crate) seed: &'a [u64],
    /// The residual walked (`None`: the kept weights).
    pub(crate) residual: Option<ShardResidual<'a>>,
}

/// The draw of `docs/semantics.md` §4d step 4: for each row of `drawn` with the ranks' kept
/// masses `kept[i]`, the rank whose range holds `t` walks from its offset, and a MAX gives its
/// token to every rank.
pub(crate) fn draw_walks(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    draws: Draws<'_>,
    threshold: &[u64],
    (drawn, kept): (&[usize], &[Vec<u64>]),
) -> Result<Vec<(usize, i32)>> {
    if drawn.is_empty() {
        return Ok(Vec::new());
    }
    let n = threshold.len();
    let me = shard.group.rank();
    let mut offset = vec![u64::MAX; n];
    for (&r, masses) in drawn.iter().zip(kept) {
        let total: u64 = masses.iter().sum();
        let mut t = scale_draw(draw(draws.seed[r], draws.purpose), total);
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
    let walked = walk_with(shard, rows, (threshold, &offset), draws.residual)?;
    let mut found: Vec<u64> = drawn
        .iter()
        .map(|&r| (walked.tokens[r] + 1) as u64)
        .collect();
    shard.group.max_u64(&mut found)?;
    Ok(drawn
        .iter()
        .zip(found)
        .map(|(&r, t)| (r, t as i32 - 1))
        .collect())
}
