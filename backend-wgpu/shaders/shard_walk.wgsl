// shard_walk (`docs/semantics.md` §5.16): one workgroup per row. The kept tokens are those whose
// rank key reaches the row's threshold; each walks with its weight as a token of the whole row
// (shard.wgsl), or (`has_residual`) with REJECTION's residual against its draft row. Each
// invocation sums its contiguous part of the slice (saturating) and counts its kept tokens; a scan
// in invocation order finds the one part whose range first exceeds the offset, and that invocation
// walks its part again in ascending id order to the token. Integer throughout.
//
// A dispatch covers the target rows of one row chunk (`row_words`) and, with a residual, the draft
// rows `draft_lo .. draft_hi` of one draft chunk (`draft_words`): a row runs in the dispatch whose
// draft chunk holds its draft row, or, when its draft row is none of the `draft_rows`, in the one
// of the first draft chunk (`draft_lo == 0`).

// `struct ShardWalkArgs` is generated from its `kernel_args!` declaration in src/ops/shard_walk.rs.

@group(0) @binding(0) var<uniform> p: ShardWalkArgs;
// bindings 1-4: the rows (shard_rows.wgsl)
@group(0) @binding(5) var<storage, read> threshold: array<u32>;
@group(0) @binding(6) var<storage, read> offset: array<u32>;
// with `has_residual`: draft rows [draft_lo, draft_hi) of [draft_rows, len], their row keys, each
// row's draft row (i32) and the masses Wp, Wq
@group(0) @binding(7) var<storage, read> draft_words: array<u32>;
@group(0) @binding(8) var<storage, read> draft_key: array<u32>;
@group(0) @binding(9) var<storage, read> draft_row: array<i32>;
@group(0) @binding(10) var<storage, read> target_mass: array<u32>;
@group(0) @binding(11) var<storage, read> draft_mass: array<u32>;
@group(0) @binding(12) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(13) var<storage, read_write> mass: array<u32>;
@group(0) @binding(14) var<storage, read_write> count: array<u32>;

/// What the row's tokens walk with: the kept weights, or the residual against a draft row.
struct Walked {
    /// 0: the kept weights; 1: the residual; 2: the residual of no draft row (every token 0).
    mode: u32,
    qw: SliceWeigh,
    /// The draft row's first element in `draft_words`.
    q_base: u32,
    target_mass: vec2<u32>,
    draft_mass: vec2<u32>,
    shift: u32,
}

var<private> g_walked: Walked;
var<private> g_weigh: SliceWeigh;
var<private> g_cut: vec2<u32>;

/// The f32 bits of element `j` of the draft row.
fn draft_bits(j: u32) -> u32 {
    let e = g_walked.q_base + j;
    return widen_bits(draft_words[word_of(e, g_dt)], e, g_dt);
}

/// The weight token `j` of the slice walks with; `.y` is 1 when it is kept.
fn walked_weight(logits: bool, j: u32) -> vec3<u32> {
    let bits = row_bits(j);
    let id = p.first + j;
    let kept = ge64(token_key(ORDER_RANK, logits, bits, id), g_cut);
    var wp = vec2<u32>(0u);
    if kept {
        wp = slice_weight(g_weigh, logits, bits, id);
    }
    var w = wp;
    if g_walked.mode == 1u {
        let wq = slice_weight(g_walked.qw, logits, draft_bits(j), id);
        w = residual_weight(wp, wq, g_walked.target_mass, g_walked.draft_mass, g_walked.shift);
    } else if g_walked.mode == 2u {
        w = vec2<u32>(0u);
    }
    return vec3<u32>(w, select(0u, 1u, kept));
}

var<workgroup> s_found: u32;

// Entry points `shard_walk_<dtype>` (generated, kernels.rs; groups with work only).
fn shard_walk_main(g: u32, lid: u32, dt: u32) {
    let row = p.row0 + g;
    // The draft row, and whether this dispatch runs the row.
    var mode = 0u;
    var d = 0u;
    if p.has_residual != 0u {
        let dr = draft_row[p.draft_row_off + row];
        if dr >= 0 && u32(dr) < p.draft_rows {
            d = u32(dr);
            mode = 1u;
            if d < p.draft_lo || d >= p.draft_hi {
                return;
            }
        } else {
            mode = 2u;
            if p.draft_lo != 0u {
                return;
            }
        }
    }
    begin_row(dt, p.input_off + g * p.vocab);
    let len = p.vocab;
    let logits = p.logits != 0u;
    g_weigh = row_weigh(row);
    g_cut = vec2<u32>(threshold[p.threshold_off + 2u * row], threshold[p.threshold_off + 2u * row + 1u]);
    let start_at = vec2<u32>(offset[p.offset_off + 2u * row], offset[p.offset_off + 2u * row + 1u]);
    g_walked.mode = mode;
    g_walked.qw = g_weigh;
    g_walked.q_base = 0u;
    g_walked.target_mass = vec2<u32>(0u);
    g_walked.draft_mass = vec2<u32>(0u);
    g_walked.shift = 0u;
    if mode == 1u {
        let q_key = vec2<u32>(draft_key[p.draft_key_off + 2u * d], draft_key[p.draft_key_off + 2u * d + 1u]);
        g_walked.qw = slice_weigh(logits, q_key, row_temperature(row), 0u);
        g_walked.q_base = p.draft_off + (d - p.draft_lo) * len;
        let wp = vec2<u32>(target_mass[p.target_mass_off + 2u * row], target_mass[p.target_mass_off + 2u * row + 1u]);
        let wq = vec2<u32>(draft_mass[p.draft_mass_off + 2u * row], draft_mass[p.draft_mass_off + 2u * row + 1u]);
        g_walked.target_mass = wp;
        g_walked.draft_mass = wq;
        g_walked.shift = residual_shift(logits, wp, wq);
    }
    let part = chunk_range(lid, len);
    var sum = vec2<u32>(0u);
    var kept = 0u;
    for (var j = part.x; j < part.y; j++) {
        let w = walked_weight(logits, j);
        sum = add64_sat(sum, w.xy);
        kept = kept + w.z;
    }
    let kept_total = wg_scan32(lid, kept).y;
    if lid == 0u {
        s_found = 0xffffffffu;
    }
    let scan = wg_scan64_sat(lid, sum);
    let before = scan.xy;
    if !lt64(start_at, before) && lt64(start_at, add64_sat(before, sum)) {
        var running = before;
        for (var j = part.x; j < part.y; j++) {
            running = add64_sat(running, walked_weight(logits, j).xy);
            if lt64(start_at, running) {
                s_found = p.first + j;
                break;
            }
        }
    }
    let found = workgroupUniformLoad(&s_found);
    if lid == 0u {
        tokens[p.tokens_off + row] = select(i32(found), -1, found == 0xffffffffu);
        mass[p.mass_off + 2u * row] = scan.z;
        mass[p.mass_off + 2u * row + 1u] = scan.w;
        count[p.count_off + 2u * row] = kept_total;
        count[p.count_off + 2u * row + 1u] = 0u;
    }
}
