//! Sharded `argmax` (`docs/semantics.md` §5.4, §4d): the MAX of the slices' keys in argmax order.

use specula_backend_api::ops::Scores;
use specula_backend_api::shard::{KeyOrder, key_id};

use crate::error::Result;
use crate::rows::{Shard, SliceRows};

/// The argmax of each whole row of which this rank holds `scores` (`rows` rows): the same ids on
/// every rank, those of the unsharded op.
pub fn argmax(shard: &Shard<'_>, scores: Scores<'_>, rows: usize) -> Result<Vec<i32>> {
    let keys = shard.row_keys(&SliceRows::new(scores), rows, KeyOrder::Argmax)?;
    Ok(keys.into_iter().map(|k| key_id(k) as i32).collect())
}
