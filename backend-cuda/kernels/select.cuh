// Rank-order selection without sorting a row (the CUDA mirror of backend-cpu/src/ops/select.rs).
//
// Every set the sampling ops use (top-k survivors, top-p kept set, the first C candidates, the
// logprob top-K) is a *prefix* of the row's rank order "key descending, then id ascending": all
// tokens whose key is above a threshold key, plus the first `take` tokens (by id) whose key equals
// it. A prefix reaching a target (a count, or a mass) is found by a three-pass radix selection on
// the 32-bit keys (digits of 11, 11 and 10 bits, histograms of counts and exact u64 masses in
// shared memory), then `take` follows from integer arithmetic on the one group of equal keys where
// the target is crossed. A draw is one id-order prefix scan. Nothing is sorted.
//
// A row is read by one block (`nblocks == 1`) or, for a large vocabulary and a small batch, by
// several blocks that each read a contiguous slice: their histograms meet in global memory
// (atomics into a fresh, zeroed region per pass) behind a grid barrier, so every block then makes
// the same decision from the same totals. The split kernels are launched cooperatively, which
// guarantees that the blocks of the grid are co-resident, so the barrier cannot hang.
//
// A split row's global state needs no zeroing by the host (its scratch is reused from launch to
// launch, with any content): the blocks first zero the histogram regions and the `first` slot
// themselves, then meet at a grid barrier (`split_row_begin`). The barrier itself lives in two
// words per row that only this protocol writes (`sync`, zeroed once when the host allocated
// them): an epoch, and the arrival word (tag << 32 | arrivals). Each launch's blocks read the
// epoch e at their start and count their arrivals under tag e + 1; an arrival that finds another
// tag restarts the count at 1 with its own. Block 0 stores e + 1 as the epoch once every block
// has read it (after the first barrier), so the next launch uses tag e + 2, which the arrival
// word cannot hold yet: no launch can mistake the last one's arrivals for its own, and no reset
// is needed at the end (a replayed CUDA graph, whose arguments never change, works the same).

#define SEL_BLOCK SPECULA_SELECT_BLOCK
#define SEL_ITEMS SPECULA_SELECT_ITEMS
#define SEL_CHUNK (SEL_ITEMS * SEL_BLOCK)
#define SEL_BINS 2048
#define SEL_MAX_PASSES SPECULA_SELECT_MAX_PASSES

// The share of a row one block reads, and the global state the blocks of a split row share.
struct RowPart {
    u32 begin;    // first element of this block's slice (a multiple of SEL_ITEMS)
    u32 end;      // one past its last element
    bool vec;     // the row start is aligned for 4-element vector loads
    u32 nblocks;  // blocks per row (1: no global state is used)
    u32 block;    // this block's index within the row
    u32 generation;  // grid barriers passed so far
    u32 pass;        // global histogram regions used so far
    u32 tag;         // this launch's barrier tag: the row's epoch + 1 (split rows only)
    u64* sync;       // [2]: the row's epoch and arrival words (split rows only)
    u64* first;      // packed (key, id) maximum (split rows only)
    u32* g_count;    // [SEL_MAX_PASSES][SEL_BINS]
    u64* g_mass;     // [SEL_MAX_PASSES][SEL_BINS]
    u64* x_mass;     // [nblocks] per-block exchange
    u32* x_count;    // [nblocks] per-block exchange
};

// Bytes of the global state of one split row in its scratch (the `first` slot, 8 bytes unused,
// the histogram regions, the exchange); the Rust side computes the same value
// (`launch::split_row_scratch_bytes`), and passes `stride` = this rounded up to 256.
#define SEL_SPLIT_FIXED_BYTES 16

// A whole row read by one block: no global state.
__device__ __forceinline__ RowPart row_part_single(u32 vocab, bool vec) {
    RowPart p = {};
    p.end = vocab;
    p.vec = vec;
    p.nblocks = 1;
    return p;
}

