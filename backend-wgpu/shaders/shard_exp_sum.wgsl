// shard_exp_sum (`docs/semantics.md` §5.17, float): one workgroup per row of logits. The row's
// maximum m is the value of its row key; the slice's sum of exp((l - m) / T) is taken in the
// reference's order, 8 interleaved partial sums (element i into sum i mod 8) added in order at the
// end: each tile of WG terms is computed by the whole workgroup into workgroup memory, then
// invocations 0-7 each add their lane of it in id order. Special rows: 0 at T == 0 or m = -inf,
// the number of +inf logits at m = +inf; under a NaN maximum (a row key no row has) NaN where
// the reference's terms are NaN.

// `struct ShardExpSumArgs` is generated from its `kernel_args!` declaration in src/ops/shard_exp_sum.rs.

@group(0) @binding(0) var<uniform> p: ShardExpSumArgs;
// logits [rows, len]
@group(0) @binding(1) var<storage, read> row_words: array<u32>;
// the per-row temperature (f32 bits)
@group(0) @binding(2) var<storage, read> temperature: array<u32>;
// [rows] u64 words
@group(0) @binding(3) var<storage, read> row_key: array<u32>;
// [rows] f32 bits
@group(0) @binding(4) var<storage, read_write> sums: array<u32>;

const EXP_LANES: u32 = 8u;

var<workgroup> terms: array<f32, WG>;
var<workgroup> lanes: array<f32, EXP_LANES>;

/// exp((l - m) / t) of a logit (f32 bits) below a finite maximum m: NaN and -inf logits add 0,
/// +inf ones +inf, T = +inf scales a finite logit to 0 (one subtraction, then one division).
fn exp_term(bits: u32, m: f32, t: f32, t_inf: bool) -> f32 {
    if is_nan_bits(bits) || bits == NEG_INF_BITS {
        return 0.0;
    }
    if t_inf {
        return 1.0;
    }
    if bits == POS_INF_BITS {
        return bitcast<f32>(POS_INF_BITS);
    }
    return exp((bitcast<f32>(bits) - m) / t);
}

// Entry points `shard_exp_sum_<dtype>` (generated, kernels.rs; groups with work only).
fn shard_exp_sum_main(g: u32, lid: u32, dt: u32) {
    begin_row(dt, p.input_off + g * p.vocab);
    let row = p.row0 + g;
    let len = p.vocab;
    let m_bits = key_value_bits(vec2<u32>(row_key[p.row_key_off + 2u * row], row_key[p.row_key_off + 2u * row + 1u]));
    var t_bits = temperature[p.temperature_off + row];
    // A device temperature: NaN or negative counts as 1.0 (-0 is 0).
    if is_nan_bits(t_bits) || ((t_bits & 0x80000000u) != 0u && t_bits != 0x80000000u) {
        t_bits = 0x3f800000u;
    }
    let t_zero = (t_bits & 0x7fffffffu) == 0u;
    let t_inf = t_bits == POS_INF_BITS;
    let m_inf = (m_bits & 0x7fffffffu) == POS_INF_BITS;
    let m_nan = is_nan_bits(m_bits);
    // Counted over the slice when the row needs them: the +inf logits (m = +inf), and under a NaN
    // maximum the logits whose term is NaN (not NaN or -inf themselves, T finite).
    var inf_here = 0u;
    var nan_here = 0u;
    if (m_bits == POS_INF_BITS || m_nan) && !t_zero {
        for (var i = lid; i < len; i += WG) {
            let bits = row_bits(i);
            inf_here = inf_here + select(0u, 1u, bits == POS_INF_BITS);
            nan_here = nan_here + select(0u, 1u, !is_nan_bits(bits) && bits != NEG_INF_BITS && !t_inf);
        }
    }
    let inf_count = wg_scan32(lid, inf_here).y;
    let nan_count = wg_scan32(lid, nan_here).y;
    if lid < EXP_LANES {
        lanes[lid] = 0.0;
    }
    if !t_zero && !m_inf && !(m_nan && nan_count != 0u) {
        // Under a NaN maximum with no NaN term, every term is 0 or (T = +inf) 1.
        let m = bitcast<f32>(m_bits);
        let t = bitcast<f32>(t_bits);
        for (var t0 = 0u; t0 < len; t0 += WG) {
            let i = t0 + lid;
            terms[lid] = select(0.0, exp_term(row_bits(min(i, len - 1u)), m, t, t_inf), i < len);
            workgroupBarrier();
            // Lane l adds the tile's elements l, l + 8, ... in order (WG is a multiple of 8, so
            // element i of the slice always goes to lane i mod 8).
            if lid < EXP_LANES {
                var s = lanes[lid];
                for (var e = lid; e < min(WG, len - t0); e += EXP_LANES) {
                    s = s + terms[e];
                }
                lanes[lid] = s;
            }
            workgroupBarrier();
        }
    }
    workgroupBarrier();
    if lid == 0u {
        var sum = 0.0;
        var bits = 0u;
        if t_zero || m_bits == NEG_INF_BITS {
            bits = 0u;
        } else if m_bits == POS_INF_BITS {
            bits = bitcast<u32>(f32(inf_count));
        } else if m_nan && nan_count != 0u {
            bits = 0x7fc00000u;
        } else {
            for (var l = 0u; l < EXP_LANES; l++) {
                sum = sum + lanes[l];
            }
            bits = bitcast<u32>(sum);
        }
        sums[p.sums_off + row] = bits;
    }
}
