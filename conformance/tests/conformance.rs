//! The conformance suite under `cargo test`: one named trial per backend × op × case
//! (`cpu::verify_draft_tokens::target_match::bs64_s6`) and per backend × end-to-end property
//! (`cpu::properties::spec_equals_plain::target_match`), run with libtest-mimic, so the usual
//! filters work (`cargo test -p specula-conformance --test conformance -- cpu::argmax`).
//!
//! - Trials of an unavailable backend are ignored, with the reason in the name
//!   (`[skipped: wgpu: not compiled into this build …] wgpu::argmax::…`); forced to run
//!   (`--include-ignored`) they fail with the reason. With `SPECULA_REQUIRE=wgpu` they fail instead.
//! - Quick cases by default; `SPECULA_FULL=1` runs the full-size cases.
//! - After libtest's summary the harness prints the op × backend table with the skip reasons;
//!   `SPECULA_REPORT=FILE` also writes it as JSON.
#![allow(clippy::unwrap_used, missing_docs)]

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};
use specula_conformance::backends;
use specula_conformance::cases::Size;
use specula_conformance::report::{Report, TrialResult};
use specula_conformance::suite::{Outcome, Plan, Suite};

fn config_failure(name: &str, message: String) -> Trial {
    Trial::test(format!("config::{name}"), move || {
        Err(Failed::from(message))
    })
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let size = match std::env::var("SPECULA_FULL").as_deref() {
        Ok("1") => Size::Full,
        _ => Size::Quick,
    };
    let mut trials = Vec::new();
    let required = backends::required_from_env().unwrap_or_else(|e| {
        trials.push(config_failure(backends::REQUIRE_VAR, e.to_string()));
        Default::default()
    });
    let suite = match Suite::new(backends::probe_all(), size) {
        Ok(suite) => Arc::new(suite.with_required(required)),
        Err(e) => {
            trials.push(config_failure(
                "reference",
                format!("cannot open the CPU reference: {e}"),
            ));
            return libtest_mimic::run(&args, trials).exit_code();
        }
    };

    let results: Arc<Mutex<Vec<TrialResult>>> = Arc::default();
    let mut not_run = Vec::new();
    for trial in suite.trials(&Plan::everything()) {
        let skipped = trial.is_skipped();
        let name = trial.display_name();
        let skip_result = skipped.then(|| suite.run_timed(&trial));
        let (suite, results) = (suite.clone(), results.clone());
        let mimic = Trial::test(name, move || {
            let result = suite.run_timed(&trial);
            let outcome = result.outcome.clone();
            results
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(result);
            match outcome {
                Outcome::Passed => Ok(()),
                Outcome::Failed(message) => Err(message.into()),
                Outcome::Skipped(reason) => Err(format!("skipped: {reason}").into()),
            }
        })
        .with_ignored_flag(skipped);
        if let Some(result) = skip_result
            && !args.is_filtered_out(&mimic)
            && args.is_ignored(&mimic)
        {
            not_run.push(result);
        }
        trials.push(mimic);
    }

    let conclusion = libtest_mimic::run(&args, trials);
    if !args.list {
        let mut report = Report::new(&suite.backends, size, &suite.oracle());
        for result in results.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            report.push(result);
        }
        for result in not_run {
            report.push(result);
        }
        println!(
            "\nconformance ({} cases):\n{}",
            report.size,
            report.render_table()
        );
        if let Ok(path) = std::env::var("SPECULA_REPORT")
            && let Err(e) = report.write_json(std::path::Path::new(&path))
        {
            eprintln!("SPECULA_REPORT: {e}");
        }
    }
    conclusion.exit_code()
}