__device__ __forceinline__ RowPart row_part_split(unsigned char* scratch, u64 stride, u64* sync, u32 row,
                                                  u32 nblocks, u32 block, u32 vocab, bool vec) {
    RowPart p = row_part_single(vocab, vec);
    const u32 slice = ((vocab + nblocks - 1) / nblocks + SEL_CHUNK - 1) / SEL_CHUNK * SEL_CHUNK;
    const u64 b = (u64)block * slice;
    p.begin = b < vocab ? (u32)b : vocab;
    const u64 e = b + slice;
    p.end = e < vocab ? (u32)e : vocab;
    p.nblocks = nblocks;
    p.block = block;
    unsigned char* base = scratch + stride * row;
    p.sync = sync + 2ull * row;
    p.first = reinterpret_cast<u64*>(base);
    p.g_count = reinterpret_cast<u32*>(base + SEL_SPLIT_FIXED_BYTES);
    p.g_mass = reinterpret_cast<u64*>(base + SEL_SPLIT_FIXED_BYTES + 4ull * SEL_MAX_PASSES * SEL_BINS);
    p.x_mass = reinterpret_cast<u64*>(base + SEL_SPLIT_FIXED_BYTES + 12ull * SEL_MAX_PASSES * SEL_BINS);
    p.x_count = reinterpret_cast<u32*>(base + SEL_SPLIT_FIXED_BYTES + 12ull * SEL_MAX_PASSES * SEL_BINS +
                                       8ull * nblocks);
    return p;
}

struct SelShared {
    u32 count[SEL_BINS];
    u64 mass[SEL_BINS];
    u64 sa[SEL_BLOCK / 32];
    u32 sb[SEL_BLOCK / 32];
    u32 found;
    u32 bin;
    u32 bin_count_before;
    u64 bin_mass_before;
    i32 token;
};

// Counts one arrival in the arrival word under `tag`: the count goes on when the word holds
// this tag, and restarts at 1 when it holds another (a previous launch's).
__device__ __forceinline__ void barrier_arrive(u64* word, u32 tag) {
    u64 old = *reinterpret_cast<volatile u64*>(word);
    for (;;) {
        const u64 next = (u32)(old >> 32) == tag ? old + 1ull : (((u64)tag << 32) | 1ull);
        const u64 seen = atomicCAS(word, old, next);
        if (seen == old) return;
        old = seen;
    }
}

// Waits for every block of a split row (a plain __syncthreads for a single block).
__device__ __forceinline__ void grid_barrier(RowPart& p) {
    __syncthreads();
    if (p.nblocks <= 1) return;
    p.generation += 1;
    if (threadIdx.x == 0) {
        __threadfence();
        u64* word = p.sync + 1;
        barrier_arrive(word, p.tag);
        const u32 want = p.generation * p.nblocks;
        for (;;) {
            const u64 v = *reinterpret_cast<volatile u64*>(word);
            if ((u32)(v >> 32) == p.tag && (u32)v >= want) break;
            __nanosleep(64);
        }
        __threadfence();
    }
    __syncthreads();
}

// Starts a split row (nothing for a single block): reads the row's epoch, zeroes this block's
// share of the histogram regions (and block 0 the `first` slot), meets the other blocks, and
// advances the epoch for the next launch (see the file comment).
__device__ __forceinline__ void split_row_begin(RowPart& p) {
    if (p.nblocks <= 1) return;
    p.tag = (u32)*reinterpret_cast<volatile u64*>(p.sync) + 1u;
    const u64 words = (u64)SEL_MAX_PASSES * SEL_BINS;
    for (u64 i = (u64)p.block * SEL_BLOCK + threadIdx.x; i < words; i += (u64)p.nblocks * SEL_BLOCK) {
        p.g_count[i] = 0;
        p.g_mass[i] = 0;
    }
    if (p.block == 0 && threadIdx.x == 0) *p.first = 0;
    grid_barrier(p);
    // Every block has read the epoch (each read it before its first arrival).
    if (p.block == 0 && threadIdx.x == 0) *reinterpret_cast<volatile u64*>(p.sync) = p.tag;
}

// Keys of the sampling rows, in rank order: row_key of the row's weighing w (the bits of
// sanitize(p) for probability rows, the logit's rank key for logits rows, `docs/semantics.md` §4b); weights
// are weight_of, a function of the key that never increases as the key decreases.
struct RankKeys {
    static const bool has_mass = true;
    static __device__ __forceinline__ u32 key(const Weigh& w, float x, u32 id) { return row_key(w, x, id); }
    static __device__ __forceinline__ u64 weight(const Weigh& w, u32 key) { return weight_of(w, key); }
};

