// shard_exp_sum (`docs/semantics.md` §5.17, float): one block per row of logits. The row's maximum
// m is the value of its row key; the slice's sum of exp((l - m) / T) is taken in the reference's
// order, 8 interleaved partial sums (element i into sum i mod 8) added in order at the end: each
// tile of SHARD_BLOCK terms is computed by the whole block into shared memory, then threads 0-7 each
// add their lane of it in id order. Special rows: 0 at T == 0 or m = -inf, the number of +inf
// logits at m = +inf.

#define SHARD_EXP_LANES 8

// exp((l - m) / t) of a logit below a maximum m that is not infinite: NaN and -inf logits add 0,
// T = +inf scales a finite logit to 0 (one IEEE subtraction, then one division).
__device__ __forceinline__ float shard_exp_term(float l, float m, float t) {
    if (isnan(l) || l == -SPECULA_INF) return 0.0f;
    if (t == SPECULA_INF) return 1.0f;
    return expf(__fsub_rn(l, m) / t);
}

extern "C" __global__ void __launch_bounds__(SHARD_BLOCK)
    SPECULA_ENTRY(shard_exp_sum)(const ShardExpSumArgs a) {
    __shared__ float terms[SHARD_BLOCK];
    __shared__ float lanes[SHARD_EXP_LANES];
    __shared__ u64 scratch[SHARD_BLOCK / 32];
    const u32 r = blockIdx.x;
    if (r >= a.rows) return;
    const SPECULA_T::raw* row = a.logits + (u64)r * a.len;
    const float m = shard_key_value(a.row_key[r]);
    const float t = effective_temperature(a.temperature[r]);
    const bool special = t == 0.0f || isinf(m);
    u64 inf_here = 0;
    if (special) {
        for (u32 i = threadIdx.x; i < a.len; i += SHARD_BLOCK) inf_here += SPECULA_T::widen(row[i]) == SPECULA_INF ? 1u : 0u;
    }
    const u64 inf_count = block_sum_u64<SHARD_BLOCK>(inf_here, scratch);
    if (threadIdx.x < SHARD_EXP_LANES) lanes[threadIdx.x] = 0.0f;
    for (u32 t0 = 0; t0 < (special ? 0u : a.len); t0 += SHARD_BLOCK) {
        const u32 i = t0 + threadIdx.x;
        terms[threadIdx.x] = i < a.len ? shard_exp_term(SPECULA_T::widen(row[i]), m, t) : 0.0f;
        __syncthreads();
        // Lane l adds the tile's elements l, l + 8, ... in order (SHARD_BLOCK is a multiple of 8, so
        // element i of the slice always goes to lane i mod 8).
        if (threadIdx.x < SHARD_EXP_LANES) {
            const u32 n = a.len - t0 < SHARD_BLOCK ? a.len - t0 : SHARD_BLOCK;
            float s = lanes[threadIdx.x];
            for (u32 e = threadIdx.x; e < n; e += SHARD_EXP_LANES) s = __fadd_rn(s, terms[e]);
            lanes[threadIdx.x] = s;
        }
        __syncthreads();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        if (t == 0.0f || m == -SPECULA_INF) {
            sum = 0.0f;
        } else if (m == SPECULA_INF) {
            sum = (float)inf_count;
        } else {
            for (int l = 0; l < SHARD_EXP_LANES; ++l) sum = __fadd_rn(sum, lanes[l]);
        }
        a.sums[r] = sum;
    }
}
