//! A runner's own wgpu objects: Specula opened on the runner's `wgpu::Device` and `wgpu::Queue`
//! (`WgpuDevice::from_wgpu`), and the runner's `wgpu::Buffer` of logits as the step's input
//! without a copy (`WgpuDevice::wrap_buffer`). Decoder steps from it equal the steps from an
//! uploaded buffer; a buffer without STORAGE usage, too small, or of another device is refused.
//! A host slice (`borrow_host`) is uploaded here, and says so.
//!
//! Without a usable adapter the tests are listed as ignored with the reason, and fail under
//! `SPECULA_REQUIRE=wgpu` (`specula_backend_api::testing`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use specula_backend_api::named_tests;
use specula_backend_api::testing::TestFn;
use specula_backend_api::{Backend, DType, Device, DeviceExt, Error, Strategy};
use specula_backend_wgpu::WgpuDevice;
use specula_sampler::{Decoder, Request, SamplerConfig, SamplingParams, StepScores};
use wgpu::util::DeviceExt as _;

const VOCAB: usize = 61;
const MAX_BSZ: usize = 3;

/// What a runner has: its own adapter, device and queue (the adapter's limits requested).
struct Runner {
    adapter: wgpu::Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
}

fn runner() -> Result<Runner, String> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY))
        .into_iter()
        .next()
        .ok_or("no adapter")?;
    let (device, queue) = request_device(&adapter)?;
    Ok(Runner {
        adapter,
        device,
        queue,
    })
}

fn request_device(adapter: &wgpu::Adapter) -> Result<(wgpu::Device, wgpu::Queue), String> {
    pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("runner"),
        required_features: wgpu::Features::empty(),
        required_limits: adapter.limits(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| format!("request_device: {e}"))
}

fn specula_on(runner: &Runner) -> Result<WgpuDevice, String> {
    WgpuDevice::from_wgpu(&runner.device, &runner.queue, &runner.adapter.get_info())
        .map_err(|e| format!("from_wgpu: {e}"))
}

/// The runner's model: logits of the next token after `prefix` (peaked, not uniform).
fn logits(prefix: &[i32]) -> Vec<f32> {
    let last = *prefix.last().unwrap_or(&1) as usize;
    (0..VOCAB)
        .map(|v| ((last * 31 + v * 17 + prefix.len()) % 23) as f32 * 0.3 - 2.0)
        .collect()
}

fn decoder(device: &Arc<WgpuDevice>) -> Result<Decoder, String> {
    let config = SamplerConfig::new(Strategy::TargetMatch, MAX_BSZ, VOCAB, 48, vec![0]);
    let mut decoder = Decoder::new(device.clone(), config).map_err(|e| e.to_string())?;
    for i in 0..MAX_BSZ {
        let params = SamplingParams::default()
            .with_seed(11 + i as u64)
            .with_temperature([0.0f32, 0.8, 1.3][i]);
        let request = Request::new(vec![3 + i as i32, 5, 8])
            .with_params(params)
            .with_max_dec_len(12 + 3 * i);
        decoder.insert(request).map_err(|e| e.to_string())?;
    }
    Ok(decoder)
}