// Loads this thread's SEL_ITEMS consecutive elements of the chunk starting at `base`.
template <class E>
__device__ __forceinline__ void load_items(const typename E::raw* __restrict__ row, u32 base,
                                           const RowPart& p, float v[SEL_ITEMS]) {
    const u32 i0 = base + threadIdx.x * SEL_ITEMS;
#pragma unroll
    for (int q = 0; q < SEL_ITEMS / 4; ++q) load4<E>(row, i0 + 4 * q, p.end, p.vec, v + 4 * q);
}

// The keys (K::key) of this thread's SEL_ITEMS loaded items `v`, ids i0 .. (0 for an id at or past
// `end`), into `keys`; returns how many of them are valid and equal `pkey` (the boundary tokens).
template <class K>
__device__ __forceinline__ u32 item_keys(const Weigh& wg, const float v[SEL_ITEMS], u32 i0, u32 end, u32 pkey,
                                         u32 keys[SEL_ITEMS]) {
    u32 b = 0;
#pragma unroll
    for (int j = 0; j < SEL_ITEMS; ++j) {
        keys[j] = (i0 + j < end) ? K::key(wg, v[j], i0 + j) : 0u;
        b += (i0 + j < end && keys[j] == pkey) ? 1u : 0u;
    }
    return b;
}

// Calls f(i, x) for each element of this block's slice: per chunk of SEL_CHUNK elements, thread t
// takes SEL_ITEMS consecutive ones, in ascending order.
template <class E, class F>
__device__ __forceinline__ void for_slice_items(const typename E::raw* __restrict__ row, const RowPart& p, F f) {
    for (u32 base = p.begin; base < p.end; base += SEL_CHUNK) {
        float v[SEL_ITEMS];
        load_items<E>(row, base, p, v);
        const u32 i0 = base + threadIdx.x * SEL_ITEMS;
#pragma unroll 1
        for (int j = 0; j < SEL_ITEMS; ++j) {
            if (i0 + j >= p.end) break;
            f(i0 + j, v[j]);
        }
    }
}

// Histogram of the keys of this row (restricted to keys > lo whose masked bits equal pval) by
// the digit (key >> shift) & dmask; for a split row the block histograms are summed globally and
// every block ends with the row's histogram in shared memory.
template <class E, class K>
__device__ __noinline__ void hist_pass(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                       const Weigh& wg, i64 lo, u32 pmask, u32 pval, u32 shift, u32 dmask) {
    for (u32 i = threadIdx.x; i < SEL_BINS; i += SEL_BLOCK) {
        s.count[i] = 0;
        s.mass[i] = 0;
    }
    __syncthreads();
    for_slice_items<E>(row, p, [&](u32 i, float x) {
        const u32 key = K::key(wg, x, i);
        if ((i64)key > lo && (key & pmask) == pval) {
            const u32 bin = (key >> shift) & dmask;
            atomicAdd(&s.count[bin], 1u);
            if (K::has_mass) {
                const u64 w = K::weight(wg, key);
                if (w != 0) atomicAdd(&s.mass[bin], w);
            }
        }
    });
    __syncthreads();
    if (p.nblocks > 1) {
        u32* gc = p.g_count + (u64)p.pass * SEL_BINS;
        u64* gm = p.g_mass + (u64)p.pass * SEL_BINS;
        for (u32 i = threadIdx.x; i < SEL_BINS; i += SEL_BLOCK) {
            if (s.count[i] != 0) atomicAdd(&gc[i], s.count[i]);
            if (s.mass[i] != 0) atomicAdd(&gm[i], s.mass[i]);
        }
        grid_barrier(p);
        for (u32 i = threadIdx.x; i < SEL_BINS; i += SEL_BLOCK) {
            s.count[i] = __ldcg(&gc[i]);
            s.mass[i] = __ldcg(&gm[i]);
        }
        __syncthreads();
    }
    p.pass += 1;
}

