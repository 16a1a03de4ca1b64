//! A `PendingStep` refused by another decoder or dropped abandons its step: the decoder that
//! made it collects the step itself, and its output waits in `Decoder::take_abandoned`
//! (issue 29). The wedge itself — both decoders usable afterwards — is tested in `overlap.rs`.

mod common;

use common::{VOCAB, enqueue_next};
use specula_backend_api::Strategy;
use specula_sampler::{Decoder, NgramConfig, Request, SamplerConfig, SamplerError, registry};

/// TARGET_MATCH with S = 4 and the n-gram proposer.
fn config() -> SamplerConfig {
    SamplerConfig::new(Strategy::TargetMatch, 2, VOCAB, 64, vec![0])
        .with_ngram(4, NgramConfig::default())
}

/// Two seeded requests.
fn requests() -> Vec<Request> {
    vec![
        Request::new(vec![17, 3]).with_seed(3).with_max_dec_len(12),
        Request::new(vec![4, 31, 12, 5])
            .with_seed(7)
            .with_max_dec_len(14),
    ]
}

/// The output of a step its decoder collected itself — its `PendingStep` refused by another
/// decoder (`SamplerError::ForeignStep`) or dropped — waits in `take_abandoned`, equal to what
/// `collect` would have returned.
#[test]
fn an_abandoned_steps_output_waits_in_take_abandoned() {
    let device = registry::open("cpu").expect("cpu");
    let requests = requests();
    let mut first = Decoder::new(device.clone(), config()).expect("decoder");
    let mut second = Decoder::new(device.clone(), config()).expect("decoder");
    let mut third = Decoder::new(device.clone(), config()).expect("decoder");
    for request in &requests {
        for decoder in [&mut first, &mut second, &mut third] {
            decoder.insert(request.clone()).expect("insert");
        }
    }
    let first_pending = enqueue_next(&device, &mut first);
    let second_pending = enqueue_next(&device, &mut second);
    let third_pending = enqueue_next(&device, &mut third);
    let refused = first.collect(second_pending);
    assert!(
        matches!(
            refused,
            Err(SamplerError::ForeignStep {
                step: 0,
                phase: "pending (after enqueue, before collect)"
            })
        ),
        "{refused:?}"
    );
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("its output then in take_abandoned")
    );
    let collected = first.collect(first_pending).expect("collect its own step");
    assert!(
        first
            .take_abandoned()
            .expect("nothing to collect")
            .is_empty()
    );
    drop(third_pending);
    // `take_abandoned` collects an abandoned step itself; another call would have too.
    assert_eq!(
        second.take_abandoned().expect("collect"),
        vec![collected.clone()]
    );
    third.propose().expect("propose");
    assert_eq!(
        third.take_abandoned().expect("taken"),
        vec![collected.clone()]
    );
    for decoder in [&mut second, &mut third] {
        assert!(decoder.take_abandoned().expect("taken").is_empty());
        assert_eq!(
            decoder.generated(0),
            first.generated(0),
            "the slots hold the step's tokens"
        );
    }
}
