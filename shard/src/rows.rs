//! What a sharded sampling call takes: the rank's rows on its device and the rows' replicated
//! parameters on the host.

use specula_backend_api::ops::{Scores, ShardRows, ShardShape};
use specula_backend_api::shard::{KeyOrder, NO_KEY, SliceWeigher, key_value};
use specula_backend_api::{Buffer, Device, DeviceExt};

use crate::collective::Group;
use crate::error::{Result, ShardError};
use crate::partition::Partition;

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

/// A rank's rows on its device: `[rows, slice.len]` scores of its slice.
#[derive(Clone, Copy, Debug)]
pub struct SliceRows<'a> {
    /// Probabilities, or logits with their per-row temperatures (on the device).
    pub scores: Scores<'a>,
    /// Optional `[rows]` f32 per-row min_p on the device (the same values as
    /// [`HostRows::min_p`]).
    pub min_p: Option<&'a Buffer>,
    /// Optional `[rows]` i32 fallbacks of the rank's `process_logits` over its slice: the row's
    /// first unmasked token of the slice (-1: none), which makes the row key that of the first
    /// unmasked token of the whole row (`docs/semantics.md` §4d).
    pub fallback: Option<&'a Buffer>,
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

    /// The row keys of the whole rows (§4d): each rank's `shard_key` (of the fallback token when
    /// given), then a MAX.
    pub(crate) fn row_keys(
        &self,
        rows: &SliceRows<'_>,
        n: usize,
        order: KeyOrder,
    ) -> Result<Vec<u64>> {
        use specula_backend_api::ops::{ShardKeyInputs, ShardKeyParams};
        let mut keys = self.device.alloc::<u64>(n)?;
        let inputs = ShardKeyInputs::new(rows.scores).with_ids(rows.fallback);
        let params = ShardKeyParams {
            shape: self.shape(n),
            order,
        };
        self.device.shard_key(&inputs, &mut keys, &params)?;
        let mut keys: Vec<u64> = self.device.download(&keys)?;
        self.group.max_u64(&mut keys)?;
        Ok(keys)
    }

    /// The device rows weighed under `row_key` (uploaded).
    pub(crate) fn weighed<'b>(rows: &SliceRows<'b>, row_key: &'b Buffer) -> ShardRows<'b> {
        ShardRows::new(rows.scores, row_key).with_min_p(rows.min_p)
    }
}