// Totals of the histogram in shared memory (every thread gets them).
__device__ __forceinline__ void hist_totals(SelShared& s, u32& count, u64& mass) {
    u64 m = 0;
    u32 c = 0;
    for (u32 i = threadIdx.x; i < SEL_BINS; i += SEL_BLOCK) {
        m += s.mass[i];
        c += s.count[i];
    }
    u64 ex_m, tot_m;
    u32 ex_c, tot_c;
    block_scan_pair<SEL_BLOCK>(m, c, ex_m, ex_c, tot_m, tot_c, s.sa, s.sb);
    count = tot_c;
    mass = tot_m;
}

// Scans the histogram from the top bin down and finds the first bin where the running total
// (starting from `above_count`/`above_mass`) reaches `target`. Returns false when it never does.
// `count_before`/`mass_before` are the running totals just above the found bin.
__device__ __noinline__ bool hist_walk(SelShared& s, bool by_mass, u64 target, u32 above_count, u64 above_mass,
                          u32& bin, u32& count_before, u64& mass_before) {
    const u32 per = SEL_BINS / SEL_BLOCK;
    // Thread t owns bins hi, hi - 1, ..., hi - per + 1: thread order is descending bin order.
    const u32 hi = SEL_BINS - 1 - threadIdx.x * per;
    u64 m = 0;
    u32 c = 0;
    for (u32 k = 0; k < per; ++k) {
        m += s.mass[hi - k];
        c += s.count[hi - k];
    }
    u64 ex_m, tot_m;
    u32 ex_c, tot_c;
    block_scan_pair<SEL_BLOCK>(m, c, ex_m, ex_c, tot_m, tot_c, s.sa, s.sb);
    if (threadIdx.x == 0) s.found = 0;
    __syncthreads();
    u64 cm = above_mass + ex_m;
    u64 cc = (u64)above_count + ex_c;
    for (u32 k = 0; k < per; ++k) {
        const u32 b = hi - k;
        const u64 nm = cm + s.mass[b];
        const u64 nc = cc + s.count[b];
        const bool before = by_mass ? cm >= target : cc >= target;
        const bool after = by_mass ? nm >= target : nc >= target;
        if (after && !before) {
            // Unique: the running total is monotone, so exactly one bin crosses the target.
            s.found = 1;
            s.bin = b;
            s.bin_count_before = (u32)cc;
            s.bin_mass_before = cm;
        }
        cm = nm;
        cc = nc;
    }
    __syncthreads();
    const bool found = s.found != 0;
    bin = s.bin;
    count_before = s.bin_count_before;
    mass_before = s.bin_mass_before;
    __syncthreads();
    return found;
}

// A prefix of a row in rank order (see the file comment); `count` and `mass` are its totals.
struct Sel {
    u32 key;
    u32 take;  // SPECULA_U32_MAX: the whole group of `key`
    u32 count;
    u64 mass;
    bool reached;
    u64 within_mass;  // the mass of the `within` set the prefix was selected from
};

__device__ __forceinline__ Sel make_sel(u32 key, u32 take, u32 count, u64 mass, bool reached, u64 within_mass) {
    return Sel{key, take, count, mass, reached, within_mass};
}

__device__ __forceinline__ u64 ceil_div_u64(u64 a, u64 b) { return a / b + (a % b != 0 ? 1ull : 0ull); }

