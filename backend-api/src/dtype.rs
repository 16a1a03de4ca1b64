//! Element types that live in device buffers.

/// The element type of a [`Buffer`](crate::Buffer).
///
/// Token ids, lengths, counts and indices are `I32`; seeds are `U64`; probabilities and logits are
/// `F32`, `F16` or `BF16`; flags are `U8` (nonzero means set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the high half of a binary32).
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Unsigned byte (flags).
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::U64,
        DType::U8,
    ];

    /// The floating-point dtypes probabilities and logits may have.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U64 => 8,
            DType::U8 => 1,
        }
    }

    /// The lower-case name used in kernel entry points and trial names (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::U8 => "u8",
        }
    }

    /// Whether this is one of the floating-point dtypes.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

impl_named!(DType, "dtype");

/// A Rust type that can be stored in a buffer: the link between host slices and [`DType`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
        }
    };
}
element!(f32, DType::F32);
element!(half::f16, DType::F16);
element!(half::bf16, DType::BF16);
element!(i32, DType::I32);
element!(u32, DType::U32);
element!(u64, DType::U64);
element!(u8, DType::U8);

/// A floating-point element that widens exactly to `f32` (probabilities, logits).
pub trait FloatElement: Element + Copy {
    /// Exact widening to `f32`.
    fn to_f32(self) -> f32;
}

impl FloatElement for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl FloatElement for half::f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

impl FloatElement for half::bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}
