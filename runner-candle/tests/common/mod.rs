//! Shared by the runner's tests: the model file (loaded once per test binary), the prompts, and
//! a trial runner that lists a test as skipped **with the reason** when what it needs is absent
//! — the model file, or a Specula backend — and fails it instead when CI requires it:
//! `SPECULA_REQUIRE_MODEL=1` for the model (`.ci/run` fetches it first), `SPECULA_REQUIRE` naming
//! the backend (`specula_backend_api::testing`).

#![allow(dead_code)] // each test binary uses part of it

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use libtest_mimic::{Arguments, Failed, Trial};
use specula_backend_api::Device;
use specula_runner_candle::{Model, fetch};
use specula_sampler::registry;

/// Makes a missing model file a failure instead of a skip.
pub const REQUIRE_MODEL_VAR: &str = "SPECULA_REQUIRE_MODEL";

/// A test's result: `Err(message)` fails it.
pub type TestResult = Result<(), String>;

/// What a trial needs, and whether it is there.
#[derive(Clone, Debug)]
pub struct Need {
    name: String,
    missing: Option<String>,
    required: bool,
}

/// The model file: present, or why not.
pub fn model_need() -> Need {
    let missing = match fetch::default_model_path() {
        Ok(path) if path.is_file() => None,
        Ok(path) => Some(format!(
            "the model file {} is absent (`bash ci/fetch-model.sh` fetches it)",
            path.display()
        )),
        Err(e) => Some(e.to_string()),
    };
    Need {
        name: "model".into(),
        missing,
        required: std::env::var(REQUIRE_MODEL_VAR).is_ok_and(|v| v == "1"),
    }
}

/// A Specula backend by registry name: present, or why not.
pub fn backend_need(name: &str) -> Need {
    Need {
        name: name.into(),
        missing: registry::open(name).err().map(|e| e.to_string()),
        required: specula_backend_api::testing::required(name),
    }
}

/// A trial that runs `body` when every need is there, is listed as ignored with the reason when
/// one is missing, and fails when a missing one is required.
pub fn trial(
    name: &str,
    needs: &[&Need],
    body: impl FnOnce() -> TestResult + Send + 'static,
) -> Trial {
    let Some(need) = needs.iter().find(|n| n.missing.is_some()) else {
        return Trial::test(name, move || body().map_err(Failed::from));
    };
    let message = format!(
        "{} unavailable: {}",
        need.name,
        need.missing.as_deref().unwrap_or_default()
    );
    if need.required {
        return Trial::test(name, move || {
            Err(Failed::from(format!("{message} (required in this run)")))
        });
    }
    eprintln!("skipped {name}: {message}");
    Trial::test(format!("[skipped: {message}] {name}"), move || {
        Err(Failed::from(message))
    })
    .with_ignored_flag(true)
}

/// Runs the trials one at a time (the forward pass uses every core) unless told otherwise.
pub fn run(trials: Vec<Trial>) -> ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    libtest_mimic::run(&args, trials).exit_code()
}

/// The model, loaded once per test binary.
pub fn model() -> Result<&'static Model, String> {
    static MODEL: OnceLock<Result<Model, String>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = fetch::default_model_path().map_err(|e| e.to_string())?;
            Model::load(&path).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens a Specula backend.
pub fn open(name: &str) -> Result<Arc<dyn Device>, String> {
    registry::open(name).map_err(|e| format!("opening {name}: {e}"))
}

/// The six prompts of the tests, `(chat, text)`: plain text and chat, one (the last) asking the
/// model to repeat a passage, which greedy decoding copies, so n-gram drafts get accepted.
pub const PROMPTS: [(bool, &str); 6] = [
    (false, "The capital of France is"),
    (
        false,
        "Once upon a time, in a small village by the sea, there lived",
    ),
    (
        false,
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    ),
    (true, "What is the tallest mountain in the world?"),
    (true, "Write a short poem about autumn leaves."),
    (
        true,
        "Repeat exactly: The quick brown fox jumps over the lazy dog near the river bank. \
         The quick brown fox jumps over the lazy dog near the river bank.",
    ),
];
