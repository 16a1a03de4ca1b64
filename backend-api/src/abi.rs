//! Constants shared by the Rust code and every kernel language. Kernels receive them as `-D`
//! defines (CUDA, OpenCL) or a generated prelude (WGSL); they are defined here once.

/// Philox multiplier M0.
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Philox multiplier M1.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Philox key increment W0 (golden ratio).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Philox key increment W1 (sqrt(3) - 1).
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Philox rounds.
pub const PHILOX_ROUNDS: usize = 10;

/// Seeds are kept modulo this value (`2^63 - 2`), so every seed sum stays below `2^64`.
pub const MAX_INFER_SEED: u64 = (1 << 63) - 2;
/// How far the seed advances per emitted token (one step of 4 per token: one per purpose).
pub const SEED_STRIDE: u64 = 4;

/// Fixed-point weights are `floor(p · 2^WEIGHT_BITS)`.
pub const WEIGHT_BITS: u32 = 40;
/// `top_p` in fixed point is `ceil(top_p · 2^TOP_P_BITS)`.
pub const TOP_P_BITS: u32 = 24;
/// The largest vocabulary an op accepts (`2^20`, so a row's total weight stays ≤ `2^60`).
pub const MAX_VOCAB: usize = 1 << 20;
/// The largest host-side length or count an op accepts (`max_step_tokens`, the n-gram sizes):
/// `i32::MAX`, the largest value a device-side length can hold, so every kernel language takes it
/// in 32 bits.
pub const MAX_HOST_LENGTH: usize = i32::MAX as usize;
/// The largest number of TOPP candidates per row.
pub const MAX_CANDIDATES: usize = 128;
/// The largest top-K of `accept_logprobs`.
pub const MAX_LOGPROBS_TOP_K: usize = 64;
/// A REJECTION row whose total weight reaches this is not a distribution (`2^41`).
pub const REJECTION_MAX_TOTAL_WEIGHT: u64 = 1 << 41;
/// Default global draft-token budget of `ngram_match`.
pub const DEFAULT_NGRAM_THRESHOLD: usize = 128;
/// Bits of a sharded row's rank key (`docs/semantics.md` §4d): a 32-bit value ordinal above a
/// 20-bit id part.
pub const SHARD_KEY_BITS: u32 = 52;
/// Bits of the id part of a rank key (`2^20` ids: [`MAX_VOCAB`]).
pub const SHARD_KEY_ID_BITS: u32 = 20;
/// The most records per row `shard_records` offers (`K_GATHER`, `docs/semantics.md` §4d).
pub const MAX_SHARD_RECORDS: usize = 1024;
/// Buckets of one round of `shard_histogram`: the next 8 bits of the key.
pub const SHARD_HISTOGRAM_BUCKETS: usize = 256;

/// One field of a kernel's argument struct: its name and size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelField {
    /// The field name, identical in Rust and in the kernel source.
    pub name: &'static str,
    /// Its size in bytes (4 or 8).
    pub bytes: usize,
}

/// A kernel's argument struct: `#[repr(C)]`, plain old data without padding (`bytemuck::Pod`),
/// declared once in Rust with [`kernel_args!`](crate::kernel_args). Every accelerated backend
/// generates the kernel-side struct of the same name from that declaration (CUDA and OpenCL C
/// with [`c_struct_declaration`]-style text, WGSL by its own generator) and checks what it
/// compiles against it ([`c_struct_fields`] reads C text back; naga reflection for WGSL).
pub trait KernelArgs: Copy + Send + Sync + 'static {
    /// The struct's name, in Rust and in the kernel source.
    const STRUCT: &'static str;
    /// Its fields, in order.
    const FIELDS: &'static [KernelField];
}

/// Declares a kernel argument struct: `#[repr(C)]`, `bytemuck::Pod` (so no padding can hide a
/// layout mismatch) and [`KernelArgs`]. The calling crate depends on `bytemuck`.
///
/// ```
/// specula_backend_api::kernel_args! {
///     /// `argmax`.
///     pub struct ArgmaxArgs { rows: u32, vocab: u32, input_offset: u64 }
/// }
/// use specula_backend_api::abi::KernelArgs;
/// assert_eq!(ArgmaxArgs::FIELDS[2].name, "input_offset");
/// assert_eq!(std::mem::size_of::<ArgmaxArgs>(), 16);
/// ```
#[macro_export]
macro_rules! kernel_args {
    ($($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident : $ty:ty),* $(,)? })*) => {$(
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $(
                #[allow(missing_docs)]
                pub $field: $ty,
            )*
        }

        impl $crate::abi::KernelArgs for $name {
            const STRUCT: &'static str = stringify!($name);
            const FIELDS: &'static [$crate::abi::KernelField] = &[$(
                $crate::abi::KernelField {
                    name: stringify!($field),
                    bytes: ::std::mem::size_of::<$ty>(),
                },
            )*];
        }
    )*};
}

