//! One module per op, named as the op, mirroring the kernel files of the other backends
//! (`kernels/<op>.cu`, `kernels/<op>.cl`, `shaders/<op>.wgsl`).
//! Every function here is called after the shared host-side validation of `backend-api`, so shapes
//! and dtypes are known to be right; buffer *contents* may still be anything and are clamped as the
//! contract says.

pub(crate) mod accept_logprobs;
pub(crate) mod argmax;
pub(crate) mod build_output_layout;
pub(crate) mod build_sampling_params;
pub(crate) mod gather_next_token;
pub(crate) mod ngram_match;
pub(crate) mod process_logits;
pub(crate) mod shard_exp_sum;
pub(crate) mod shard_histogram;
pub(crate) mod shard_key;
pub(crate) mod shard_records;
pub(crate) mod shard_walk;
mod sharded;
pub(crate) mod softmax;
pub(crate) mod top_k_top_p_sample;
pub(crate) mod top_p_candidates;
pub(crate) mod update_state;
pub(crate) mod verify_draft_tokens;

/// Runs `$body` with `$T` bound to the Rust type of a float dtype (f32, f16, bf16).
macro_rules! with_float {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            specula_backend_api::DType::F32 => {
                type $T = f32;
                $body
            }
            specula_backend_api::DType::F16 => {
                type $T = half::f16;
                $body
            }
            specula_backend_api::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => Err(specula_backend_api::Error::Unsupported {
                backend: specula_backend_api::BackendKind::Cpu,
                op: $op,
                what: format!("dtype {other}"),
            }),
        }
    };
}
pub(crate) use with_float;

/// Reads an i32 length from device memory as the contract says: negative counts as 0.
#[inline]
pub(crate) fn len_or_zero(value: i32) -> usize {
    value.max(0) as usize
}

/// A token id as an index into a row of `vocab` entries, or `None` outside `0 .. vocab`.
#[inline]
pub(crate) fn token_index(token: i32, vocab: usize) -> Option<usize> {
    usize::try_from(token).ok().filter(|&t| t < vocab)
}

/// How many threads one row's first pass may use: the pool's threads shared among the rows, so
/// that a batch smaller than the pool still uses every core.
#[inline]
pub(crate) fn parts_per_row(rows: usize) -> usize {
    (rayon::current_num_threads() / rows.max(1)).max(1)
}

/// Whether a row value weighs nothing: a logit that is −inf once sanitized (`docs/semantics.md` §4b), or a
/// probability with `w(p) = 0`. A sampling op's answer weighs nothing exactly when its row's total
/// weight is 0 — the rows where a `fallback` input replaces the answer (`docs/semantics.md` §4c).
#[inline]
pub(crate) fn weighs_nothing(value: f32, logits: bool) -> bool {
    if logits {
        specula_backend_api::logit_weights::sanitize_logit(value) == f32::NEG_INFINITY
    } else {
        specula_backend_api::fixed_point::weight(value) == 0
    }
}

/// The per-row temperatures of a sampling op's rows when they are logits (`docs/semantics.md`
/// §4b); `None` for probability rows.
pub(crate) fn logits_temperature<'a>(
    scores: &specula_backend_api::ops::Scores<'a>,
    kind: &specula_backend_api::ops::ScoresKind,
) -> specula_backend_api::Result<Option<&'a [f32]>> {
    match scores.temperature() {
        Some(t) if kind.logits => Ok(Some(specula_backend_api::host::slice::<f32>(t)?)),
        _ => Ok(None),
    }
}

/// The f32 value of token `id` of row `r` in a `[rows, vocab]` float matrix (-inf outside it).
pub(crate) fn row_value(
    matrix: &specula_backend_api::Buffer,
    dtype: specula_backend_api::DType,
    r: usize,
    vocab: usize,
    id: i32,
) -> specula_backend_api::Result<f32> {
    let Some(id) = token_index(id, vocab) else {
        return Ok(f32::NEG_INFINITY);
    };
    with_float!(dtype, specula_backend_api::Op::Memory, T => {
        let values = specula_backend_api::host::slice::<T>(matrix)?;
        Ok(specula_backend_api::FloatElement::to_f32(values[r * vocab + id]))
    })
}
