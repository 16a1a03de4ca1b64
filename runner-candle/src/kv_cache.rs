//! The KV cache of one request, cut back to any position in O(1).
//!
//! `candle-transformers`' `quantized_llama::ModelWeights` keeps one cache per model in private
//! fields that only grow (or clear), which a speculative runner cannot use: a step feeds the last
//! token and the drafts, and when a draft is rejected its keys and values must leave the cache
//! before the next step writes its position again. Here each request owns a [`KvCache`], and
//! [`truncate`](KvCache::truncate) to `SlotPlan::start_position` drops the rejected positions.

use candle_core::{DType, Result, Tensor};

/// Keys and values of one request: per layer, `[1, n_kv_head, capacity, head_dim]` tensors whose
/// first [`len`](KvCache::len) positions are live. Capacity grows by doubling.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    capacity: usize,
}

/// Smallest capacity allocated, in positions.
const MIN_CAPACITY: usize = 64;

impl KvCache {
    /// An empty cache for a model of `n_layer` layers (buffers are allocated on first use).
    pub fn new(n_layer: usize) -> Self {
        KvCache {
            layers: vec![None; n_layer],
            len: 0,
            capacity: 0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the cache holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every position from `len` on (a no-op when the cache is shorter). The buffers are
    /// kept and overwritten by the next positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Writes `k`, `v` (`[1, n_kv_head, n, head_dim]`, contiguous) of `layer` at positions
    /// `len .. len + n` and returns the keys and values of positions `0 .. len + n`, contiguous.
    /// The new positions count once every layer has written them: call
    /// [`advance`](KvCache::advance) after the last layer.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let n = k.dim(2)?;
        let end = self.len + n;
        if end > self.capacity {
            self.grow(end)?;
        }
        let (k_buf, v_buf) = match self.layers.get_mut(layer) {
            Some(Some(buffers)) => buffers,
            Some(slot @ None) => slot.insert((
                zeros_like_cache(k, self.capacity)?,
                zeros_like_cache(v, self.capacity)?,
            )),
            None => candle_core::bail!("layer {layer} outside a cache of {}", self.layers.len()),
        };
        k_buf.slice_set(k, 2, self.len)?;
        v_buf.slice_set(v, 2, self.len)?;
        Ok((
            k_buf.narrow(2, 0, end)?.contiguous()?,
            v_buf.narrow(2, 0, end)?.contiguous()?,
        ))
    }

    /// Counts `n` positions written by every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Reallocates every layer's buffers for at least `needed` positions, keeping the live ones.
    fn grow(&mut self, needed: usize) -> Result<()> {
        let capacity = needed.max(2 * self.capacity).max(MIN_CAPACITY);
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = regrow(k, self.len, capacity)?;
            *v = regrow(v, self.len, capacity)?;
        }
        self.capacity = capacity;
        Ok(())
    }
}

/// A zero buffer shaped like `t` with `capacity` positions in dimension 2.
fn zeros_like_cache(t: &Tensor, capacity: usize) -> Result<Tensor> {
    let (b, heads, _, head_dim) = t.dims4()?;
    Tensor::zeros((b, heads, capacity, head_dim), t.dtype(), t.device())
}

/// `buffer`'s first `live` positions in a new buffer of `capacity` positions.
fn regrow(buffer: &Tensor, live: usize, capacity: usize) -> Result<Tensor> {
    let grown = zeros_like_cache(buffer, capacity)?;
    if live > 0 {
        grown.slice_set(&buffer.narrow(2, 0, live)?.contiguous()?, 2, 0)?;
    }
    Ok(grown)
}

/// A cache's memory for a given length, for reports: `2 · n_layer · n_kv_head · head_dim` f32 per
/// position.
pub fn bytes_per_position(n_layer: usize, n_kv_head: usize, head_dim: usize) -> usize {
    2 * n_layer * n_kv_head * head_dim * DType::F32.size_in_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn positions(start: usize, n: usize) -> Result<Tensor> {
        let values: Vec<f32> = (start..start + n).map(|p| p as f32).collect();
        Tensor::from_vec(values, (1, 1, n, 1), &Device::Cpu)
    }

    #[test]
    fn truncate_rolls_back_and_growth_keeps_live_positions() -> Result<()> {
        let mut cache = KvCache::new(1);
        let (k, _) = cache.append(0, &positions(0, 40)?, &positions(0, 40)?)?;
        cache.advance(40);
        assert_eq!(k.dim(2)?, 40);
        // A step of 5 (last token + 4 drafts), of which 2 are kept.
        let step = positions(40, 5)?;
        cache.append(0, &step, &step)?;
        cache.advance(5);
        cache.truncate(42);
        assert_eq!(cache.len(), 42);
        // The next step rewrites position 42 on, and grows past the first capacity.
        let next = positions(142, 30)?;
        let (k, v) = cache.append(0, &next, &next)?;
        cache.advance(30);
        let k: Vec<f32> = k.flatten_all()?.to_vec1()?;
        let expected: Vec<f32> = (0..42).chain(142..172).map(|p| p as f32).collect();
        assert_eq!(k, expected);
        assert_eq!(v.flatten_all()?.to_vec1::<f32>()?, expected);
        assert_eq!(cache.len(), 72);
        cache.truncate(0);
        assert!(cache.is_empty());
        Ok(())
    }
}
