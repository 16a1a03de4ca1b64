//! The KV cache of one request, cut back to any position in O(1).
//!
//! `candle-transformers`' `quantized_llama::ModelWeights` keeps one cache per model in private
//! fields that only grow (or clear), which a speculative runner cannot use: a step feeds the last
//! token and the drafts, and when a draft is rejected its keys and values must leave the cache
//! before the next step writes its position again. Here each request owns a [`KvCache`], and
//! [`truncate`](KvCache::truncate) to `SlotPlan::start_position` drops the rejected positions.

/// Keys and values of one request: per layer, `[len, n_kv_head, head_dim]` f32 rows (after
/// RoPE for the keys), in position order.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    len: usize,
    width: usize,
}

impl KvCache {
    /// An empty cache for `n_layer` layers of `width = n_kv_head · head_dim` floats per position.
    pub fn new(n_layer: usize, width: usize) -> Self {
        KvCache {
            layers: vec![(Vec::new(), Vec::new()); n_layer],
            len: 0,
            width,
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

    /// Drops every position from `len` on (a no-op when the cache is shorter). The memory is
    /// kept and reused by the next positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes held by the cache's buffers (their capacity).
    pub fn bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|(k, v)| k.capacity() + v.capacity())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// Writes the keys and values of `n` new positions of `layer` (`[n, width]` each) after the
    /// live ones and returns every live key and value of the layer with them. The new positions
    /// count once every layer has written them: call [`advance`](KvCache::advance) after the
    /// last layer.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> (&[f32], &[f32]) {
        let live = self.len * self.width;
        let (k, v) = &mut self.layers[layer];
        k.truncate(live);
        v.truncate(live);
        k.extend_from_slice(keys);
        v.extend_from_slice(values);
        (k, v)
    }

    /// Counts `n` positions written by every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn positions(range: std::ops::Range<usize>) -> Vec<f32> {
        range.map(|p| p as f32).collect()
    }

    #[test]
    fn truncate_rolls_back_to_a_position_and_the_next_step_overwrites_it() {
        let mut cache = KvCache::new(2, 1);
        for layer in 0..2 {
            cache.append(layer, &positions(0..40), &positions(0..40));
        }
        cache.advance(40);
        // A step of 5 (last token + 4 drafts), of which 2 are kept.
        for layer in 0..2 {
            cache.append(layer, &positions(40..45), &positions(40..45));
        }
        cache.advance(5);
        cache.truncate(42);
        assert_eq!(cache.len(), 42);
        let (k, v) = cache.append(1, &positions(142..172), &positions(142..172));
        let expected: Vec<f32> = (0..42).chain(142..172).map(|p| p as f32).collect();
        assert_eq!((k, v), (&expected[..], &expected[..]));
        cache.truncate(0);
        assert!(cache.is_empty());
    }
}
