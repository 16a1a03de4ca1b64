//! What a sharded sampling call takes: the rank's rows on its device and the rows' replicated
//! parameters on the host.

use specula_backend_api::ops::{Scores, ShardRows, ShardShape};
use specula_backend_api::shard::{KeyOrder, NO_KEY, SliceWeigher, key_value};
use specula_backend_api::{Buffer, Device, DeviceExt};

use crate::collective::Group;
use crate::error::{Result, ShardError};
use crate::partition::Partition;
use crate::sample::first_token;

/// One rank's view of a sharded call: its device, the group, the agreed partition.
#[derive(Clone, Copy, Debug)]
pub struct Shard<'a> {
    /// The rank's device.
    pub device: &'a dyn Device,
    /// The group of ranks.
    pub group: &'a Group,
    /// The partition every rank agreed on.
    pub partition: &'a Partition,
}

/// The token of a row whose survivors weigh nothing (`docs/semantics.md` §4c: the sampling ops'
/// `fallback` input).
#[derive(Clone, Copy, Debug)]
pub enum Fallback<'a> {
    /// `[rows]` i32 on the rank's device: the fallbacks of the rank's `process_logits` over its
    /// slice (its first unmasked token in rank order, a global id, or -1). The row's fallback is
    /// the first of them in rank order (a MAX of their keys): the first unmasked token of the
    /// whole row, -1 when every token is masked.
    Slice(&'a Buffer),
    /// `[rows]` the whole row's fallback, the same on every rank (as the unsharded ops take it).
    Row(&'a [i32]),
}

/// A rank's rows on its device: `[rows, slice.len]` scores of its slice.
#[derive(Clone, Copy, Debug)]
pub struct SliceRows<'a> {
    /// Probabilities, or logits with their per-row temperatures (on the device).
    pub scores: Scores<'a>,
    /// Optional `[rows]` f32 per-row min_p on the device (the same values as
    /// [`HostRows::min_p`]): a slice's `process_logits` does not apply it (§4d).
    pub min_p: Option<&'a Buffer>,
    /// The token of a row whose survivors weigh nothing; `None`: its first token in rank order.
    pub fallback: Option<Fallback<'a>>,
}

impl<'a> SliceRows<'a> {
    /// Rows of `scores` without min_p or fallbacks.
    pub fn new(scores: Scores<'a>) -> Self {
        SliceRows {
            scores,
            min_p: None,
            fallback: None,
        }
    }
}

/// The whole rows' fallbacks (`docs/semantics.md` §4c, §4d) from the ranks' `process_logits`
/// over their slices: `slice_fallback` is this rank's `[rows]` fallbacks, `scores` its processed
/// rows; the row's fallback is the first of the ranks' in rank order (one MAX of their keys),
/// -1 when every token of the row is masked. The same values on every rank.
pub fn row_fallbacks(
    shard: &Shard<'_>,
    scores: Scores<'_>,
    slice_fallback: &Buffer,
) -> Result<Vec<i32>> {
    let rows = SliceRows {
        scores,
        min_p: None,
        fallback: Some(Fallback::Slice(slice_fallback)),
    };
    let n = slice_fallback.len();
    let row_keys = vec![NO_KEY; n];
    shard.zero_tokens(&rows, &row_keys)
}

/// The rows' replicated parameters, on the host (every rank passes the same values; the device
/// copies, where the ops read them, hold the same).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostRows<'a> {
    /// Per-row `top_k`.
    pub top_k: &'a [i32],
    /// Per-row `top_p`.
    pub top_p: &'a [f32],
    /// Per-row seeds.
    pub seed: &'a [u64],
    /// Per-row temperatures of logits rows (`None`: probabilities).
    pub temperature: Option<&'a [f32]>,
    /// Per-row min_p (`None`: off).
    pub min_p: Option<&'a [f32]>,
}

impl HostRows<'_> {
    /// The number of rows (of `top_k`).
    pub fn rows(&self) -> usize {
        self.top_k.len()
    }

    /// Checks that every per-row slice has `rows` entries.
    pub(crate) fn validate(&self, rows: usize) -> Result<()> {
        let lens = [
            ("top_k", Some(self.top_k.len())),
            ("top_p", Some(self.top_p.len())),
            ("seed", Some(self.seed.len())),
            ("temperature", self.temperature.map(<[f32]>::len)),
            ("min_p", self.min_p.map(<[f32]>::len)),
        ];
        for (name, len) in lens {
            if len.is_some_and(|len| len != rows) {
                return Err(ShardError::InvalidArgument {
                    what: format!("host {name}: {len:?} entries for {rows} rows"),
                });
            }
        }
        Ok(())
    }

    /// The weigher of row `r` under `row_key` (the host's copy of the device weights).
    pub(crate) fn weigher(&self, r: usize, row_key: u64) -> SliceWeigher {
        let t = self.temperature.map(|t| t[r]);
        SliceWeigher::new(row_key, t, self.min_p.map(|m| m[r]))
    }

    /// Whether row `r` is a logits row at `T == 0` (its weight is all on its first token)
    /// whose maximum is finite or −inf.
    pub(crate) fn argmax_only(&self, r: usize, row_key: u64) -> bool {
        let t = self.temperature.map(|t| t[r]);
        let t = t.map(specula_backend_api::logit_weights::effective_temperature);
        t == Some(0.0) && (row_key == NO_KEY || key_value(row_key) != f32::INFINITY)
    }
}

