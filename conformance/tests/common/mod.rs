//! Cases written by hand, shared by the integration tests.

use specula_conformance::case::Dims;
use specula_conformance::cases::Case;
use specula_conformance::cases::verify_draft_tokens;
use specula_conformance::tensor::HostTensor;

/// `verify_draft_tokens`, TARGET_MATCH, two slots: slot 0 verifies two drafts that the target
/// confirms (3 tokens emitted), slot 1 has no draft (1 token).
pub fn verify_case() -> Case {
    let dims = Dims {
        max_bsz: 2,
        real_bsz: 2,
        max_step_tokens: 3,
    };
    let params = verify_draft_tokens::Params {
        dims,
        rows: 4,
        vocab: 1000,
        strategy: "target_match".to_owned(),
        candidates: 0,
        accept_all: false,
        reject_all: false,
        logits: false,
        draft_rows: None,
    };
    Case::new("hand::bs2_s3", params)
        .with(
            "draft_tokens",
            HostTensor::new(&[2, 3], &[10i32, 11, 12, 20, -1, -1]),
        )
        .with("seq_lens_this_time", HostTensor::vector(&[3i32, 1]))
        .with("seq_lens_encoder", HostTensor::vector(&[0i32, 0]))
        .with("cu_seqlens_q_output", HostTensor::vector(&[0i32, 3, 4]))
        .with("stop_flags", HostTensor::vector(&[0u8, 0]))
        .with("is_block_step", HostTensor::vector(&[0u8, 0]))
        .with("reasoning_status", HostTensor::vector(&[0i32, 0]))
        .with("step_idx", HostTensor::vector(&[5i32, 5]))
        .with("max_dec_len", HostTensor::vector(&[100i32, 100]))
        .with("end_tokens", HostTensor::vector(&[999i32]))
        .with("seeds", HostTensor::vector(&[1u64, 5, 9, 13]))
        .with("target_tokens", HostTensor::vector(&[11i32, 12, 13, 21]))
}
