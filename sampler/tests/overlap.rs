//! The overlapped step: `enqueue` then `collect` (with the runner's work in between) emits what
//! `finish` emits, a step waits for the device once, and `insert`/`remove` write once, on every
//! backend compiled in (cpu always; wgpu and xpu-sim with their features).

mod common;

use std::sync::Arc;

use common::{Forward, ToyModel, VOCAB, decode_to_the_end, enqueue_next, forward};
use specula_backend_api::transfer::elements;
use specula_backend_api::{Device, DeviceExt, MemoryStats, Strategy, WriteAt};
use specula_sampler::{
    Decoder, NgramConfig, Request, SamplerConfig, SamplerError, SamplingParams, StepOutput,
    StepScores, registry,
};

/// Every backend this test build can open.
fn devices() -> Vec<Arc<dyn Device>> {
    let mut specs = vec!["cpu"];
    if cfg!(feature = "wgpu") {
        specs.push("wgpu");
    }
    if cfg!(feature = "xpu-sim") {
        specs.push("xpu-sim");
    }
    specs
        .into_iter()
        .map(|spec| registry::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}")))
        .collect()
}

/// TARGET_MATCH with S = 4 and the n-gram proposer, log-probabilities of width 2 configured.
fn config() -> SamplerConfig {
    let mut config = SamplerConfig::new(Strategy::TargetMatch, 3, VOCAB, 64, vec![0])
        .with_ngram(4, NgramConfig::default());
    config.logprobs = Some(2);
    config
}

/// Three requests: one using a penalty (so the steps process their logits), one seeded, and one
/// greedy with log-probabilities.
fn requests() -> Vec<Request> {
    vec![
        Request {
            repetition_penalty: 1.3,
            ..Request::new(vec![17]).with_seed(3).with_max_dec_len(12)
        },
        Request::new(vec![4, 31, 12, 5])
            .with_seed(7)
            .with_max_dec_len(14),
        Request::new(vec![9, 2])
            .with_params(SamplingParams::greedy())
            .with_max_dec_len(10)
            .with_logprobs(2),
    ]
}

/// The memory operations of one step: its plan (the scheduler and the n-gram proposer) and its
/// finish (`finish`, or `enqueue` to `collect`).
#[derive(Debug)]
struct StepStats {
    plan: MemoryStats,
    finish: MemoryStats,
}

/// Decodes `requests()` to the end, finishing each step with `finish` or with `enqueue`, a
/// stand-in forward pass (an upload and an op of the runner's own on the device) and `collect`.
/// Returns every step's output and memory operations.
fn decode(device: &Arc<dyn Device>, overlapped: bool) -> (Vec<StepOutput>, Vec<StepStats>) {
    let model = ToyModel { vocab: VOCAB };
    let mut decoder = Decoder::new(device.clone(), config()).expect("decoder");
    for request in requests() {
        decoder.insert(request).expect("insert");
    }
    let (mut outputs, mut stats) = (Vec::new(), Vec::new());
    while decoder.has_running() {
        let before = device.memory_stats();
        let plan = decoder.plan().expect("plan");
        let planned = device.memory_stats();
        let logits =
            forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
        let forwarded = device.memory_stats();
        let output = if overlapped {
            let pending = decoder
                .enqueue(StepScores::logits(&logits))
                .expect("enqueue");
            let next = device
                .upload(&[1.0f32; 8])
                .expect("the runner's next forward");
            assert_eq!(next.len(), 8);
            decoder.collect(pending).expect("collect")
        } else {
            decoder.finish(StepScores::logits(&logits)).expect("finish")
        };
        stats.push(StepStats {
            plan: planned.since(&before),
            finish: device.memory_stats().since(&forwarded),
        });
        outputs.push(output);
    }
    (outputs, stats)
}

#[test]
fn enqueue_then_collect_emits_what_finish_emits() {
    for device in devices() {
        let name = device.info().name.clone();
        let (finished, _) = decode(&device, false);
        let (overlapped, _) = decode(&device, true);
        assert!(finished.len() > 3, "{name}: {} steps", finished.len());
        assert_eq!(overlapped, finished, "{name}");
        let with_logprobs = finished
            .iter()
            .flat_map(|o| &o.slots)
            .filter(|s| s.logprobs.is_some())
            .count();
        assert!(with_logprobs > 0, "{name}: no step had log-probabilities");
    }
}

