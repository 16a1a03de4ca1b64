//! Kernel argument blocks: one `#[repr(C)]` struct per kernel file, passed by value, mirroring the
//! `*Args` struct at the top of the `.cu` file field for field (pointers as `u64` device
//! addresses, pointers first, then `u64` scalars, then `u32` scalars in pairs, so neither side
//! has padding to disagree on). The size of each is checked against the CUDA side in the
//! compile check (`tests::sizes_match_the_kernel_structs`).

use cudarc::driver::DeviceRepr;

macro_rules! kernel_args {
    ($(#[$meta:meta])* $name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub(crate) struct $name {
            $(pub(crate) $field: $ty,)*
        }
        // SAFETY: plain old data of u64/u32 fields with C layout, mirrored by the kernel.
        unsafe impl DeviceRepr for $name {}
    };
}

kernel_args!(
    /// `argmax.cu`.
    ArgmaxArgs { input: u64, out: u64, rows: u32, vocab: u32, vec: u32, pad: u32 }
);

kernel_args!(
    /// `softmax.cu`.
    SoftmaxArgs { logits: u64, temperature: u64, probs: u64, rows: u32, vocab: u32, vec: u32, pad: u32 }
);

kernel_args!(
    /// `gather_next_token.cu`.
    GatherArgs {
        src: u64, dst: u64, cu_seqlens_q: u64, this_time: u64, encoder: u64, cu_out: u64, batch_id: u64,
        row_bytes: u64, token_num: u64, max_step_tokens: u64,
        out_rows: u32, real_bsz: u32, speculative: u32, unit: u32,
    }
);

kernel_args!(
    /// `build_output_layout.cu`.
    LayoutArgs {
        this_time: u64, encoder: u64, seq_lens_output: u64, cu_in: u64, cu_out: u64, batch_id: u64,
        capacity: u64, max_step_tokens: u64,
        max_bsz: u32, real_bsz: u32,
    }
);

kernel_args!(
    /// `build_sampling_params.cu`.
    SamplingParamsArgs {
        slot_top_p: u64, slot_top_k: u64, slot_temperature: u64, slot_seed: u64,
        this_time: u64, encoder: u64, cu_out: u64, batch_id: u64,
        top_p: u64, top_k: u64, temperature: u64, seed: u64,
        rows: u64, max_step_tokens: u64,
        real_bsz: u32, pad: u32,
    }
);

kernel_args!(
    /// `update_state.cu`.
    UpdateStateArgs {
        accept_tokens: u64, is_block_step: u64, prompt_lens: u64, max_dec_len: u64, end_tokens: u64,
        accept_num: u64, stop_flags: u64, token_ids_all: u64, step_idx: u64, infer_seed: u64,
        draft_tokens: u64, encoder: u64, decoder: u64,
        max_model_len: u64, max_step_tokens: u64, n_end: u64,
        real_bsz: u32, pad: u32,
    }
);

kernel_args!(
    /// `ngram_match.cu`.
    NgramArgs {
        token_ids_all: u64, prompt_lens: u64, step_idx: u64, draft_token_num: u64, encoder: u64,
        max_dec_len: u64, draft_tokens: u64, this_time: u64, proposals: u64,
        max_model_len: u64, max_step_tokens: u64, threshold: u64,
        real_bsz: u32, min_ngram: u32, max_ngram: u32, pad: u32,
    }
);

kernel_args!(
    /// `accept_logprobs.cu`.
    LogprobsArgs {
        logits: u64, temperature: u64, accept_tokens: u64, accept_num: u64, encoder: u64, cu_out: u64,
        cu_accept: u64, token_ids: u64, logprobs: u64, ranks: u64, top_ids: u64, top_logprobs: u64,
        entries: u64,
        rows: u64, max_step_tokens: u64,
        max_bsz: u32, real_bsz: u32, vocab: u32, top_k: u32, vec: u32, pad: u32,
    }
);

kernel_args!(
    /// `top_k_top_p_sample.cu`.
    SampleArgs {
        probs: u64, top_k: u64, top_p: u64, seed: u64, tokens: u64, scratch: u64,
        scratch_stride: u64,
        rows: u32, vocab: u32, vec: u32, splits: u32,
    }
);