// The shortest prefix of `within` (itself a prefix: keys > wkey, plus the first wtake of key wkey,
// or the whole wkey group when wtake == SPECULA_U32_MAX) whose count reaches `count_target`
// (by_mass false) or whose mass reaches top_p (fixed `p_fixed`) of the mass of `within` (by_mass
// true). When the target is not reached, or a mass target equals the whole mass, `within` itself
// is returned with its totals (for a mass target the two have the same members of positive
// weight, which is all any caller uses).
template <class E, class K>
__device__ __noinline__ Sel select_prefix(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                          const Weigh& wg, u32 wkey, u32 wtake, bool by_mass, u64 count_target,
                                          u64 p_fixed) {
    const bool whole_group = wtake == SPECULA_U32_MAX;
    const i64 lo = whole_group ? (i64)wkey - 1 : (i64)wkey;
    const u64 bw = K::has_mass ? K::weight(wg, wkey) : 0;
    const u32 bcount = whole_group ? 0u : wtake;
    const u64 bmass = (u64)bcount * bw;

    hist_pass<E, K>(row, p, s, wg, lo, 0u, 0u, 21u, 0x7ffu);
    u32 hc;
    u64 hm;
    hist_totals(s, hc, hm);
    Sel whole = make_sel(wkey, wtake, hc + bcount, hm + bmass, false, hm + bmass);

    const u64 target = by_mass ? top_p_target_mass(p_fixed, whole.mass) : count_target;
    if (target == 0) return make_sel(SPECULA_U32_MAX, 0, 0, 0, true, whole.mass);
    if (by_mass && target == whole.mass) {
        whole.reached = true;
        return whole;
    }
    const bool reached_h = by_mass ? hm >= target : (u64)hc >= target;
    if (!reached_h) {
        const bool reached_w = by_mass ? whole.mass >= target : (u64)whole.count >= target;
        if (!whole_group && reached_w) {
            // Crossed inside the boundary group of `within`.
            const u64 need = target - (by_mass ? hm : (u64)hc);
            const u64 take = by_mass ? ceil_div_u64(need, bw) : need;
            return make_sel(wkey, (u32)take, hc + (u32)take, hm + take * bw, true, whole.mass);
        }
        return whole;
    }
    u32 above_c = 0;
    u64 above_m = 0;
    u32 pmask = 0, pval = 0;
    const u32 shifts[3] = {21u, 10u, 0u};
    const u32 dmasks[3] = {0x7ffu, 0x7ffu, 0x3ffu};
    for (int pass = 0; pass < 3; ++pass) {
        if (pass > 0) hist_pass<E, K>(row, p, s, wg, lo, pmask, pval, shifts[pass], dmasks[pass]);
        u32 bin, cb;
        u64 mb;
        hist_walk(s, by_mass, target, above_c, above_m, bin, cb, mb);
        above_c = cb;
        above_m = mb;
        pval |= bin << shifts[pass];
        pmask |= dmasks[pass] << shifts[pass];
    }
    const u64 w = K::has_mass ? K::weight(wg, pval) : 0;
    const u64 take = by_mass ? ceil_div_u64(target - above_m, w) : target - above_c;
    return make_sel(pval, (u32)take, above_c + (u32)take, above_m + take * w, true, whole.mass);
}

// The total weight of a row (every block of a split row gets the row's total).
template <class E>
__device__ __noinline__ u64 row_total_weight(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                             const Weigh& wg) {
    u64 m = 0;
    for_slice_items<E>(row, p, [&](u32 i, float x) { m += weight_of(wg, row_key(wg, x, i)); });
    u64 total = block_sum_u64<SEL_BLOCK>(m, s.sa);
    if (p.nblocks > 1) {
        u64* slot = p.g_mass + (u64)p.pass * SEL_BINS;
        if (threadIdx.x == 0 && total != 0) atomicAdd(slot, total);
        grid_barrier(p);
        total = __ldcg(slot);
        __syncthreads();
    }
    p.pass += 1;
    return total;
}

// The largest pack_key_id(key(x, i), i) over the row, every block of a split row (through the
// row's `first` slot): the largest key, lowest id; 0 for an empty row.
template <class E, class F>
__device__ __forceinline__ u64 row_max_packed(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                              F key) {
    u64 best = 0;
    for_slice_items<E>(row, p, [&](u32 i, float x) {
        const u64 packed = pack_key_id(key(x, i), i);
        best = packed > best ? packed : best;
    });
    best = block_max_u64<SEL_BLOCK>(best, s.sa);
    if (p.nblocks > 1) {
        if (threadIdx.x == 0) atomicMax(p.first, best);
        grid_barrier(p);
        best = __ldcg(p.first);
        __syncthreads();
    }
    return best;
}

// The first token of the row in rank order: the largest key, lowest id (0 for an all-zero row).
template <class E, class K>
__device__ __noinline__ u32 first_in_rank(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                          const Weigh& wg) {
    const u64 best = row_max_packed<E>(row, p, s, [&](float x, u32 i) { return K::key(wg, x, i); });
    // An empty slice or row keeps 0, which is pack_key_id(0, U32_MAX): map it to id 0.
    return best == 0 ? 0u : packed_id(best);
}