#[test]
fn every_step_waits_for_the_device_once() {
    for device in devices() {
        let name = device.info().name.clone();
        for overlapped in [false, true] {
            let (outputs, stats) = decode(&device, overlapped);
            for (output, stats) in outputs.iter().zip(&stats) {
                let logprobs = output.slots.iter().any(|s| s.logprobs.is_some());
                let step = output.step;
                assert_eq!(
                    stats.finish.blocking_waits, 1,
                    "{name}: step {step} (logprobs: {logprobs}): {stats:?}"
                );
                // The n-gram proposer's two mirrors travel together too (the first step, all
                // prefills, proposes nothing).
                let proposes = usize::from(step > 0) as u64;
                assert_eq!(
                    stats.plan.blocking_waits, proposes,
                    "{name}: step {step}: {stats:?}"
                );
            }
        }
    }
}

#[test]
fn insert_and_remove_write_once() {
    for device in devices() {
        let name = device.info().name.clone();
        let mut decoder = Decoder::new(device.clone(), config()).expect("decoder");
        for request in requests() {
            // The first request turns logits processing on: its rows join the same write.
            let before = device.memory_stats();
            let slot = decoder.insert(request).expect("insert");
            let stats = device.memory_stats().since(&before);
            assert_eq!(
                (stats.writes, stats.blocking_waits),
                (1, 0),
                "{name}: insert {slot}"
            );
        }
        let before = device.memory_stats();
        decoder.remove(1).expect("remove");
        let stats = device.memory_stats().since(&before);
        assert_eq!(
            (stats.writes, stats.blocking_waits),
            (1, 0),
            "{name}: remove"
        );
    }
}

#[test]
fn a_pending_step_blocks_the_calls_that_need_the_host_state() {
    let device = registry::open("cpu").expect("cpu");
    let model = ToyModel { vocab: VOCAB };
    let mut decoder = Decoder::new(device.clone(), config()).expect("decoder");
    let mut other = Decoder::new(device.clone(), config()).expect("decoder");
    decoder.insert(Request::new(vec![3, 4])).expect("insert");
    other.insert(Request::new(vec![3, 4])).expect("insert");
    let plan = decoder.plan().expect("plan");
    let logits =
        forward(device.as_ref(), &decoder, &plan, &model, Forward::Prefix).expect("forward");
    let pending = decoder
        .enqueue(StepScores::logits(&logits))
        .expect("enqueue");
    assert_eq!(pending.step(), 0);
    assert_eq!(pending.buffers(), 3);
    let pending_phase = "pending (after enqueue, before collect)";
    let refused = [
        ("insert", decoder.insert(Request::new(vec![1])).err()),
        ("remove", decoder.remove(0).err()),
        ("propose", decoder.propose().err()),
        ("plan", decoder.plan().err()),
        (
            "enqueue",
            decoder.enqueue(StepScores::logits(&logits)).err(),
        ),
    ];
    for (call, error) in refused {
        match error {
            Some(SamplerError::Phase { call: c, phase }) => {
                assert_eq!((c, phase), (call, pending_phase));
            }
            other => panic!("{call}: {other:?}"),
        }
    }
    // Another decoder's pending step is refused, and this one's is not consumed.
    let other_plan = other.plan().expect("plan");
    let other_logits = forward(
        device.as_ref(),
        &other,
        &other_plan,
        &model,
        Forward::Prefix,
    )
    .expect("forward");
    let other_pending = other
        .enqueue(StepScores::logits(&other_logits))
        .expect("enqueue");
    // Refused (`SamplerError::ForeignStep`, `abandoned_steps.rs`); this decoder is unchanged.
    assert!(decoder.collect(other_pending).is_err());
    let output = decoder.collect(pending).expect("collect");
    assert_eq!(output.slots.len(), 1);
    assert_eq!(output.slots[0].tokens.len(), 1);
    assert_eq!(decoder.generated(0), Some(&output.slots[0].tokens[..]));
    decoder
        .insert(Request::new(vec![1]))
        .expect("insert after collect");
}