kernel_args!(
    /// `top_p_candidates.cu`.
    CandidatesArgs {
        probs: u64, top_p: u64, batch_id: u64, ids: u64, scores: u64, lens: u64,
        rows: u32, vocab: u32, candidates: u32, vec: u32,
    }
);

kernel_args!(
    /// `verify_draft_tokens.cu`.
    VerifyArgs {
        draft_tokens: u64, this_time: u64, encoder: u64, cu_out: u64, stop_flags: u64,
        is_block_step: u64, reasoning: u64, step_idx: u64, max_dec_len: u64, end_tokens: u64,
        seeds: u64, target_tokens: u64, cand_ids: u64, cand_scores: u64, cand_lens: u64,
        target_probs: u64, draft_probs: u64, top_k: u64, top_p: u64, stats: u64,
        accept_tokens: u64, accept_num: u64,
        rows: u64, max_step_tokens: u64, n_end: u64, candidates: u64, draft_rows: u64,
        max_bsz: u32, real_bsz: u32, vocab: u32, strategy: u32, accept_all: u32, reject_all: u32,
        vec_target: u32, vec_draft: u32,
    }
);

/// Bytes of one `TargetStats` entry of the REJECTION scratch (`verify_draft_tokens.cu`).
pub(crate) const TARGET_STATS_BYTES: u64 = 32;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// Counts the fields of a kernel's `*Args` struct in its source: `(pointers, u64, u32)`.
    fn kernel_struct_fields(source: &str, name: &str) -> (usize, usize, usize) {
        let start = source
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("{name} not found"));
        let body = &source[start..];
        let end = body.find("};").expect("struct end");
        let (mut pointers, mut wide, mut narrow) = (0, 0, 0);
        for line in body[..end].lines().skip(1) {
            let code = line.split("//").next().unwrap_or("").trim();
            if code.is_empty() {
                continue;
            }
            let names = code.matches(',').count() + 1;
            if code.contains('*') {
                pointers += names;
            } else if code.starts_with("u64") {
                wide += names;
            } else if code.starts_with("u32") {
                narrow += names;
            } else {
                panic!("{name}: unexpected field line {code:?}");
            }
        }
        (pointers, wide, narrow)
    }

    #[test]
    fn sizes_match_the_kernel_structs() {
        use crate::kernels::KernelFile as F;
        let cases: [(F, &str, usize); 11] = [
            (F::Argmax, "ArgmaxArgs", size_of::<ArgmaxArgs>()),
            (F::Softmax, "SoftmaxArgs", size_of::<SoftmaxArgs>()),
            (F::GatherNextToken, "GatherArgs", size_of::<GatherArgs>()),
            (F::BuildOutputLayout, "LayoutArgs", size_of::<LayoutArgs>()),
            (
                F::BuildSamplingParams,
                "SamplingParamsArgs",
                size_of::<SamplingParamsArgs>(),
            ),
            (
                F::UpdateState,
                "UpdateStateArgs",
                size_of::<UpdateStateArgs>(),
            ),
            (F::NgramMatch, "NgramArgs", size_of::<NgramArgs>()),
            (F::AcceptLogprobs, "LogprobsArgs", size_of::<LogprobsArgs>()),
            (F::TopKTopPSample, "SampleArgs", size_of::<SampleArgs>()),
            (
                F::TopPCandidates,
                "CandidatesArgs",
                size_of::<CandidatesArgs>(),
            ),
            (F::VerifyDraftTokens, "VerifyArgs", size_of::<VerifyArgs>()),
        ];
        for (file, name, rust_size) in cases {
            let (pointers, wide, narrow) = kernel_struct_fields(file.body(), name);
            assert_eq!(narrow % 2, 0, "{name}: u32 fields come in pairs");
            assert_eq!(
                8 * (pointers + wide) + 4 * narrow,
                rust_size,
                "{name}: the Rust and CUDA argument structs differ"
            );
        }
    }
}
