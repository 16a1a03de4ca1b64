//! `specula-generate` as a user meets it: every user error — a missing or corrupt model file, an
//! unknown flag value, a bad sampling value, a prompt longer than the context — is one line on
//! stderr and a non-zero exit, never a panic; and a greedy run streams " Paris" and ends with the
//! summary line. The runs that need the model are listed as skipped, with the reason, when it is
//! absent (a failure under `SPECULA_REQUIRE_MODEL=1`).

mod common;

use std::path::Path;
use std::process::{Command, ExitCode, Output};

use common::{TestResult, model_need, trial};
use specula_runner_candle::fetch;

fn main() -> ExitCode {
    let model = model_need();
    common::run(vec![
        trial(
            "a_missing_model_file_is_one_line",
            &[],
            a_missing_model_file_is_one_line,
        ),
        trial(
            "a_corrupt_model_file_is_one_line",
            &[],
            a_corrupt_model_file_is_one_line,
        ),
        trial(
            "an_unknown_flag_value_is_one_line",
            &[],
            an_unknown_flag_value_is_one_line,
        ),
        trial(
            "a_bad_sampling_value_names_its_flag",
            &[&model],
            a_bad_sampling_value_names_its_flag,
        ),
        trial(
            "a_prompt_longer_than_the_context_is_one_line",
            &[&model],
            a_prompt_longer_than_the_context_is_one_line,
        ),
        trial(
            "greedy_generation_streams_paris_and_a_summary",
            &[&model],
            greedy_generation_streams_paris_and_a_summary,
        ),
    ])
}

fn generate(args: &[&str]) -> Result<Output, String> {
    Command::new(env!("CARGO_BIN_EXE_specula-generate"))
        .args(args)
        .output()
        .map_err(|e| format!("running specula-generate: {e}"))
}

/// The run failed with exactly one line on stderr containing `expected`.
fn fails_with_one_line(output: &Output, expected: &str) -> TestResult {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let ok = !output.status.success()
        && lines.len() == 1
        && lines[0].contains(expected)
        && !stderr.contains("panicked");
    match ok {
        true => Ok(()),
        false => Err(format!(
            "status {}, stderr {stderr:?}: expected one line with {expected:?}",
            output.status
        )),
    }
}

fn model_arg() -> Result<String, String> {
    Ok(fetch::default_model_path()
        .map_err(|e| e.to_string())?
        .display()
        .to_string())
}

fn a_missing_model_file_is_one_line() -> TestResult {
    let output = generate(&["--model", "/nonexistent/model.gguf", "--prompt", "hi"])?;
    fails_with_one_line(&output, "model file /nonexistent/model.gguf not found")
}

fn a_corrupt_model_file_is_one_line() -> TestResult {
    let dir = std::env::temp_dir().join(format!("specula-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let corrupt = dir.join("corrupt.gguf");
    // A GGUF magic and version, then garbage.
    let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
    bytes.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    std::fs::write(&corrupt, &bytes).map_err(|e| e.to_string())?;
    let result = generate(&["--model", &corrupt.display().to_string(), "--prompt", "hi"])
        .and_then(|output| fails_with_one_line(&output, "is not a usable GGUF llama model"));
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let text = dir.join("text.gguf");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(&text, "not a model").map_err(|e| e.to_string())?;
    let result = generate(&["--model", &text.display().to_string(), "--prompt", "hi"])
        .and_then(|output| fails_with_one_line(&output, "is not a usable GGUF llama model"));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn an_unknown_flag_value_is_one_line() -> TestResult {
    fails_with_one_line(
        &generate(&["--backend", "tpu", "--prompt", "hi"])?,
        "invalid value 'tpu' for '--backend",
    )?;
    fails_with_one_line(
        &generate(&["--spec", "medusa", "--prompt", "hi"])?,
        "invalid value 'medusa'",
    )?;
    fails_with_one_line(
        &generate(&["--logit-bias", "12", "--prompt", "hi"])?,
        "is not ID=VALUE",
    )?;
    fails_with_one_line(
        &generate(&["-n", "many", "--prompt", "hi"])?,
        "invalid value 'many'",
    )?;
    fails_with_one_line(&generate(&["--model", "/nonexistent.gguf"])?, "--prompt")
}

fn a_bad_sampling_value_names_its_flag() -> TestResult {
    let model = model_arg()?;
    let run =
        |flag: &str, value: &str| generate(&["--model", &model, "--prompt", "hi", flag, value]);
    fails_with_one_line(&run("--top-p", "1.5")?, "invalid --top-p")?;
    fails_with_one_line(&run("--temp", "-1")?, "invalid --temp")?;
    fails_with_one_line(&run("--min-p", "2")?, "invalid --min-p")?;
    fails_with_one_line(&run("--repeat-penalty", "0")?, "invalid --repeat-penalty")?;
    fails_with_one_line(&run("--logit-bias", "99999999=1")?, "invalid --logit-bias")?;
    fails_with_one_line(&run("-n", "0")?, "invalid -n")
}

fn a_prompt_longer_than_the_context_is_one_line() -> TestResult {
    let model = model_arg()?;
    let long = "word ".repeat(9000);
    fails_with_one_line(
        &generate(&["--model", &model, "--prompt", &long])?,
        "the context holds 8192",
    )
}

fn greedy_generation_streams_paris_and_a_summary() -> TestResult {
    let model = model_arg()?;
    if !Path::new(&model).is_file() {
        return Err(format!("{model} is absent"));
    }
    let output = generate(&[
        "--model",
        &model,
        "--prompt",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
        "--spec",
        "ngram",
    ])?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    let summary = stderr.lines().last().unwrap_or_default();
    if !output.status.success()
        || !stdout.starts_with("The capital of France is Paris.")
        || !summary.contains("4 tokens in")
    {
        return Err(format!(
            "status {}, stdout {stdout:?}, stderr {stderr:?}",
            output.status
        ));
    }
    Ok(())
}
