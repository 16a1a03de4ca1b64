//! Where a warm batch-1 call's time goes (run with `--release -- --ignored --nocapture`).

use std::time::Instant;

use specula_backend_api::ops::{RowShape, SampleInputs, SampleParams, Scores};
use specula_backend_api::{DType, Device, DeviceExt};

use super::tests::normal_row;
use crate::CpuDevice;
use crate::sampling::lcg::Lcg;

/// Median and least µs of `reps` calls of `f`, each after `gap` (as the bench's floor read).
fn times(reps: usize, f: &mut dyn FnMut(), gap: &mut dyn FnMut()) -> (f64, f64) {
    for _ in 0..20 {
        f();
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        gap();
        let start = Instant::now();
        f();
        t.push(start.elapsed().as_secs_f64() * 1e6);
    }
    t.sort_by(f64::total_cmp);
    (t[reps / 2], t[0])
}

#[test]
#[ignore = "a measurement, not a check"]
fn batch1_pieces() {
    let cpu = CpuDevice::new().expect("cpu");
    let v = 151_936;
    let mut lcg = Lcg(9);
    let row = normal_row(&mut lcg, v, 3.0);
    let logits = cpu.upload(&row).expect("upload");
    let temperature = cpu.upload(&[1.0f32]).expect("upload");
    let top_k0 = cpu.upload(&[0i32]).expect("upload");
    let top_k50 = cpu.upload(&[50i32]).expect("upload");
    let top_p = cpu.upload(&[1.0f32]).expect("upload");
    let seed = cpu.upload(&[5u64]).expect("upload");
    let mut tokens = cpu.alloc::<i32>(1).expect("alloc");
    let shape = RowShape { rows: 1, vocab: v };
    let params = SampleParams::new(shape);
    let tiny = cpu.upload(&[0.5f32; 64]).expect("upload");
    let tiny_params = SampleParams::new(RowShape { rows: 1, vocab: 64 });
    let reps = 1000;
    let none = &mut || {};
    let floor = &mut || {
        std::hint::black_box(cpu.read_floor(&logits).expect("floor"));
    };
    let spin = &mut || {
        let start = Instant::now();
        while start.elapsed().as_micros() < 200 {
            std::hint::spin_loop();
        }
    };
    let sleep = &mut || std::thread::sleep(std::time::Duration::from_micros(500));
    let mut report = |name: &str, f: &mut dyn FnMut()| {
        use crate::parallel::probe::*;
        use std::sync::atomic::Ordering::Relaxed;
        let mut line = format!("{name:<36}");
        let gaps: [(&str, &mut dyn FnMut(), usize); 4] = [
            ("back-to-back", &mut *none, reps),
            ("after floor", &mut *floor, reps),
            ("after 200us spin", &mut *spin, reps / 4),
            ("after 500us sleep", &mut *sleep, reps / 4),
        ];
        for (gap_name, gap, n) in gaps {
            SECOND_ON_CALLER.store(0, Relaxed);
            STARTED.store(0, Relaxed);
            LATENCY_NS.store(0, Relaxed);
            let (median, least) = times(n, f, gap);
            let started = STARTED.load(Relaxed).max(1);
            line += &format!(
                " | {gap_name} {median:6.1}/{least:6.1} (b on caller {:4}, start {:5.1} us)",
                SECOND_ON_CALLER.load(Relaxed),
                LATENCY_NS.load(Relaxed) as f64 / started as f64 / 1e3
            );
        }
        println!("{line}");
    };
    report("empty install", &mut || {
        cpu.install(|| std::hint::black_box(1));
    });
    report("install + empty join", &mut || {
        cpu.install(|| rayon::join(|| std::hint::black_box(1), || std::hint::black_box(2)));
    });
    report("read_floor", &mut || {
        std::hint::black_box(cpu.read_floor(&logits).expect("floor"));
    });
    report("op, probs 64 tokens (front+install)", &mut || {
        let inputs = SampleInputs::new(Scores::Probs(&tiny), &top_k0, &top_p, &seed);
        cpu.top_k_top_p_sample(&inputs, &mut tokens, &tiny_params)
            .expect("op");
    });
    let temps = [1.0f32];
    for (setting, top_k) in [("k0 p1", &top_k0), ("k50 p1", &top_k50)] {
        let scores = Scores::logits(&logits, &temperature);
        let inputs = SampleInputs::new(scores, top_k, &top_p, &seed);
        report(&format!("op body on the pool ({setting})"), &mut || {
            let out = &mut tokens;
            cpu.install(|| {
                super::top_k_top_p_sample(DType::F32, &inputs, Some(&temps), out, &shape)
            })
            .expect("op");
        });
        report(&format!("op ({setting})"), &mut || {
            cpu.top_k_top_p_sample(&inputs, &mut tokens, &params)
                .expect("op");
        });
    }
}
