//! NVRTC, loaded dynamically: probing, target selection, and compilation with the log kept.
//!
//! cudarc's safe `compile_ptx_with_opts` drops the log of a successful compile (so warnings
//! cannot be seen) and returns PTX only, so this module drives NVRTC through cudarc's `result` and
//! `sys` layers: it returns the log on success and failure, and a CUBIN when the target is a real
//! architecture (`sm_90`), which the driver loads without a JIT step and without requiring a driver
//! as new as NVRTC's PTX version.

use std::ffi::{CString, c_char};

use cudarc::nvrtc::{result, sys};

use crate::error::CudaError;

/// What NVRTC produced.
#[derive(Clone, Debug)]
pub enum Image {
    /// Machine code for a real architecture (`sm_XY`).
    Cubin(Vec<u8>),
    /// PTX text for a virtual architecture (`compute_XY`), NUL-terminated.
    Ptx(Vec<u8>),
}

/// A successful compile: the image, the PTX (always available) and the compiler's log.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// What the driver loads.
    pub image: Image,
    /// The PTX of the program (for `ptxas -v` in the compile check).
    pub ptx: Vec<u8>,
    /// NVRTC's log (empty for a clean compile).
    pub log: String,
}

/// The NVRTC symbols this crate calls; all exist since CUDA 11.2.
const REQUIRED_SYMBOLS: [&str; 12] = [
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
];

/// Checks that libnvrtc can be loaded and has every symbol used here; returns its version.
///
/// cudarc panics when the library or a symbol is missing, so this must succeed before any other
/// function of this module is called.
pub fn probe() -> Result<(i32, i32), String> {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "libnvrtc not found (install the CUDA toolkit's NVRTC, e.g. the \
                    nvidia-cuda-nvrtc-cu12 wheel, and put its lib folder on LD_LIBRARY_PATH)"
                .to_owned(),
        );
    }
    // SAFETY: the library is present (checked above), so `culib` does not panic.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: looks a symbol up without calling it.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
        if !found {
            return Err(format!("libnvrtc is too old: it lacks {name}"));
        }
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the symbol exists; both pointers are valid.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// The architectures NVRTC can generate code for, as `major * 10 + minor` (`90` for sm_90).
pub fn supported_archs() -> Result<Vec<i32>, CudaError> {
    let mut n = 0;
    // SAFETY: NVRTC has been probed; the pointer is valid.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| CudaError::nvrtc("nvrtcGetNumSupportedArchs", e))?;
    let mut archs = vec![0i32; usize::try_from(n).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` holds the `n` entries NVRTC writes.
        unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            .result()
            .map_err(|e| CudaError::nvrtc("nvrtcGetSupportedArchs", e))?;
    }
    Ok(archs)
}

/// The target to build for a device of compute capability `cc` (`major * 10 + minor`): its own
/// `sm_XY` (a CUBIN) when NVRTC supports it, else the newest older virtual architecture
/// `compute_XY` (PTX the driver compiles), else `None`.
pub fn target_for(cc: i32, supported: &[i32]) -> Option<String> {
    if supported.contains(&cc) {
        return Some(format!("sm_{cc}"));
    }
    supported
        .iter()
        .copied()
        .filter(|&a| a <= cc)
        .max()
        .map(|a| format!("compute_{a}"))
}

/// Owns an `nvrtcProgram` and destroys it on drop.
struct Program {
    prog: sys::nvrtcProgram,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed only here. A failure leaks the program.
        let _ = unsafe { result::destroy_program(self.prog) };
    }
}

fn c_buffer_to_string(buffer: &[c_char]) -> String {
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

/// Compiles `source` (named `name` in the log) with `options`; a CUBIN is extracted when the
/// options target a real architecture (`--gpu-architecture=sm_XY`).
///
/// Errors carry the log: [`CudaError::Compile`] for a program that does not compile.
pub fn compile(source: &str, name: &str, options: &[String]) -> Result<Compiled, CudaError> {
    let src = CString::new(source).map_err(|_| CudaError::Compile {
        kernel: name.to_owned(),
        log: "the source contains a NUL byte".to_owned(),
    })?;
    let c_name = CString::new(name).map_err(|_| CudaError::Compile {
        kernel: name.to_owned(),
        log: "the name contains a NUL byte".to_owned(),
    })?;
    for option in options {
        if option.contains('\0') {
            return Err(CudaError::Compile {
                kernel: name.to_owned(),
                log: format!("option {option:?} contains a NUL byte"),
            });
        }
    }
    let prog = Program {
        prog: result::create_program(&src, Some(&c_name))
            .map_err(|e| CudaError::nvrtc("nvrtcCreateProgram", e))?,
    };
    // SAFETY: `prog` is a live program; options contain no NUL (checked above).
    let compiled = unsafe { result::compile_program(prog.prog, options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog.prog) }
        .map(|l| c_buffer_to_string(&l))
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(CudaError::Compile {
            kernel: name.to_owned(),
            log: if log.is_empty() {
                format!("{e:?}")
            } else {
                log
            },
        });
    }
    // SAFETY: the program compiled.
    let ptx: Vec<u8> = unsafe { result::get_ptx(prog.prog) }
        .map_err(|e| CudaError::nvrtc("nvrtcGetPTX", e))?
        .into_iter()
        .map(|c| c as u8)
        .collect();
    let real_arch = options
        .iter()
        .any(|o| o.starts_with("--gpu-architecture=sm_"));
    let image = if real_arch {
        let mut size = 0usize;
        // SAFETY: the program compiled for a real architecture, so it has a CUBIN.
        unsafe { sys::nvrtcGetCUBINSize(prog.prog, &mut size) }
            .result()
            .map_err(|e| CudaError::nvrtc("nvrtcGetCUBINSize", e))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC writes.
        unsafe { sys::nvrtcGetCUBIN(prog.prog, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()
            .map_err(|e| CudaError::nvrtc("nvrtcGetCUBIN", e))?;
        Image::Cubin(cubin)
    } else {
        Image::Ptx(ptx.clone())
    };
    Ok(Compiled { image, ptx, log })
}

/// The PTX of a compile as text (without the trailing NUL).
pub fn ptx_text(ptx: &[u8]) -> String {
    let end = ptx.iter().position(|&b| b == 0).unwrap_or(ptx.len());
    String::from_utf8_lossy(&ptx[..end]).into_owned()
}

/// Whether an NVRTC log reports a warning (the compile check treats that as a failure).
pub fn log_has_warning(log: &str) -> bool {
    log.to_ascii_lowercase().contains("warning")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_prefer_the_device_architecture() {
        let supported = [75, 80, 86, 87, 89, 90, 100, 120];
        assert_eq!(target_for(90, &supported).as_deref(), Some("sm_90"));
        assert_eq!(target_for(80, &supported).as_deref(), Some("sm_80"));
        // A device newer than NVRTC knows of: PTX for the newest older virtual architecture.
        assert_eq!(target_for(121, &supported).as_deref(), Some("compute_120"));
        assert_eq!(target_for(88, &supported).as_deref(), Some("compute_87"));
        assert_eq!(target_for(70, &supported), None);
    }

    #[test]
    fn warnings_are_detected_in_logs() {
        assert!(log_has_warning(
            "argmax.cu(12): Warning: variable \"x\" was declared but never referenced"
        ));
        assert!(!log_has_warning(""));
    }

    #[test]
    fn ptx_text_stops_at_nul() {
        assert_eq!(ptx_text(b".version 8.8\0junk"), ".version 8.8");
    }
}