#[test]
fn batched_transfers_are_exact_and_validated() {
    let foreign = registry::open("cpu").expect("cpu");
    for device in devices() {
        let name = device.info().name.clone();
        let mut ints = device.upload(&[1i32, 2, 3, 4, 5, 6]).expect("upload");
        let mut bytes = device.upload(&[9u8, 8, 7, 6, 5]).expect("upload");
        let mut seeds = device.upload(&[u64::MAX, 1, 2]).expect("upload");
        let empty = device.alloc::<f32>(0).expect("alloc");
        // Windows at odd byte offsets (u8 in the middle of a word).
        bytes.set_window(1, 3).expect("window");
        let before = device.memory_stats();
        device
            .write_many(&mut [
                WriteAt::new(&mut ints, 4, &[-5i32, -6]),
                WriteAt::new(&mut bytes, 1, &[42u8]),
                WriteAt::new(&mut seeds, 0, &[7u64]),
            ])
            .expect("write_many");
        assert_eq!(
            (bytes.offset(), bytes.len()),
            (1, 3),
            "{name}: window restored"
        );
        let pending = device
            .start_download(&[&ints, &bytes, &empty, &seeds])
            .expect("start_download");
        assert_eq!(pending.len(), 4);
        let got = pending.wait().expect("wait");
        let stats = device.memory_stats().since(&before);
        assert_eq!((stats.writes, stats.blocking_waits), (1, 1), "{name}");
        assert_eq!(elements::<i32>(&got[0]), [1, 2, 3, 4, -5, -6], "{name}");
        assert_eq!(got[1], [8, 42, 6], "{name}");
        assert!(got[2].is_empty(), "{name}");
        assert_eq!(elements::<u64>(&got[3]), [7, 1, 2], "{name}");

        // Nothing is written when one write of the batch does not fit its window.
        let refused = device.write_many(&mut [
            WriteAt::new(&mut ints, 0, &[100i32]),
            WriteAt::new(&mut bytes, 2, &[1u8, 2]),
        ]);
        assert!(
            matches!(
                refused,
                Err(specula_backend_api::Error::ShapeMismatch { .. })
            ),
            "{name}: {refused:?}"
        );
        let ints_now: Vec<i32> = device.download(&ints).expect("download");
        assert_eq!(ints_now[0], 1, "{name}: a refused batch wrote");
        // Another device's buffer is refused.
        let other = foreign.upload(&[0i32]).expect("upload");
        let mismatch = device.start_download(&[&ints, &other]);
        assert!(
            matches!(
                mismatch,
                Err(specula_backend_api::Error::DeviceMismatch { .. })
            ),
            "{name}: {mismatch:?}"
        );
    }
}

/// Decodes `requests` on a fresh decoder with `finish` alone: the tokens each slot generates.
fn plain_tokens(device: &Arc<dyn Device>, requests: &[Request]) -> Vec<Vec<i32>> {
    let mut decoder = Decoder::new(device.clone(), config()).expect("decoder");
    for request in requests {
        decoder.insert(request.clone()).expect("insert");
    }
    decode_to_the_end(device, &mut decoder, requests.len())
}

/// A pending step handed to another decoder's `collect` is refused there, and wedges neither
/// decoder: the one it was handed to collects its own step, and the one that enqueued it collects
/// the abandoned step itself at its next call, so both decode on to exactly the tokens of a
/// decoder that never met the mistake.
#[test]
fn a_step_handed_to_another_decoder_wedges_neither() {
    for device in devices() {
        let requests = requests();
        let expected = plain_tokens(&device, &requests);
        let mut first = Decoder::new(device.clone(), config()).expect("decoder");
        let mut second = Decoder::new(device.clone(), config()).expect("decoder");
        for request in &requests {
            first.insert(request.clone()).expect("insert");
            second.insert(request.clone()).expect("insert");
        }
        let first_pending = enqueue_next(&device, &mut first);
        let second_pending = enqueue_next(&device, &mut second);
        assert!(first.collect(second_pending).is_err());
        first.collect(first_pending).expect("collect its own step");
        // The second decoder's step was abandoned: its next call collects it, then goes on.
        second.plan().expect("plan after the abandoned step");
        let slots = requests.len();
        assert_eq!(decode_to_the_end(&device, &mut first, slots), expected);
        assert_eq!(decode_to_the_end(&device, &mut second, slots), expected);
    }
}

/// A pending step dropped uncollected is collected by its decoder at its next call (any of
/// them), which then decodes on to exactly the tokens of a decoder that never dropped one.
#[test]
fn a_dropped_pending_step_is_collected_by_its_decoder() {
    for device in devices() {
        let requests = requests();
        let expected = plain_tokens(&device, &requests);
        let mut decoder = Decoder::new(device.clone(), config()).expect("decoder");
        for request in &requests {
            decoder.insert(request.clone()).expect("insert");
        }
        let mut steps = 0;
        while decoder.has_running() {
            // Every other step is dropped; the next call (here `propose`) collects it.
            let pending = enqueue_next(&device, &mut decoder);
            if steps % 2 == 0 {
                drop(pending);
                decoder.propose().expect("propose after a dropped step");
            } else {
                decoder.collect(pending).expect("collect");
            }
            steps += 1;
        }
        assert!(steps > 2, "{steps} steps");
        let generated: Vec<Vec<i32>> = (0..requests.len())
            .map(|slot| decoder.generated(slot).expect("a request").to_vec())
            .collect();
        assert_eq!(generated, expected, "{}", device.info().name);
    }
}
