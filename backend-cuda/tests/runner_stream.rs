//! A runner's own CUDA objects: Specula opened on the runner's stream (`CudaDevice::from_stream`)
//! and the runner's device pointer of logits as an input without a copy
//! (`CudaDevice::wrap_device_ptr`): ops read from it what they read from an upload of the same
//! rows, a download gives the rows back, and a null or misaligned pointer is refused. A started
//! download (page-locked, waited once on an event) delivers every window, again when its block
//! is reused or grown, and after a download dropped unwaited.
//!
//! Needs an NVIDIA GPU: without one the tests are listed as ignored with the reason, and fail
//! under `SPECULA_REQUIRE=cuda` (`ci/test-cuda.sh` on a GPU machine).

use std::process::ExitCode;

use cudarc::driver::{CudaContext, DevicePtr};
use specula_backend_api::named_tests;
use specula_backend_api::ops::RowShape;
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::transfer::elements;
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Error};
use specula_backend_cuda::CudaDevice;

const ROWS: usize = 4;
const VOCAB: usize = 1000;

/// `ROWS` rows whose maxima sit at 3, 999, 0 and 500.
fn logits() -> Vec<f32> {
    let mut rows: Vec<f32> = (0..ROWS * VOCAB)
        .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
        .collect();
    for (row, max) in [3, 999, 0, 500].into_iter().enumerate() {
        rows[row * VOCAB + max] = 7.0;
    }
    rows
}

fn argmax(device: &dyn Device, input: &Buffer) -> Result<Vec<i32>, String> {
    let mut out = device.alloc::<i32>(ROWS).map_err(|e| e.to_string())?;
    let shape = RowShape {
        rows: ROWS,
        vocab: VOCAB,
    };
    device
        .argmax(input, &mut out, &shape)
        .map_err(|e| format!("argmax: {e}"))?;
    device.download(&out).map_err(|e| e.to_string())
}

/// The runner's stream and rows: Specula on that stream reads the runner's allocation in place.
fn a_wrapped_pointer_reads_as_an_upload() -> Result<(), String> {
    let ctx = CudaContext::new(0).map_err(|e| format!("context: {e}"))?;
    let stream = ctx.new_stream().map_err(|e| format!("stream: {e}"))?;
    let rows = logits();
    let runner_logits = stream
        .clone_htod(&rows)
        .map_err(|e| format!("upload: {e}"))?;
    let device = CudaDevice::from_stream(stream.clone()).map_err(|e| e.to_string())?;
    let (ptr, _sync) = runner_logits.device_ptr(&stream);
    // SAFETY: `runner_logits` holds ROWS × VOCAB f32 in this context and outlives `input`;
    // nothing writes it meanwhile.
    let input = unsafe { device.wrap_device_ptr(ptr, DType::F32, rows.len()) }
        .map_err(|e| format!("wrap_device_ptr: {e}"))?;
    if !input.is_lent() || input.device() != device.id() {
        return Err(format!("wrapped as {:?}", *input));
    }
    let uploaded = device.upload(&rows).map_err(|e| e.to_string())?;
    let (from_runner, from_upload) = (argmax(&device, &input)?, argmax(&device, &uploaded)?);
    if from_runner != [3, 999, 0, 500] || from_runner != from_upload {
        return Err(format!(
            "argmax {from_runner:?}, from an upload {from_upload:?}"
        ));
    }
    match device.download::<f32>(&input) {
        Ok(back) if back == rows => Ok(()),
        Ok(_) => Err("the download differs from the rows".to_owned()),
        Err(e) => Err(format!("download: {e}")),
    }
}

/// A null or misaligned pointer is refused before anything runs.
fn bad_pointers_are_refused() -> Result<(), String> {
    let device = CudaDevice::new(0).map_err(|e| e.to_string())?;
    for ptr in [0u64, 0x1002] {
        // SAFETY: refused before the pointer is used.
        match unsafe { device.wrap_device_ptr(ptr, DType::F32, 8) } {
            Err(Error::InvalidArgument { .. }) => {}
            other => return Err(format!("{ptr:#x}: {other:?}")),
        }
    }
    Ok(())
}

/// Windows at odd byte offsets, an empty buffer and one larger than the first page-locked block:
/// `start_download` then `wait` gives what `download` gives, three times (the block reused, then
/// grown), and a download dropped unwaited leaves the next one intact.
fn a_started_download_delivers_every_window() -> Result<(), String> {
    let device = CudaDevice::new(0).map_err(|e| e.to_string())?;
    let ints = device
        .upload(&[1i32, 2, 3, 4, 5, 6])
        .map_err(|e| e.to_string())?;
    let mut bytes = device
        .upload(&[9u8, 8, 7, 6, 5])
        .map_err(|e| e.to_string())?;
    bytes.set_window(1, 3).map_err(|e| e.to_string())?;
    let empty = device.alloc::<f32>(0).map_err(|e| e.to_string())?;
    let large: Vec<f32> = (0..300_000).map(|i| i as f32 * 0.5).collect();
    let large = device.upload(&large).map_err(|e| e.to_string())?;
    let small: [&Buffer; 3] = [&ints, &bytes, &empty];
    let grown: [&Buffer; 4] = [&ints, &bytes, &empty, &large];
    for (round, srcs) in [&small[..], &small[..], &grown[..]].into_iter().enumerate() {
        let dropped = device.start_download(srcs).map_err(|e| e.to_string())?;
        drop(dropped);
        let got = device
            .start_download(srcs)
            .and_then(|pending| pending.wait())
            .map_err(|e| format!("round {round}: {e}"))?;
        if elements::<i32>(&got[0]) != [1, 2, 3, 4, 5, 6]
            || got[1] != [8, 7, 6]
            || !got[2].is_empty()
        {
            return Err(format!("round {round}: {:?}", &got[..3]));
        }
        if let Some(last) = got.get(3) {
            let want: Vec<f32> = device.download(&large).map_err(|e| e.to_string())?;
            if elements::<f32>(last) != want {
                return Err(format!("round {round}: the large window differs"));
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let needs = Needs::of_open("cuda", &CudaDevice::new(0));
    let tests: Vec<(&str, TestFn)> = named_tests![
        a_wrapped_pointer_reads_as_an_upload,
        a_started_download_delivers_every_window,
        bad_pointers_are_refused,
    ];
    testing::run(&needs, tests)
}