/// Two decoders on one device opened on the runner's: one finishes from the runner's buffer
/// (written with the runner's queue, wrapped without a copy), the other from an upload of the
/// same rows. Every step emits the same tokens.
fn steps_from_the_runners_buffer_equal_uploaded_steps() -> Result<(), String> {
    let runner = runner()?;
    let device = Arc::new(specula_on(&runner)?);
    let logits_buffer = runner.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("runner logits"),
        size: (MAX_BSZ * VOCAB * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let (mut wrapped, mut uploaded) = (decoder(&device)?, decoder(&device)?);
    let mut tokens = 0;
    while wrapped.has_running() {
        let plan = wrapped.plan().map_err(|e| e.to_string())?;
        uploaded.plan().map_err(|e| e.to_string())?;
        let mut rows = Vec::new();
        for t in 0..plan.t_out() {
            rows.extend(logits(&wrapped.row_prefix(t).map_err(|e| e.to_string())?));
        }
        runner
            .queue
            .write_buffer(&logits_buffer, 0, bytemuck::cast_slice(&rows));
        let input = device
            .wrap_buffer(&logits_buffer, DType::F32, rows.len())
            .map_err(|e| format!("wrap_buffer: {e}"))?;
        assert!(input.is_lent());
        let a = wrapped.finish(StepScores::logits(&input));
        let upload = device.upload(&rows).map_err(|e| e.to_string())?;
        let b = uploaded.finish(StepScores::logits(&upload));
        let (a, b) = (a.map_err(|e| e.to_string())?, b.map_err(|e| e.to_string())?);
        if a.slots != b.slots {
            return Err(format!(
                "step {}: {:?} != {:?}",
                plan.step, a.slots, b.slots
            ));
        }
        tokens += a.slots.iter().map(|s| s.tokens.len()).sum::<usize>();
    }
    if uploaded.has_running() || tokens < 30 {
        return Err(format!("{tokens} tokens; the decoders ended apart"));
    }
    Ok(())
}

/// The error of `wrap_buffer`, or a message when it accepts the buffer.
fn refused(device: &WgpuDevice, buffer: &wgpu::Buffer, len: usize) -> Result<String, String> {
    match device.wrap_buffer(buffer, DType::F32, len) {
        Err(error @ Error::InvalidArgument { .. }) => Ok(error.to_string()),
        Err(other) => Err(format!("not InvalidArgument: {other}")),
        Ok(_) => Err("a bad buffer was accepted".to_owned()),
    }
}

/// Wrong usage, a size below `len` × dtype, and a buffer of another `wgpu::Device` are refused
/// with errors that name the problem; a good buffer is accepted.
fn bad_buffers_are_refused() -> Result<(), String> {
    let runner = runner()?;
    let device = specula_on(&runner)?;
    let make = |device: &wgpu::Device, usage| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("runner buffer"),
            contents: &[0u8; 64],
            usage,
        })
    };
    let uniform = make(&runner.device, wgpu::BufferUsages::UNIFORM);
    let storage = make(&runner.device, wgpu::BufferUsages::STORAGE);
    let usage = refused(&device, &uniform, 16)?;
    let size = refused(&device, &storage, 17)?;
    let (other_device, _queue) = request_device(&runner.adapter)?;
    let foreign = make(&other_device, wgpu::BufferUsages::STORAGE);
    let foreign = refused(&device, &foreign, 16)?;
    for (message, word) in [
        (&usage, "STORAGE"),
        (&size, "68 bytes"),
        (&foreign, "wgpu::Device"),
    ] {
        if !message.contains(word) {
            return Err(format!("{message:?} does not say {word:?}"));
        }
    }
    let good = device
        .wrap_buffer(&storage, DType::F32, 16)
        .map_err(|e| format!("a good buffer: {e}"))?;
    if (good.len(), good.dtype(), good.device()) != (16, DType::F32, device.id()) {
        return Err(format!("wrapped as {good:?}"));
    }
    Ok(())
}

/// On wgpu a host slice is uploaded: `borrow_host` says it copied, and holds the values.
fn a_host_slice_is_uploaded() -> Result<(), String> {
    let device = specula_backend_wgpu::open_device(0).map_err(|e| e.to_string())?;
    let rows = logits(&[4, 2]);
    let input = device.borrow_host(&rows).map_err(|e| e.to_string())?;
    if input.is_lent() || device.host_memory() {
        return Err("wgpu cannot lend host memory".to_owned());
    }
    match device.download::<f32>(&input) {
        Ok(back) if back == rows => Ok(()),
        other => Err(format!("downloaded {other:?}")),
    }
}

fn main() -> ExitCode {
    let tests: Vec<(&str, TestFn)> = named_tests![
        steps_from_the_runners_buffer_equal_uploaded_steps,
        bad_buffers_are_refused,
        a_host_slice_is_uploaded,
    ];
    common::run_all_on_wgpu(tests)
}
