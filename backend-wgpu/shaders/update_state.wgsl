// update_state (`docs/semantics.md` §5.9): one invocation per slot. Stop flags are bytes: they are read and
// set through atomics on the u32 word that holds them (a running slot's flag byte is 0, so setting
// it is an atomic OR of 1), which leaves the neighbouring bytes untouched.

// `struct UpdateStateArgs` is generated from its `kernel_args!` declaration in src/ops/update_state.rs.

@group(0) @binding(0) var<uniform> p: UpdateStateArgs;
@group(0) @binding(1) var<storage, read> accept_tokens: array<i32>;
@group(0) @binding(2) var<storage, read> is_block: array<u32>;
@group(0) @binding(3) var<storage, read> prompt_lens: array<i32>;
@group(0) @binding(4) var<storage, read> max_dec_len: array<i32>;
@group(0) @binding(5) var<storage, read> end_tokens: array<i32>;
@group(0) @binding(6) var<storage, read_write> accept_num: array<i32>;
@group(0) @binding(7) var<storage, read_write> stop_flags: array<atomic<u32>>;
@group(0) @binding(8) var<storage, read_write> token_ids_all: array<i32>;
@group(0) @binding(9) var<storage, read_write> step_idx: array<i32>;
@group(0) @binding(10) var<storage, read_write> infer_seed: array<u32>;
@group(0) @binding(11) var<storage, read_write> draft_tokens: array<i32>;
@group(0) @binding(12) var<storage, read_write> encoder: array<i32>;
@group(0) @binding(13) var<storage, read_write> decoder: array<i32>;
// `[max_bsz, vocab]` per-slot token counts (process_logits), when `has_counts`; else a dummy.
@group(0) @binding(14) var<storage, read_write> token_counts: array<i32>;

fn set_stop(b: u32) {
    let at = p.stop_flags_off + b;
    atomicOr(&stop_flags[at >> 2u], 1u << ((at & 3u) * 8u));
}

fn sat_add_i32(a: i32, n: u32) -> i32 {
    // a + n with n >= 0, clamped at i32::MAX.
    if a >= 0 {
        return i32(min(u32(a) + n, 0x7fffffffu));
    }
    let neg = 0u - bitcast<u32>(a);
    if n >= neg {
        return i32(min(n - neg, 0x7fffffffu));
    }
    return -i32(neg - n);
}

@compute @workgroup_size(SLOT_WG)
fn update_state_i32(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    if b >= p.real_bsz {
        return;
    }
    let at = p.stop_flags_off + b;
    let stop_byte = byte_of(atomicLoad(&stop_flags[at >> 2u]), at);
    let block_byte = byte_of(is_block[(p.is_block_off + b) >> 2u], p.is_block_off + b);
    if stop_byte != 0u || block_byte != 0u {
        return;
    }
    let s = p.step_tokens;
    var n = min(len_or_zero(accept_num[p.accept_num_off + b]), s);
    if n == 0u {
        return;
    }
    let mml = p.max_model_len;
    let prompt = min(len_or_zero(prompt_lens[p.prompt_lens_off + b]), mml);
    let step = len_or_zero(step_idx[p.step_idx_off + b]);
    let used = prompt + step;
    var room = 0u;
    if used < mml {
        room = mml - used;
    }
    var stop = false;
    if n > room {
        n = room;
        stop = true;
    }
    accept_num[p.accept_num_off + b] = i32(n);
    if n == 0u {
        set_stop(b);
        return;
    }
    let src = p.accept_tokens_off + b * s;
    let dst = p.token_ids_all_off + b * mml + used;
    for (var k = 0u; k < n; k++) {
        let token = accept_tokens[src + k];
        token_ids_all[dst + k] = token;
        if p.has_counts != 0u && token >= 0 && u32(token) < p.vocab {
            let c = p.counts_off + b * p.vocab + u32(token);
            token_counts[c] = sat_add_i32(token_counts[c], 1u);
        }
    }
    let new_step = i32(min(step + n, 0x7fffffffu));
    step_idx[p.step_idx_off + b] = new_step;
    let si = p.infer_seed_off + 2u * b;
    let seed = row_seed(vec2<u32>(infer_seed[si], infer_seed[si + 1u]), n);
    infer_seed[si] = seed.x;
    infer_seed[si + 1u] = seed.y;
    let last = accept_tokens[src + n - 1u];
    draft_tokens[p.draft_tokens_off + b * s] = last;
    for (var e = 0u; e < p.end_count; e++) {
        if end_tokens[p.end_tokens_off + e] == last {
            stop = true;
        }
    }
    if new_step >= max_dec_len[p.max_dec_len_off + b] {
        stop = true;
    }
    if stop {
        set_stop(b);
    }
    let enc = encoder[p.encoder_off + b];
    let dec = decoder[p.decoder_off + b];
    if enc > 0 {
        decoder[p.decoder_off + b] = sat_add_i32(dec, u32(enc));
        encoder[p.encoder_off + b] = 0;
    } else {
        decoder[p.decoder_off + b] = sat_add_i32(dec, n);
    }
}
