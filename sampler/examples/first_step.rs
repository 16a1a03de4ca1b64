//! How long a runner's first steps take, with and without [`Decoder::warm_up`] (every kernel) or
//! [`Decoder::warm_up_for`] (this configuration's kernels for f32 logits).
//!
//! The accelerated backends build their kernels at the first call of each op (wgpu its pipelines,
//! xpu-sim its OpenCL programs, CUDA its NVRTC modules), so without a warm-up the first steps pay
//! for the compiles. Run it twice, in separate processes (a driver may cache compiled shaders
//! within a process), and compare:
//!
//! ```text
//! cargo run --release -p specula-sampler --features wgpu --example first_step -- --backend wgpu
//! cargo run --release -p specula-sampler --features wgpu --example first_step -- --backend wgpu --warm-up
//! cargo run --release -p specula-sampler --features wgpu --example first_step -- --backend wgpu --warm-up-for
//! ```
//!
//! On Mesa's lavapipe, set `MESA_SHADER_CACHE_DISABLE=true` to measure cold compiles (Mesa keeps
//! compiled shaders on disk between runs otherwise).

use std::error::Error;
use std::time::Instant;

use specula_backend_api::{DType, DeviceExt, Strategy};
use specula_sampler::{Decoder, NgramConfig, Request, SamplerConfig, SamplingParams, registry};

const VOCAB: usize = 4096;
const STEPS: usize = 4;

/// A toy model's logits: favours `(last + 1) mod V`, with some noise from the prefix length.
fn toy_logits(prefix: &[i32]) -> Vec<f32> {
    let last = prefix.last().copied().unwrap_or(0) as usize;
    (0..VOCAB)
        .map(|v| match v {
            _ if v == (last + 1) % VOCAB => 6.0,
            _ => ((v * 31 + prefix.len() * 7) % 97) as f32 / 32.0,
        })
        .collect()
}

/// Which warm-up runs before the first step.
#[derive(Clone, Copy)]
enum WarmUp {
    None,
    All,
    Config,
}

impl WarmUp {
    fn name(self) -> &'static str {
        match self {
            WarmUp::None | WarmUp::All => "warm_up",
            WarmUp::Config => "warm_up_for(f32)",
        }
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut backend = "cpu".to_owned();
    let mut warm_up = WarmUp::None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backend" => backend = args.next().ok_or("--backend needs a name")?,
            "--warm-up" => warm_up = WarmUp::All,
            "--warm-up-for" => warm_up = WarmUp::Config,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let device = registry::open(&backend)?;
    let config = SamplerConfig::new(Strategy::TargetMatch, 8, VOCAB, 256, vec![0])
        .with_ngram(4, NgramConfig::default());
    let mut decoder = Decoder::new(device.clone(), config)?;
    let started = Instant::now();
    match warm_up {
        WarmUp::None => {}
        WarmUp::All => decoder.warm_up()?,
        WarmUp::Config => decoder.warm_up_for(DType::F32)?,
    }
    let warm_up_s = started.elapsed().as_secs_f64();
    for i in 0..8i32 {
        let prompt: Vec<i32> = (0..12).map(|t| i * 100 + t % 5 + 1).collect();
        let params = SamplingParams::default()
            .with_seed(u64::from(i.unsigned_abs()))
            .with_top_p(0.9)
            .with_temperature(0.8);
        decoder.insert(
            Request::new(prompt)
                .with_params(params)
                .with_max_dec_len(64),
        )?;
    }
    let mut times = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        let t0 = Instant::now();
        decoder.step(|decoder, plan| {
            let mut rows = Vec::with_capacity(plan.t_out() * VOCAB);
            for row in 0..plan.t_out() {
                rows.extend(toy_logits(&decoder.row_prefix(row)?));
            }
            Ok::<_, specula_sampler::SamplerError>(device.upload(&rows)?)
        })?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let steps: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
    println!(
        "{} ({}): {} {} s, steps 1..={STEPS}: [{}] s, first step {:.3} s",
        device.info().kind,
        device.info().name,
        warm_up.name(),
        match warm_up {
            WarmUp::None => "skipped".to_owned(),
            _ => format!("{warm_up_s:.3}"),
        },
        steps.join(", "),
        times[0]
    );
    Ok(())
}