// How the tokens of a row weigh (`docs/semantics.md` §4b steps 1-3): by key for probability rows (`logits`
// false); a logits row from its maximum (the largest logit_rank_key, lowest id, over every block
// of a split row) and its temperature t.
template <class E>
__device__ __noinline__ Weigh row_weigh(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                       bool logits, float t) {
    if (!logits) return weigh_by_key();
    // The same maximum as first_in_rank's on this row (the first maximum keeps its key), so both
    // may share the `first` slot of a split row.
    const u64 best = row_max_packed<E>(row, p, s, [](float x, u32) { return logit_rank_key(x); });
    // Keys are never 0, so best is 0 only for an empty row (every row has V >= 1 tokens).
    if (best == 0) return logits_weigh(SPECULA_NEG_INF_LOGIT_KEY, 0, t);
    return logits_weigh((u32)(best >> 32), packed_id(best), t);
}

// The member of prefix (pkey, ptake) whose cumulative weight, in ascending id order, first
// exceeds t (t < the prefix mass). Returns the id, or -1 when this block's slice does not hold it
// (for a split row exactly one block returns an id).
template <class E>
__device__ __noinline__ i32 draw_in_prefix(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                           const Weigh& wg, u32 pkey, u32 ptake, u64 t) {
    const u64 wb = weight_of(wg, pkey);
    // Weight of members above the boundary key before this block's slice, and boundary tokens
    // (key == pkey) before it.
    u64 carry_m = 0;
    u64 carry_b = 0;
    if (p.nblocks > 1) {
        u64 m = 0;
        u32 b = 0;
        for_slice_items<E>(row, p, [&](u32 i, float x) {
            const u32 key = row_key(wg, x, i);
            if (key > pkey) m += weight_of(wg, key);
            b += key == pkey ? 1u : 0u;
        });
        u64 ex_m, tot_m;
        u32 ex_b, tot_b;
        block_scan_pair<SEL_BLOCK>(m, b, ex_m, ex_b, tot_m, tot_b, s.sa, s.sb);
        if (threadIdx.x == 0) {
            p.x_mass[p.block] = tot_m;
            p.x_count[p.block] = tot_b;
        }
        grid_barrier(p);
        for (u32 k = 0; k < p.block; ++k) {
            carry_m += __ldcg(&p.x_mass[k]);
            carry_b += __ldcg(&p.x_count[k]);
        }
    }
    if (threadIdx.x == 0) s.token = -1;
    __syncthreads();
    i32 result = -1;
    for (u32 base = p.begin; base < p.end; base += SEL_CHUNK) {
        float v[SEL_ITEMS];
        load_items<E>(row, base, p, v);
        const u32 i0 = base + threadIdx.x * SEL_ITEMS;
        // Per item: its weight above the boundary key (0 otherwise), and whether it is a
        // boundary token (bit j of `boundary`).
        u64 above[SEL_ITEMS];
        u32 boundary = 0;
        u64 m = 0;
#pragma unroll
        for (int j = 0; j < SEL_ITEMS; ++j) {
            const bool valid = i0 + j < p.end;
            const u32 key = valid ? row_key(wg, v[j], i0 + j) : 0u;
            above[j] = (valid && key > pkey) ? weight_of(wg, key) : 0ull;
            boundary |= (valid && key == pkey) ? (1u << j) : 0u;
            m += above[j];
        }
        const u32 b = __popc(boundary);
        u64 ex_m, tot_m;
        u32 ex_b, tot_b;
        block_scan_pair<SEL_BLOCK>(m, b, ex_m, ex_b, tot_m, tot_b, s.sa, s.sb);
        u64 cm = carry_m + ex_m;
        u64 cb = carry_b + ex_b;
#pragma unroll
        for (int j = 0; j < SEL_ITEMS; ++j) {
            const bool is_boundary = (boundary >> j) & 1u;
            const u64 w = is_boundary ? (cb < ptake ? wb : 0ull) : above[j];
            const u64 before = cm + (cb < ptake ? cb : (u64)ptake) * wb;
            if (w != 0 && before <= t && t - before < w) s.token = (i32)(i0 + j);
            cm += above[j];
            cb += is_boundary ? 1u : 0u;
        }
        __syncthreads();
        result = s.token;
        __syncthreads();
        if (result >= 0) break;
        carry_m += tot_m;
        carry_b += tot_b;
    }
    return result;
}