/// The fields `(name, bytes)` of `struct name { ... };` in a CUDA or OpenCL C source, or `None`
/// when the struct is not there or a field's type is not a fixed-size integer or a pointer.
///
/// One declaration per line (`u64 a, b;`, `const T* p;`), comments allowed. Sizes: `u64`, `i64`,
/// `ulong`, `long` and pointers 8 bytes; `u32`, `i32`, `uint`, `int`, `float` 4 bytes.
pub fn c_struct_fields(source: &str, name: &str) -> Option<Vec<(String, usize)>> {
    let start = source.find(&format!("struct {name} {{"))?;
    let body = &source[start..];
    let body = &body[body.find('{')? + 1..body.find("};")?];
    let mut fields = Vec::new();
    for line in body.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        let Some(decl) = code.strip_suffix(';') else {
            if code.is_empty() {
                continue;
            }
            return None;
        };
        let (ty, names) = split_declaration(decl)?;
        let bytes = c_type_bytes(ty)?;
        for field in names.split(',') {
            fields.push((field.trim().to_owned(), bytes));
        }
    }
    Some(fields)
}

/// `("T*", "a, b")` from `const T* a, b`, `("u32", "a")` from `u32 a`.
fn split_declaration(decl: &str) -> Option<(&str, &str)> {
    let decl = decl.trim().trim_start_matches("const ").trim_start();
    let at = match decl.find('*') {
        Some(star) => star + 1,
        None => decl.find(' ')?,
    };
    Some((decl[..at].trim(), decl[at..].trim()))
}

fn c_type_bytes(ty: &str) -> Option<usize> {
    if ty.ends_with('*') {
        return Some(8);
    }
    match ty {
        "u64" | "i64" | "ulong" | "long" => Some(8),
        "u32" | "i32" | "uint" | "int" | "float" => Some(4),
        _ => None,
    }
}

/// The C declaration of a kernel argument struct (`name` and `fields` of a [`KernelArgs`] type:
/// `A::STRUCT`, `A::FIELDS`), one field per line, an 8-byte field typed `u64_type` and a 4-byte one
/// `u32_type`: `("ulong", "uint")` for OpenCL C. Kernel languages whose structs hold only such
/// integers can take this text instead of a hand-written copy; [`c_struct_fields`] reads it back.
///
/// ```
/// use specula_backend_api::abi::{KernelField, c_struct_declaration};
/// let fields = [KernelField { name: "data_offset", bytes: 8 }, KernelField { name: "rows", bytes: 4 }];
/// assert_eq!(
///     c_struct_declaration("DemoArgs", &fields, "ulong", "uint"),
///     "struct DemoArgs {\n    ulong data_offset;\n    uint rows;\n};\n"
/// );
/// ```
pub fn c_struct_declaration(
    name: &str,
    fields: &[KernelField],
    u64_type: &str,
    u32_type: &str,
) -> String {
    let mut text = format!("struct {name} {{\n");
    for field in fields {
        let ty = if field.bytes == 8 { u64_type } else { u32_type };
        text.push_str(&format!("    {ty} {};\n", field.name));
    }
    text.push_str("};\n");
    text
}

/// Checks a [`KernelArgs`] struct against its declaration in a CUDA or OpenCL C source (the
/// generated text, or any other): the same field names, in the same order, with the same sizes.
pub fn check_c_struct<A: KernelArgs>(source: &str) -> std::result::Result<(), String> {
    let found = c_struct_fields(source, A::STRUCT)
        .ok_or_else(|| format!("struct {} not found or not parsable", A::STRUCT))?;
    let expected: Vec<(String, usize)> = A::FIELDS
        .iter()
        .map(|f| (f.name.to_owned(), f.bytes))
        .collect();
    if found != expected {
        return Err(format!(
            "struct {}: the kernel has {found:?}, Rust has {expected:?}",
            A::STRUCT
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::kernel_args! {
        /// A test struct.
        struct Demo { data: u64, out: u64, rows: u32, vocab: u32 }
    }

    #[test]
    fn c_structs_are_parsed_and_compared() {
        let cuda = "struct Demo {\n    const SPECULA_T::raw* data; // [rows]\n    i32* out;\n    u32 rows, vocab;\n};";
        assert_eq!(
            c_struct_fields(cuda, "Demo"),
            Some(vec![
                ("data".into(), 8),
                ("out".into(), 8),
                ("rows".into(), 4),
                ("vocab".into(), 4)
            ])
        );
        assert_eq!(check_c_struct::<Demo>(cuda), Ok(()));
        let opencl = "typedef struct Demo {\n    ulong data, out;\n    uint rows;\n    uint vocab;\n} Demo_t;";
        assert!(
            check_c_struct::<Demo>(opencl).is_err(),
            "needs a plain struct declaration"
        );
        let swapped = "struct Demo { \n ulong data, out;\n uint vocab, rows;\n};";
        assert!(check_c_struct::<Demo>(swapped).is_err());
        let opencl = "struct Demo {\n    ulong data, out;\n    uint rows;\n    uint vocab;\n};";
        assert_eq!(check_c_struct::<Demo>(opencl), Ok(()));
    }

    #[test]
    fn generated_declarations_read_back_as_their_struct() {
        let text = c_struct_declaration(Demo::STRUCT, Demo::FIELDS, "ulong", "uint");
        assert_eq!(check_c_struct::<Demo>(&text), Ok(()));
    }
}
