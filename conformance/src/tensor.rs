//! Host tensors: the inputs and outputs of a case, as named, typed, shaped bytes.

use specula_backend_api::{DType, Element};

use crate::{ConformanceError, Result};

/// A host-side tensor: dtype, shape and little-endian bytes (the in-memory layout of device
/// buffers and of the safetensors format).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// The element type.
    pub dtype: DType,
    /// The shape; the element count is its product.
    pub shape: Vec<usize>,
    /// `len · dtype.size_bytes()` bytes.
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// A tensor of `shape` holding `data` (whose length must be the shape's product).
    pub fn new<T: Element>(shape: &[usize], data: &[T]) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor {
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            bytes: bytemuck::cast_slice(data).to_vec(),
        }
    }

    /// A one-dimensional tensor.
    pub fn vector<T: Element>(data: &[T]) -> Self {
        Self::new(&[data.len()], data)
    }

    /// A tensor from raw parts, checked for consistency.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Result<Self> {
        let len: usize = shape.iter().product();
        if len * dtype.size_bytes() != bytes.len() {
            return Err(ConformanceError::Format(format!(
                "tensor of dtype {dtype} and shape {shape:?} needs {} bytes, has {}",
                len * dtype.size_bytes(),
                bytes.len()
            )));
        }
        Ok(HostTensor {
            dtype,
            shape,
            bytes,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_bytes()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The elements as `T` (which must be the tensor's dtype).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(ConformanceError::Format(format!(
                "tensor has dtype {}, read as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        Ok(bytemuck::pod_collect_to_vec(&self.bytes))
    }

    /// Element `i` widened for display (integers exactly, floats as f64).
    pub fn display_element(&self, i: usize) -> String {
        let size = self.dtype.size_bytes();
        let b = &self.bytes[i * size..(i + 1) * size];
        match self.dtype {
            DType::F32 => {
                let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                format!("{v:e} (0x{:08x})", v.to_bits())
            }
            DType::F16 => {
                let v = half::f16::from_le_bytes([b[0], b[1]]);
                format!("{v} (0x{:04x})", v.to_bits())
            }
            DType::BF16 => {
                let v = half::bf16::from_le_bytes([b[0], b[1]]);
                format!("{v} (0x{:04x})", v.to_bits())
            }
            DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_string(),
            DType::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_string(),
            DType::U64 => {
                u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]).to_string()
            }
            DType::U8 => b[0].to_string(),
        }
    }
}
