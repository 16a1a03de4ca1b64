//! Kernel argument blocks: one [`kernel_args!`](specula_backend_api::kernel_args) struct per
//! kernel file, passed by value, mirrored field for field (same names, order and sizes) by the
//! struct of the same name at the top of the `.cu` file: pointers as `u64` device addresses first,
//! then `u64` scalars, then `u32` scalars in pairs, so neither side has padding to disagree on
//! (`bytemuck::Pod` refuses padding at compile time). `tests::every_struct_matches_its_kernel_file`
//! checks every struct against its kernel source.

use cudarc::driver::DeviceRepr;

specula_backend_api::kernel_args! {
    /// `argmax.cu`.
    pub(crate) struct ArgmaxArgs { input: u64, out: u64, rows: u32, vocab: u32, vec: u32, pad: u32 }

    /// `softmax.cu`.
    pub(crate) struct SoftmaxArgs {
        logits: u64, temperature: u64, probs: u64,
        rows: u32, vocab: u32, vec: u32, pad: u32,
    }

    /// `gather_next_token.cu`.
    pub(crate) struct GatherArgs {
        src: u64, dst: u64, cu_seqlens_q: u64, this_time: u64, encoder: u64, cu_out: u64,
        batch_id: u64,
        row_bytes: u64, token_num: u64, max_step_tokens: u64,
        out_rows: u32, real_bsz: u32, speculative: u32, unit: u32,
    }

    /// `build_output_layout.cu`.
    pub(crate) struct LayoutArgs {
        this_time: u64, encoder: u64, seq_lens_output: u64, cu_in: u64, cu_out: u64,
        batch_id: u64,
        capacity: u64, max_step_tokens: u64,
        max_bsz: u32, real_bsz: u32,
    }

    /// `build_sampling_params.cu`.
    pub(crate) struct SamplingParamsArgs {
        slot_top_p: u64, slot_top_k: u64, slot_temperature: u64, slot_seed: u64,
        this_time: u64, encoder: u64, cu_out: u64, batch_id: u64,
        top_p: u64, top_k: u64, temperature: u64, seed: u64,
        rows: u64, max_step_tokens: u64,
        real_bsz: u32, pad: u32,
    }

    /// `update_state.cu`.
    pub(crate) struct UpdateStateArgs {
        accept_tokens: u64, is_block_step: u64, prompt_lens: u64, max_dec_len: u64,
        end_tokens: u64, accept_num: u64, stop_flags: u64, token_ids_all: u64, step_idx: u64,
        infer_seed: u64, draft_tokens: u64, encoder: u64, decoder: u64, token_counts: u64,
        max_model_len: u64, max_step_tokens: u64, n_end: u64, vocab: u64,
        real_bsz: u32, pad: u32,
    }

    /// `ngram_match.cu`.
    pub(crate) struct NgramArgs {
        token_ids_all: u64, prompt_lens: u64, step_idx: u64, draft_token_num: u64, encoder: u64,
        max_dec_len: u64, draft_tokens: u64, this_time: u64, proposals: u64,
        max_model_len: u64, max_step_tokens: u64, threshold: u64,
        real_bsz: u32, min_ngram: u32, max_ngram: u32, pad: u32,
    }

    /// `accept_logprobs.cu`.
    pub(crate) struct LogprobsArgs {
        logits: u64, temperature: u64, accept_tokens: u64, accept_num: u64, encoder: u64,
        cu_out: u64, cu_accept: u64, token_ids: u64, logprobs: u64, ranks: u64, top_ids: u64,
        top_logprobs: u64, entries: u64,
        rows: u64, max_step_tokens: u64,
        max_bsz: u32, real_bsz: u32, vocab: u32, top_k: u32, vec: u32, pad: u32,
    }

    /// `top_k_top_p_sample.cu`.
    pub(crate) struct SampleArgs {
        probs: u64, temperature: u64, top_k: u64, top_p: u64, seed: u64, fallback: u64, tokens: u64,
        scratch: u64, sync: u64,
        scratch_stride: u64,
        rows: u32, vocab: u32, vec: u32, splits: u32, logits: u32, pad: u32,
    }

    /// `top_p_candidates.cu`.
    pub(crate) struct CandidatesArgs {
        probs: u64, temperature: u64, top_p: u64, batch_id: u64, fallback: u64, ids: u64,
        scores: u64, lens: u64,
        rows: u32, vocab: u32, candidates: u32, vec: u32, logits: u32, pad: u32,
    }

    /// `process_logits.cu`.
    pub(crate) struct ProcessArgs {
        scores: u64, temperature: u64, cu_out: u64, batch_id: u64, token_ids_all: u64,
        prompt_lens: u64, step_idx: u64, draft_tokens: u64, token_counts: u64, prompt_mask: u64,
        penalties: u64, min_tokens: u64, end_tokens: u64, bias_offsets: u64, bias_ids: u64,
        bias_values: u64, bad_word_offsets: u64, bad_words: u64, allowed: u64, bitmask: u64,
        processed: u64, fallback: u64,
        max_model_len: u64, max_step_tokens: u64, n_end: u64, n_bias: u64, n_bad_words: u64, first: u64,
        rows: u32, vocab: u32, real_bsz: u32, logits: u32, slice_first: u32, width: u32,
    }

    /// `shard_key.cu`.
    pub(crate) struct ShardKeyArgs {
        scores: u64, ids: u64, keys: u64,
        rows: u32, len: u32, first: u32, order: u32, logits: u32, vec: u32,
    }

    /// `shard_records.cu`.
    pub(crate) struct ShardRecordsArgs {
        scores: u64, temperature: u64, row_key: u64, min_p: u64, records: u64,
        rows: u32, len: u32, first: u32, records_per_row: u32, order: u32, logits: u32, vec: u32,
        pad: u32,
    }

    /// `shard_histogram.cu`.
    pub(crate) struct ShardHistogramArgs {
        scores: u64, temperature: u64, row_key: u64, min_p: u64, prefix: u64, floors: u64,
        counts: u64, masses: u64,
        rows: u32, len: u32, first: u32, shift: u32, logits: u32, vec: u32,
    }

    /// `shard_walk.cu`.
    pub(crate) struct ShardWalkArgs {
        scores: u64, temperature: u64, row_key: u64, min_p: u64, threshold: u64, offset: u64,
        draft: u64, draft_key: u64, draft_row: u64, target_mass: u64, draft_mass: u64, tokens: u64,
        mass: u64, count: u64,
        rows: u32, len: u32, first: u32, draft_rows: u32, logits: u32, pad: u32,
    }

    /// `shard_exp_sum.cu`.
    pub(crate) struct ShardExpSumArgs {
        logits: u64, temperature: u64, row_key: u64, sums: u64,
        rows: u32, len: u32,
    }

    /// `verify_draft_tokens.cu`.
    pub(crate) struct VerifyArgs {
        draft_tokens: u64, this_time: u64, encoder: u64, cu_out: u64, stop_flags: u64,
        is_block_step: u64, reasoning: u64, step_idx: u64, max_dec_len: u64, end_tokens: u64,
        seeds: u64, target_tokens: u64, cand_ids: u64, cand_scores: u64, cand_lens: u64,
        target_probs: u64, draft_probs: u64, top_k: u64, top_p: u64, temperature: u64,
        fallback: u64, draft_index: u64, stats: u64, accept_tokens: u64, accept_num: u64,
        rows: u64, max_step_tokens: u64, n_end: u64, candidates: u64, draft_rows: u64,
        max_bsz: u32, real_bsz: u32, vocab: u32, strategy: u32, accept_all: u32, reject_all: u32,
        vec_target: u32, vec_draft: u32, logits: u32, pad: u32,
    }
}