// The kept set of top_k_top_p_sample for one row (`docs/semantics.md` §5.6 steps 1-2), or, when the
// survivors weigh nothing, `degenerate` with the first token in rank order.
struct Kept {
    Sel prefix;
    bool degenerate;
    u32 first;
};

template <class E>
__device__ __noinline__ Kept kept_set(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                      const Weigh& wg, u32 vocab, i32 top_k, u64 p_fixed) {
    Kept k;
    k.degenerate = false;
    k.first = 0;
    Sel survivors;
    const bool full_top_p = p_fixed >= (1ull << SPECULA_TOP_P_BITS);
    if (top_k > 0 && (u32)top_k < vocab) {
        survivors = select_prefix<E, RankKeys>(row, p, s, wg, 0u, SPECULA_U32_MAX, false, (u64)top_k, 0);
    } else if (full_top_p) {
        const u64 total = row_total_weight<E>(row, p, s, wg);
        survivors = make_sel(0, SPECULA_U32_MAX, vocab, total, true, total);
    } else {
        // No top-k: top-p directly over the whole row (its first pass also gives the total).
        const Sel kept = select_prefix<E, RankKeys>(row, p, s, wg, 0u, SPECULA_U32_MAX, true, 0, p_fixed);
        if (kept.mass == 0) {
            k.degenerate = true;
            k.first = first_in_rank<E, RankKeys>(row, p, s, wg);
        }
        k.prefix = kept;
        return k;
    }
    if (survivors.mass == 0) {
        k.degenerate = true;
        k.first = first_in_rank<E, RankKeys>(row, p, s, wg);
        k.prefix = survivors;
        return k;
    }
    if (full_top_p) {
        k.prefix = survivors;
        return k;
    }
    k.prefix = select_prefix<E, RankKeys>(row, p, s, wg, survivors.key, survivors.take, true, 0, p_fixed);
    return k;
}

// Appends the members of prefix (pkey, ptake) to out_keys/out_ids (unordered; at most `cap` are
// stored, `*out_n` counts them all). Single-block rows only.
template <class E, class K>
__device__ __noinline__ void gather_prefix(const typename E::raw* __restrict__ row, RowPart& p, SelShared& s,
                                           const Weigh& wg, u32 pkey, u32 ptake, u32* out_keys, u32* out_ids,
                                           u32* out_n, u32 cap) {
    u64 carry_b = 0;
    for (u32 base = p.begin; base < p.end; base += SEL_CHUNK) {
        float v[SEL_ITEMS];
        load_items<E>(row, base, p, v);
        const u32 i0 = base + threadIdx.x * SEL_ITEMS;
        u32 keys[SEL_ITEMS];
        const u32 b = item_keys<K>(wg, v, i0, p.end, pkey, keys);
        u64 ex_m, tot_m;
        u32 ex_b, tot_b;
        block_scan_pair<SEL_BLOCK>(0ull, b, ex_m, ex_b, tot_m, tot_b, s.sa, s.sb);
        u64 cb = carry_b + ex_b;
#pragma unroll
        for (int j = 0; j < SEL_ITEMS; ++j) {
            if (i0 + j >= p.end) break;
            bool member = keys[j] > pkey;
            if (keys[j] == pkey) {
                member = cb < ptake;
                cb += 1;
            }
            if (member) {
                const u32 slot = atomicAdd(out_n, 1u);
                if (slot < cap) {
                    out_keys[slot] = keys[j];
                    out_ids[slot] = i0 + j;
                }
            }
        }
        carry_b += tot_b;
    }
    __syncthreads();
}

// Orders up to `n` gathered (key, id) entries in rank order (key descending, id ascending) by
// counting, for each entry, the entries ranked before it. n <= SEL_BLOCK.
__device__ __forceinline__ void rank_order_small(const u32* keys, const u32* ids, u32 n, u32* sorted_keys,
                                                 u32* sorted_ids) {
    const u32 i = threadIdx.x;
    if (i < n) {
        const u32 ki = keys[i], ii = ids[i];
        u32 rank = 0;
        for (u32 j = 0; j < n; ++j) {
            const u32 kj = keys[j];
            rank += (kj > ki || (kj == ki && ids[j] < ii)) ? 1u : 0u;
        }
        sorted_keys[rank] = ki;
        sorted_ids[rank] = ii;
    }
    __syncthreads();
}
