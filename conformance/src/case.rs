//! A conformance case: one op, its parameters, its named input tensors and (for golden cases) the
//! expected outputs. Cases are data: generated, written by hand, or loaded from a replay file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use specula_backend_api::Op;
use specula_backend_api::ops::BatchDims;

use crate::tensor::HostTensor;

/// The batch shape, as stored in case files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dims {
    /// Request slots.
    pub max_bsz: usize,
    /// Slots described this step.
    pub real_bsz: usize,
    /// `S`, the most tokens of a decode slot per step.
    pub max_step_tokens: usize,
}

impl From<Dims> for BatchDims {
    fn from(d: Dims) -> Self {
        BatchDims {
            max_bsz: d.max_bsz,
            real_bsz: d.real_bsz,
            max_step_tokens: d.max_step_tokens,
        }
    }
}

/// The op of a case and its scalar parameters (the JSON header of a case file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum CaseParams {
    /// Inputs `seq_lens_this_time`, `seq_lens_encoder`.
    BuildOutputLayout {
        /// Batch shape.
        dims: Dims,
        /// Rows of `batch_id_per_token_output` (≥ `real_bsz · S`).
        rows: usize,
    },
    /// Inputs `hidden_states`, `cu_seqlens_q`, `seq_lens_this_time`, `seq_lens_encoder`,
    /// `cu_seqlens_q_output`, `batch_id_per_token_output`.
    GatherNextToken {
        /// Batch shape.
        dims: Dims,
        /// Rows of `hidden_states`.
        token_num: usize,
        /// Row width.
        hidden: usize,
        /// Speculative (per output row) or not (per slot).
        is_speculative: bool,
    },
    /// Inputs `top_p`, `top_k`, `temperature`, `infer_seed` (per slot), `seq_lens_this_time`,
    /// `seq_lens_encoder`, `cu_seqlens_q_output`, `batch_id_per_token_output`.
    BuildSamplingParams {
        /// Batch shape.
        dims: Dims,
    },
    /// Input `input`.
    Argmax {
        /// Rows.
        rows: usize,
        /// Vocabulary.
        vocab: usize,
    },
    /// Inputs `logits`, `temperature`.
    Softmax {
        /// Rows.
        rows: usize,
        /// Vocabulary.
        vocab: usize,
    },
    /// Inputs `probs`, `top_k`, `top_p`, `seed`.
    TopKTopPSample {
        /// Rows.
        rows: usize,
        /// Vocabulary.
        vocab: usize,
    },
    /// Inputs `probs`, `top_p`, optional `batch_id_per_token_output`.
    TopPCandidates {
        /// Rows.
        rows: usize,
        /// Vocabulary.
        vocab: usize,
        /// Candidates per row.
        candidates: usize,
    },
    /// Inputs `draft_tokens`, `seq_lens_this_time`, `seq_lens_encoder`, `cu_seqlens_q_output`,
    /// `stop_flags`, `is_block_step`, `reasoning_status`, `step_idx`, `max_dec_len`, `end_tokens`,
    /// `seeds`, and per strategy `target_tokens` | `candidate_ids`, `candidate_scores`,
    /// `candidate_lens` | `target_probs`, `draft_probs`, `top_k`, `top_p`.
    VerifyDraftTokens {
        /// Batch shape.
        dims: Dims,
        /// Output rows of the per-row inputs.
        rows: usize,
        /// Vocabulary.
        vocab: usize,
        /// `greedy`, `target_match`, `topp` or `rejection`.
        strategy: String,
        /// Candidates per row (TOPP).
        candidates: usize,
        /// Accept every in-vocabulary draft.
        accept_all: bool,
        /// Accept no draft.
        reject_all: bool,
    },
    /// Inputs `accept_tokens`, `is_block_step`, `prompt_lens`, `max_dec_len`, `end_tokens`; in/out
    /// `accept_num`, `stop_flags`, `token_ids_all`, `step_idx`, `infer_seed`, `draft_tokens`,
    /// `seq_lens_encoder`, `seq_lens_decoder`.
    UpdateState {
        /// Batch shape.
        dims: Dims,
        /// Row length of `token_ids_all`.
        max_model_len: usize,
    },
    /// Inputs `token_ids_all`, `prompt_lens`, `step_idx`, `draft_token_num`, `seq_lens_encoder`,
    /// `max_dec_len`; in/out `draft_tokens`, `seq_lens_this_time`.
    NgramMatch {
        /// Batch shape.
        dims: Dims,
        /// Row length of `token_ids_all`.
        max_model_len: usize,
        /// Longest n-gram.
        max_ngram_size: usize,
        /// Shortest n-gram.
        min_ngram_size: usize,
        /// Global token budget.
        threshold: usize,
    },
    /// Inputs `logits`, `temperature`, `accept_tokens`, `accept_num`, `seq_lens_encoder`,
    /// `cu_seqlens_q_output`.
    AcceptLogprobs {
        /// Batch shape.
        dims: Dims,
        /// Rows of `logits`.
        rows: usize,
        /// Vocabulary.
        vocab: usize,
        /// Top-K width.
        top_k: usize,
    },
}

impl CaseParams {
    /// The length of the rows a float output is reduced over (the vocabulary of `softmax` and
    /// `accept_logprobs`; 1 for the other ops, whose outputs are exact).
    pub fn reduction_width(&self) -> usize {
        match self {
            CaseParams::Softmax { vocab, .. } | CaseParams::AcceptLogprobs { vocab, .. } => *vocab,
            _ => 1,
        }
    }

    /// The op these parameters are for.
    pub fn op(&self) -> Op {
        match self {
            CaseParams::BuildOutputLayout { .. } => Op::BuildOutputLayout,
            CaseParams::GatherNextToken { .. } => Op::GatherNextToken,
            CaseParams::BuildSamplingParams { .. } => Op::BuildSamplingParams,
            CaseParams::Argmax { .. } => Op::Argmax,
            CaseParams::Softmax { .. } => Op::Softmax,
            CaseParams::TopKTopPSample { .. } => Op::TopKTopPSample,
            CaseParams::TopPCandidates { .. } => Op::TopPCandidates,
            CaseParams::VerifyDraftTokens { .. } => Op::VerifyDraftTokens,
            CaseParams::UpdateState { .. } => Op::UpdateState,
            CaseParams::NgramMatch { .. } => Op::NgramMatch,
            CaseParams::AcceptLogprobs { .. } => Op::AcceptLogprobs,
        }
    }
}

/// One case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The name after the op in a trial name, e.g. `target_match::bs64_s6` or `f32::1x32000`.
    pub name: String,
    /// The op and its parameters.
    pub params: CaseParams,
    /// The input tensors by name (the in/out buffers' initial contents included).
    pub inputs: BTreeMap<String, HostTensor>,
    /// Hand-computed outputs (golden cases); otherwise the CPU reference's outputs are expected.
    pub expected: Option<BTreeMap<String, HostTensor>>,
}

impl Case {
    /// A case without expected outputs.
    pub fn new(name: impl Into<String>, params: CaseParams) -> Self {
        Case {
            name: name.into(),
            params,
            inputs: BTreeMap::new(),
            expected: None,
        }
    }

    /// Adds an input tensor.
    pub fn with(mut self, name: &str, tensor: HostTensor) -> Self {
        self.inputs.insert(name.to_owned(), tensor);
        self
    }

    /// Adds an expected output (making this a golden case).
    pub fn expect(mut self, name: &str, tensor: HostTensor) -> Self {
        self.expected
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_owned(), tensor);
        self
    }

    /// The op of this case.
    pub fn op(&self) -> Op {
        self.params.op()
    }
}