/// Makes each argument struct a kernel parameter and lists it with the kernel file that mirrors
/// it (`MIRRORS`, checked by the tests).
macro_rules! device_args {
    ($($file:ident => $name:ident),* $(,)?) => {
        $(
            // SAFETY: a `kernel_args!` struct: `#[repr(C)]` plain old data of u64/u32 fields
            // without padding (`bytemuck::Pod`), mirrored field for field by the kernel's struct
            // (checked by `tests::every_struct_matches_its_kernel_file`).
            unsafe impl DeviceRepr for $name {}
        )*

        /// Every argument struct: the kernel file that mirrors it, its name, and the check of its
        /// fields against that file's source.
        #[cfg(test)]
        pub(crate) const MIRRORS: &[(
            crate::kernels::KernelFile,
            &str,
            fn(&str) -> Result<(), String>,
        )] = &[$(
            (
                crate::kernels::KernelFile::$file,
                stringify!($name),
                specula_backend_api::abi::check_c_struct::<$name>,
            ),
        )*];
    };
}

device_args! {
    Argmax => ArgmaxArgs,
    Softmax => SoftmaxArgs,
    GatherNextToken => GatherArgs,
    BuildOutputLayout => LayoutArgs,
    BuildSamplingParams => SamplingParamsArgs,
    UpdateState => UpdateStateArgs,
    NgramMatch => NgramArgs,
    AcceptLogprobs => LogprobsArgs,
    TopKTopPSample => SampleArgs,
    TopPCandidates => CandidatesArgs,
    VerifyDraftTokens => VerifyArgs,
    ProcessLogits => ProcessArgs,
    ShardKey => ShardKeyArgs,
    ShardRecords => ShardRecordsArgs,
    ShardHistogram => ShardHistogramArgs,
    ShardWalk => ShardWalkArgs,
    ShardExpSum => ShardExpSumArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KernelFile;

    /// The names of the `struct *Args {` declarations of a kernel source.
    fn declared_args(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|line| line.strip_prefix("struct "))
            .filter_map(|rest| rest.strip_suffix(" {"))
            .filter(|name| name.ends_with("Args"))
            .collect()
    }

    #[test]
    fn every_struct_matches_its_kernel_file() {
        let failures: Vec<String> = MIRRORS
            .iter()
            .filter_map(|(file, _, check)| {
                check(file.body())
                    .err()
                    .map(|e| format!("{}: {e}", file.file_name()))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn every_kernel_file_has_exactly_its_argument_struct() {
        for file in KernelFile::ALL {
            let rust: Vec<&str> = MIRRORS
                .iter()
                .filter(|(f, _, _)| *f == file)
                .map(|(_, name, _)| *name)
                .collect();
            assert_eq!(
                declared_args(file.body()),
                rust,
                "{}: the kernel's argument structs and the Rust ones differ",
                file.file_name()
            );
        }
    }
}
