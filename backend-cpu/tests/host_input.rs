//! `DeviceExt::borrow_host` on the CPU: the runner's slice becomes an input buffer without a
//! copy, and ops read it, and validate it, like any uploaded buffer.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use half::{bf16, f16};
use specula_backend_api::ops::RowShape;
use specula_backend_api::{Backend, Buffer, DType, Device, DeviceExt, Error, FloatElement, host};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;

const ROWS: usize = 3;
const VOCAB: usize = 50;

/// `ROWS` rows of `VOCAB` logits whose maxima sit at 7, 49 and 0.
fn logits<T: FloatElement>(from_f32: fn(f32) -> T) -> Vec<T> {
    let mut rows: Vec<T> = (0..ROWS * VOCAB)
        .map(|i| from_f32(((i * 37) % 23) as f32 * 0.25 - 3.0))
        .collect();
    for (row, max) in [7, 49, 0].into_iter().enumerate() {
        rows[row * VOCAB + max] = from_f32(9.5);
    }
    rows
}

fn argmax(device: &dyn Device, input: &Buffer) -> Result<Vec<i32>, Error> {
    let mut out = device.alloc::<i32>(ROWS)?;
    let shape = RowShape {
        rows: ROWS,
        vocab: VOCAB,
    };
    device.argmax(input, &mut out, &shape)?;
    device.download(&out)
}

/// A borrowed slice is the slice itself (same address, no copy), with the slice's dtype and
/// length, and an op reads from it what it reads from an upload of the same values.
fn borrowed_equals_uploaded<T: FloatElement + PartialEq + std::fmt::Debug>(
    device: &dyn Device,
    from_f32: fn(f32) -> T,
) {
    let rows = logits(from_f32);
    let lent = device.borrow_host(&rows).unwrap();
    assert!(
        lent.is_lent(),
        "{}: a host-memory device copies nothing",
        T::DTYPE
    );
    assert_eq!(
        host::bytes(&lent).unwrap().as_ptr(),
        rows.as_ptr().cast::<u8>()
    );
    assert_eq!((lent.dtype(), lent.len()), (T::DTYPE, rows.len()));
    assert_eq!(lent.device(), device.id());
    let uploaded = device.upload(&rows).unwrap();
    let expected = argmax(device, &uploaded).unwrap();
    assert_eq!(expected, [7, 49, 0]);
    assert_eq!(argmax(device, &lent).unwrap(), expected, "{}", T::DTYPE);
    assert_eq!(device.download::<T>(&lent).unwrap(), rows);
}

#[test]
fn cpu_borrows_every_float_dtype_without_a_copy() {
    let cpu = CpuDevice::with_threads(2).unwrap();
    assert!(cpu.host_memory());
    borrowed_equals_uploaded(&cpu, |x| x);
    borrowed_equals_uploaded(&cpu, f16::from_f32);
    borrowed_equals_uploaded(&cpu, bf16::from_f32);
}

#[test]
fn the_reference_device_borrows_without_a_copy() {
    let reference = ReferenceDevice::new();
    borrowed_equals_uploaded(&reference, |x| x);
}

/// A borrowed buffer is validated like any other: it belongs to the device that borrowed it, and
/// its dtype and length are the slice's.
#[test]
fn a_borrowed_buffer_is_validated_like_any_buffer() {
    let (cpu, other) = (
        CpuDevice::with_threads(1).unwrap(),
        CpuDevice::with_threads(1).unwrap(),
    );
    let rows = logits(|x: f32| x);
    let lent = other.borrow_host(&rows).unwrap();
    assert!(matches!(
        argmax(&cpu, &lent),
        Err(Error::DeviceMismatch { .. })
    ));
    let short = cpu.borrow_host(&rows[..VOCAB]).unwrap();
    assert!(matches!(
        argmax(&cpu, &short),
        Err(Error::ShapeMismatch { .. })
    ));
    let ids: Vec<i32> = (0..(ROWS * VOCAB) as i32).collect();
    let ids = cpu.borrow_host(&ids).unwrap();
    assert_eq!(ids.dtype(), DType::I32);
    assert!(matches!(
        argmax(&cpu, &ids),
        Err(Error::DTypeMismatch { .. }) | Err(Error::Unsupported { .. })
    ));
}