impl Shard<'_> {
    /// The shape of `rows` rows of this rank's slice.
    pub(crate) fn shape(&self, rows: usize) -> ShardShape {
        ShardShape {
            rows,
            slice: self.partition.mine(),
        }
    }

    /// The row keys of the whole rows (§4d): each rank's `shard_key`, then a MAX.
    pub(crate) fn row_keys(
        &self,
        rows: &SliceRows<'_>,
        n: usize,
        order: KeyOrder,
    ) -> Result<Vec<u64>> {
        self.keys_of(rows.scores, n, None, order)
    }

    /// The largest key in `order` of each whole row (with `ids`, of token `ids[r]`): each
    /// rank's `shard_key`, then a MAX.
    fn keys_of(
        &self,
        scores: Scores<'_>,
        n: usize,
        ids: Option<&Buffer>,
        order: KeyOrder,
    ) -> Result<Vec<u64>> {
        use specula_backend_api::ops::{ShardKeyInputs, ShardKeyParams};
        let mut keys = self.device.alloc::<u64>(n)?;
        let inputs = ShardKeyInputs::new(scores).with_ids(ids);
        let params = ShardKeyParams {
            shape: self.shape(n),
            order,
        };
        self.device.shard_key(&inputs, &mut keys, &params)?;
        let mut keys: Vec<u64> = self.device.download(&keys)?;
        self.group.max_u64(&mut keys)?;
        Ok(keys)
    }

    /// The token of each row whose survivors weigh nothing: its fallback (§4c, §4d), or its
    /// first token in rank order (from `row_keys`).
    pub(crate) fn zero_tokens(&self, rows: &SliceRows<'_>, row_keys: &[u64]) -> Result<Vec<i32>> {
        let n = row_keys.len();
        Ok(match rows.fallback {
            None => row_keys.iter().map(|&k| first_token(k)).collect(),
            Some(Fallback::Row(tokens)) => {
                if tokens.len() != n {
                    return Err(ShardError::InvalidArgument {
                        what: format!("fallback: {} entries for {n} rows", tokens.len()),
                    });
                }
                tokens.to_vec()
            }
            Some(Fallback::Slice(ids)) => self
                .keys_of(rows.scores, n, Some(ids), KeyOrder::Rank)?
                .into_iter()
                .map(first_token)
                .collect(),
        })
    }

    /// The keys in `order` of given tokens: `pairs[i] = (row, id)` of `rows` rows of `scores`,
    /// each the MAX over the ranks of the key of token `id` in row `row` ([`NO_KEY`] for an id
    /// outside the vocabulary). A row named more than once is asked again in another round.
    pub(crate) fn token_keys(
        &self,
        scores: specula_backend_api::ops::Scores<'_>,
        rows: usize,
        pairs: &[(usize, i32)],
        order: KeyOrder,
    ) -> Result<Vec<u64>> {
        use specula_backend_api::ops::{ShardKeyInputs, ShardKeyParams};
        let mut keys = vec![NO_KEY; pairs.len()];
        let mut out = self.device.alloc::<u64>(rows)?;
        for members in pair_rounds(pairs, rows) {
            let mut ids = vec![-1i32; rows];
            for &i in &members {
                ids[pairs[i].0] = pairs[i].1;
            }
            let ids = self.device.upload(&ids)?;
            let params = ShardKeyParams {
                shape: self.shape(rows),
                order,
            };
            let inputs = ShardKeyInputs::new(scores).with_ids(Some(&ids));
            self.device.shard_key(&inputs, &mut out, &params)?;
            let local: Vec<u64> = self.device.download(&out)?;
            let mut found: Vec<u64> = members.iter().map(|&i| local[pairs[i].0]).collect();
            self.group.max_u64(&mut found)?;
            for (&i, key) in members.iter().zip(found) {
                keys[i] = key;
            }
        }
        Ok(keys)
    }

    /// The device rows weighed under `row_key` (uploaded).
    pub(crate) fn weighed<'b>(rows: &SliceRows<'b>, row_key: &'b Buffer) -> ShardRows<'b> {
        ShardRows::new(rows.scores, row_key).with_min_p(rows.min_p)
    }
}

/// The rounds in which `pairs[i] = (row, id)` of `rows` rows are asked: each round the indices of
/// `pairs` that name a row at most once, in order, the `n`-th pair naming a row in round `n`.
pub(crate) fn pair_rounds(pairs: &[(usize, i32)], rows: usize) -> Vec<Vec<usize>> {
    let mut asked = vec![0usize; rows];
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (i, &(r, _)) in pairs.iter().enumerate() {
        let k = asked[r];
        asked[r] += 1;
        if k == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[k].push(i);
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::pair_rounds;

    #[test]
    fn a_row_named_again_waits_for_the_next_round() {
        let pairs = [(0, 5), (2, 1), (0, 7), (1, 3), (0, 9), (2, 2)];
        assert_eq!(
            pair_rounds(&pairs, 3),
            vec![vec![0, 1, 3], vec![2, 5], vec![4]]
        );
        assert!(pair_rounds(&[], 4).is_empty());
    }
}
