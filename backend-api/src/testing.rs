//! Test support for the backend crates (feature `testing`): a test that needs a device, a driver or
//! a tool is **ignored with its reason** when that is absent — never passed silently — and
//! **fails** when the environment variable [`REQUIRE_VAR`] names it (the CI lanes that must have
//! the device).
//!
//! A test file declares `harness = false` and hands its tests to [`run`], usually listed with
//! [`named_tests!`](crate::named_tests), which names each test after its function:
//!
//! ```no_run
//! use specula_backend_api::named_tests;
//! use specula_backend_api::testing::{self, Needs};
//! fn reads_large_rows() -> Result<(), String> {
//!     Ok(())
//! }
//! fn main() -> std::process::ExitCode {
//!     let needs = Needs::new("wgpu", Err("no adapter".to_owned()));
//!     testing::run(&needs, named_tests![reads_large_rows])
//! }
//! ```

use std::process::ExitCode;

use libtest_mimic::{Arguments, Failed, Trial};

/// Lists what must be available (`SPECULA_REQUIRE=cpu,wgpu,xpu-sim`, or `all`).
pub const REQUIRE_VAR: &str = "SPECULA_REQUIRE";

/// Whether [`REQUIRE_VAR`] names `requirement` (or is `all`).
pub fn required(requirement: &str) -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|list| {
        list.split(',')
            .map(str::trim)
            .any(|name| name.eq_ignore_ascii_case(requirement) || name.eq_ignore_ascii_case("all"))
    })
}

/// What a group of tests needs: a name (as in [`REQUIRE_VAR`]) and whether it is there.
#[derive(Clone, Debug)]
pub struct Needs {
    name: String,
    availability: Result<(), String>,
}

impl Needs {
    /// `availability` is `Err(reason)` when `name` is absent.
    pub fn new(name: impl Into<String>, availability: Result<(), String>) -> Self {
        Needs {
            name: name.into(),
            availability,
        }
    }

    /// What tests of device `name` need, from an attempt to open it: missing (with the reason)
    /// when it failed with [`Error::Unavailable`](crate::Error::Unavailable). Any other error is
    /// not a missing device: the tests run and report it.
    pub fn of_open<T>(name: impl Into<String>, opened: &crate::Result<T>) -> Self {
        let availability = match opened {
            Err(crate::Error::Unavailable { reason, .. }) => Err(reason.clone()),
            Ok(_) | Err(_) => Ok(()),
        };
        Needs::new(name, availability)
    }

    /// Why the tests cannot run, if they cannot.
    pub fn missing(&self) -> Option<&str> {
        self.availability.as_ref().err().map(String::as_str)
    }
}

/// A test body: `Err(message)` fails it (panics fail it too).
pub type TestFn = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// The test list of [`run`], each test named after its function, so a name cannot drift from
/// what it runs: `named_tests![a, b]` is `vec![("a", a), ("b", b)]` with each function boxed as a
/// [`TestFn`]; `named_tests![wrap => a, b]` hands each function to `wrap`, which returns the
/// [`TestFn`] (a test written as a plain `fn()` that panics, say).
///
/// ```
/// use specula_backend_api::named_tests;
/// use specula_backend_api::testing::TestFn;
/// fn reads_large_rows() -> Result<(), String> {
///     Ok(())
/// }
/// let tests: Vec<(&str, TestFn)> = named_tests![reads_large_rows];
/// assert_eq!(tests[0].0, "reads_large_rows");
/// ```
#[macro_export]
macro_rules! named_tests {
    ($wrap:path => $($test:ident),+ $(,)?) => {
        ::std::vec![$((::std::stringify!($test), $wrap($test))),+]
    };
    ($($test:ident),+ $(,)?) => {
        ::std::vec![$((
            ::std::stringify!($test),
            ::std::boxed::Box::new($test) as $crate::testing::TestFn,
        )),+]
    };
}

/// Runs `tests` with libtest's command line (filters, `--ignored`, ...). When `needs` is missing,
/// every test is listed as ignored with the reason in its name — and fails instead when
/// [`REQUIRE_VAR`] names it, or when it is forced to run with `--include-ignored`.
pub fn run(needs: &Needs, tests: Vec<(&str, TestFn)>) -> ExitCode {
    let args = Arguments::from_args();
    let trials = tests
        .into_iter()
        .map(|(name, body)| trial(needs, name, body))
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

fn trial(needs: &Needs, name: &str, body: TestFn) -> Trial {
    let Some(reason) = needs.missing() else {
        return Trial::test(name, move || body().map_err(Failed::from));
    };
    let message = format!("{} unavailable: {reason}", needs.name);
    if required(&needs.name) {
        let message = format!("{message} ({REQUIRE_VAR} requires it)");
        return Trial::test(name, move || Err(Failed::from(message)));
    }
    Trial::test(format!("[skipped: {message}] {name}"), move || {
        Err(Failed::from(message))
    })
    .with_ignored_flag(true)
}

/// The first op calls of a warm-up test: `argmax` over two bf16 rows and `top_k_top_p_sample`
/// over two f32 logits rows, then a synchronize. A backend's test compares the kernels it builds
/// on a cold device and after `warm_up`.
pub fn first_sampling_ops(device: &dyn crate::Device) -> crate::Result<()> {
    use crate::ops::{RowShape, SampleInputs, SampleParams, Scores};
    use crate::{DType, DeviceExt};
    let shape = RowShape { rows: 2, vocab: 5 };
    let values = [0.5f32, 2.0, -1.0, 0.0, 1.5, 3.0, 1.0, 1.0, -2.0, 0.25];
    // bf16 is the high half of an f32 (these values are exact in it).
    let bf16: Vec<u8> = values
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let input = device.upload_bytes(DType::BF16, &bf16)?;
    let mut ids = device.alloc::<i32>(shape.rows)?;
    device.argmax(&input, &mut ids, &shape)?;
    let logits = device.upload(&values)?;
    let temperature = device.upload(&[0.7f32, 1.0])?;
    let top_k = device.upload(&[0i32, 3])?;
    let top_p = device.upload(&[1.0f32, 0.9])?;
    let seed = device.upload(&[1u64, 2])?;
    let inputs = SampleInputs::new(Scores::logits(&logits, &temperature), &top_k, &top_p, &seed);
    let mut tokens = device.alloc::<i32>(shape.rows)?;
    let params = SampleParams::new(shape);
    device.top_k_top_p_sample(&inputs, &mut tokens, &params)?;
    device.synchronize()
}
