//! The cases that used to pass silently or with a misleading error: an n-gram budget that can
//! never grant a draft, `insert` during a step on a full decoder, an output row out of range, and
//! logits rows with no finite value (a documented fallback, not an error).

mod common;

use common::{VOCAB, device};
use specula_backend_api::{DeviceExt, Strategy};
use specula_sampler::{Decoder, NgramConfig, Request, SamplerConfig, SamplerError, StepScores};

fn ngram_config(ngram: NgramConfig) -> SamplerConfig {
    SamplerConfig::new(Strategy::TargetMatch, 2, VOCAB, 64, vec![0]).with_ngram(4, ngram)
}

fn config_error(config: SamplerConfig) -> (&'static str, String) {
    match Decoder::new(device(), config) {
        Err(SamplerError::Config { field, reason }) => (field, reason),
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn an_ngram_threshold_below_two_is_a_config_error() {
    for threshold in [0, 1] {
        let (field, reason) = config_error(ngram_config(NgramConfig {
            threshold,
            ..NgramConfig::default()
        }));
        assert_eq!(field, "ngram.threshold");
        assert!(
            reason.starts_with(&format!("{threshold} not in 2 ..=")),
            "{reason}"
        );
    }
    let two = ngram_config(NgramConfig {
        threshold: NgramConfig::MIN_THRESHOLD,
        ..NgramConfig::default()
    });
    assert!(Decoder::new(device(), two).is_ok());
}

#[test]
fn ngram_sizes_are_checked() {
    for (max_ngram_size, min_ngram_size) in [(3, 0), (2, 3), (0, 1)] {
        let (field, reason) = config_error(ngram_config(NgramConfig {
            max_ngram_size,
            min_ngram_size,
            ..NgramConfig::default()
        }));
        assert_eq!(field, "ngram.min_ngram_size");
        assert!(reason.contains("not in 1 ..= max_ngram_size"), "{reason}");
    }
    // A bad proposer is an error even where it would not run (S = 1).
    let mut plain = SamplerConfig::new(Strategy::Greedy, 2, VOCAB, 64, vec![0]);
    plain.ngram = Some(NgramConfig {
        threshold: 0,
        ..NgramConfig::default()
    });
    assert_eq!(config_error(plain).0, "ngram.threshold");
}

#[test]
fn insert_during_a_step_names_the_phase_even_when_full() {
    let config = SamplerConfig::new(Strategy::Greedy, 1, VOCAB, 64, vec![0]);
    let mut decoder = Decoder::new(device(), config).expect("decoder");
    decoder.insert(Request::new(vec![1, 2])).expect("insert");
    decoder.propose().expect("propose");
    let proposed = decoder.insert(Request::new(vec![3])).expect_err("proposed");
    assert!(
        matches!(
            proposed,
            SamplerError::Phase {
                call: "insert",
                phase: "proposed (after propose, before plan)"
            }
        ),
        "{proposed:?}"
    );
    decoder.plan().expect("plan");
    let planned = decoder.insert(Request::new(vec![3])).expect_err("planned");
    assert_eq!(
        planned.to_string(),
        "insert is not allowed now: the step is planned (after plan, before finish)"
    );
    // Between steps, a full decoder is what it says.
    let device = decoder.device().clone();
    let logits = device.upload(&vec![0.0f32; VOCAB]).expect("upload");
    decoder.finish(StepScores::logits(&logits)).expect("finish");
    assert!(matches!(
        decoder.insert(Request::new(vec![3])),
        Err(SamplerError::NoFreeSlot { max_bsz: 1 })
    ));
}

#[test]
fn row_prefix_out_of_range_names_row_and_t_out() {
    let config = SamplerConfig::new(Strategy::Greedy, 2, VOCAB, 64, vec![0]);
    let mut decoder = Decoder::new(device(), config).expect("decoder");
    decoder.insert(Request::new(vec![1, 2])).expect("insert");
    let plan = decoder.plan().expect("plan");
    assert_eq!(plan.t_out(), 1);
    let error = decoder.row_prefix(99).expect_err("row 99");
    assert!(
        matches!(
            error,
            SamplerError::IndexOutOfRange {
                argument: "row",
                index: 99,
                len: 1,
                bound: "T_out"
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "row 99 out of range: valid values are 0 .. 1 (T_out)"
    );
    assert!(matches!(
        decoder.input_prefix(2),
        Err(SamplerError::IndexOutOfRange {
            argument: "input_index",
            index: 2,
            len: 2,
            bound: "token_num"
        })
    ));
}

/// All-NaN (or all −inf) logits weigh 0 everywhere: every strategy emits the first token in rank
/// order, token 0, whatever the seed (`docs/semantics.md` §4b, §5.4, §5.6, §5.7). Not an error.
#[test]
fn all_nan_logits_give_the_first_token_in_rank_order() {
    for strategy in [Strategy::Greedy, Strategy::TargetMatch, Strategy::TopP] {
        let end = VOCAB as i32 - 1;
        let config = SamplerConfig::new(strategy, 4, VOCAB, 64, vec![end]);
        let mut decoder = Decoder::new(device(), config).expect("decoder");
        for seed in 0..4 {
            decoder
                .insert(Request::new(vec![5, 6]).with_seed(seed * 977))
                .expect("insert");
        }
        let device = decoder.device().clone();
        for _ in 0..3 {
            let plan = decoder.plan().expect("plan");
            let rows = vec![f32::NAN; plan.t_out() * VOCAB];
            let logits = device.upload(&rows).expect("upload");
            let output = decoder.finish(StepScores::logits(&logits)).expect("finish");
            for slot in &output.slots {
                assert_eq!(slot.tokens, vec![0], "{strategy:?}");
            }
        }
    }
}
