//! One module per op, named as the op (`docs/semantics.md` §5). Each is called after
//! the shared host-side validation of `backend-api`, so shapes and dtypes are right; buffer
//! contents may be anything and take the documented fallbacks.

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
