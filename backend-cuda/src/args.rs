//! Kernel argument blocks: one struct per kernel file, declared once, in Rust, beside the op's
//! host code (`ops/<op>.rs`) with [`cuda_args!`], and passed to the kernels by value.
//!
//! A declaration gives each field its Rust type (`u64` or `u32`) and, for a pointer, its CUDA type
//! (`input: u64 as "const SPECULA_T::raw*"`): pointers as `u64` device addresses first, then `u64`
//! scalars, then `u32` scalars in pairs, so neither side has padding to disagree on
//! (`bytemuck::Pod` refuses padding at compile time). The CUDA struct of the same name is generated
//! from the declaration ([`ArgsStruct::declaration`]) into the source NVRTC compiles, between the
//! headers and the op's file ([`crate::kernels::KernelFile::source`]); the kernel files do not
//! declare it. With it go `static_assert`s of its size, alignment and every field's size (which,
//! with the fields in Rust's order and no padding, fix every offset), so a compile (NVRTC's, or
//! the host emulator's) fails if the two layouts ever differ.

use std::fmt::Write as _;

use cudarc::driver::DeviceRepr;
use specula_backend_api::abi::{KernelArgs, KernelField};

/// A kernel argument struct declared with [`cuda_args!`]: a
/// [`kernel_args!`](specula_backend_api::kernel_args) struct with the CUDA type of each field,
/// passed to a kernel by value.
pub trait CudaArgs: KernelArgs + DeviceRepr {
    /// The CUDA type of each field, in order (`u64`, `u32`, or a pointer type such as `i32*`).
    const C_TYPES: &'static [&'static str];
}

/// Declares a kernel argument struct ([`kernel_args!`](specula_backend_api::kernel_args)) with
/// the CUDA type of each field (`name: u64 as "const float*"`; a scalar's is its Rust type), makes
/// it a kernel parameter (`cudarc::driver::DeviceRepr`) and implements [`CudaArgs`], from which the
/// CUDA struct is generated ([`ArgsStruct::of`]).
macro_rules! cuda_args {
    ($(
        $(#[$meta:meta])*
        $vis:vis struct $name:ident { $($field:ident : $ty:ident $(as $c_type:literal)?),* $(,)? }
    )*) => {$(
        specula_backend_api::kernel_args! {
            $(#[$meta])*
            $vis struct $name { $($field: $ty),* }
        }

        // SAFETY: a `kernel_args!` struct: `#[repr(C)]` plain old data of u64/u32 fields without
        // padding (`bytemuck::Pod`); the kernels' struct is generated from this declaration, with
        // `static_assert`s of its layout (`ArgsStruct::declaration`).
        unsafe impl cudarc::driver::DeviceRepr for $name {}

        impl $crate::args::CudaArgs for $name {
            const C_TYPES: &'static [&'static str] = &[$([$($c_type,)? stringify!($ty)][0]),*];
        }
    )*};
}

pub(crate) use cuda_args;

/// An argument struct as the kernels see it: the name, fields and CUDA types of a kernel argument
/// struct declared in Rust (with the crate's `cuda_args!`), and the size and alignment Rust gives
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgsStruct {
    /// The struct's name, in Rust and in CUDA.
    pub name: &'static str,
    /// Its fields, in order.
    pub fields: &'static [KernelField],
    /// The CUDA type of each field.
    pub c_types: &'static [&'static str],
    /// `size_of` the Rust struct.
    pub bytes: usize,
    /// `align_of` the Rust struct.
    pub align: usize,
}

impl ArgsStruct {
    /// The struct `A`.
    pub(crate) const fn of<A: CudaArgs>() -> Self {
        assert!(
            A::FIELDS.len() == A::C_TYPES.len(),
            "one CUDA type per field"
        );
        let (mut i, mut bytes) = (0, 0);
        while i < A::FIELDS.len() {
            bytes += A::FIELDS[i].bytes;
            i += 1;
        }
        assert!(
            bytes == std::mem::size_of::<A>(),
            "the fields fill the struct: no padding"
        );
        ArgsStruct {
            name: A::STRUCT,
            fields: A::FIELDS,
            c_types: A::C_TYPES,
            bytes: std::mem::size_of::<A>(),
            align: std::mem::align_of::<A>(),
        }
    }

    /// Each field with its CUDA type and its offset in the Rust struct (`#[repr(C)]` without
    /// padding: the sum of the sizes before it).
    pub fn layout(&self) -> impl Iterator<Item = (&'static KernelField, &'static str, usize)> {
        let c_types = self.c_types;
        self.fields
            .iter()
            .zip(c_types)
            .scan(0, |offset, (field, &c_type)| {
                let at = *offset;
                *offset += field.bytes;
                Some((field, c_type, at))
            })
    }

    /// The CUDA declaration, one field per line, then `static_assert`s that its size and
    /// alignment and every field's size are those of the Rust struct. The fields are declared in
    /// Rust's order and their sizes add up to the struct's (`ArgsStruct::of` checks it), so
    /// neither side has padding and every field's offset is the same on both (NVRTC has no
    /// `offsetof` to assert it directly).
    pub fn declaration(&self) -> String {
        let name = self.name;
        let mut text = format!("struct {name} {{\n");
        for (field, c_type, _) in self.layout() {
            // Writing to a String cannot fail.
            let _ = writeln!(text, "    {c_type} {};", field.name);
        }
        text.push_str("};\n");
        let _ = writeln!(
            text,
            "static_assert(sizeof({name}) == {bytes} && alignof({name}) == {align}, \"{name}: {bytes} bytes aligned to {align}, as in Rust\");",
            bytes = self.bytes,
            align = self.align,
        );
        for (field, _, offset) in self.layout() {
            let (f, bytes) = (field.name, field.bytes);
            let _ = writeln!(
                text,
                "static_assert(sizeof({name}::{f}) == {bytes}, \"{name}::{f}: {bytes} bytes at {offset}, as in Rust\");"
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use specula_backend_api::abi;

    use super::*;

    cuda_args! {
        /// A test struct.
        struct DemoArgs {
            data: u64 as "const SPECULA_T::raw*", // [rows, vocab]
            out: u64 as "i32*",
            first: u64,
            rows: u32,
            vocab: u32,
        }
    }

    #[test]
    fn pointers_take_their_cuda_type_and_scalars_their_rust_type() {
        let args = ArgsStruct::of::<DemoArgs>();
        assert_eq!(
            args.c_types,
            ["const SPECULA_T::raw*", "i32*", "u64", "u32", "u32"]
        );
        assert_eq!((args.bytes, args.align), (32, 8));
        let offsets: Vec<(&str, usize)> = args.layout().map(|(f, _, at)| (f.name, at)).collect();
        assert_eq!(
            offsets,
            [
                ("data", 0),
                ("out", 8),
                ("first", 16),
                ("rows", 24),
                ("vocab", 28)
            ]
        );
    }

    #[test]
    fn the_declaration_reads_back_as_the_rust_struct() {
        let text = ArgsStruct::of::<DemoArgs>().declaration();
        assert!(text.starts_with(
            "struct DemoArgs {\n    const SPECULA_T::raw* data;\n    i32* out;\n    u64 first;\n"
        ));
        assert_eq!(abi::check_c_struct::<DemoArgs>(&text), Ok(()));
        assert!(text.contains("static_assert(sizeof(DemoArgs) == 32 && alignof(DemoArgs) == 8, "));
        assert!(text.contains(
            "static_assert(sizeof(DemoArgs::rows) == 4, \"DemoArgs::rows: 4 bytes at 24, as in Rust\");"
        ));
    }
}
