//! Case files: a case saved and loaded is the same case and gives identical outputs; `specula
//! replay` / `specula dump` round-trip; malformed files and bad arguments get a clear one-line
//! error and a non-zero exit, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;
#[path = "common/process.rs"]
mod process;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::verify_case;
use process::{assert_clean_error, specula, stderr, stdout};
use specula_backend_api::Op;
use specula_backend_cpu::CpuDevice;
use specula_conformance::cases::Case;
use specula_conformance::cases::run_case;
use specula_conformance::cases::{self, Size, argmax, softmax};
use specula_conformance::replay;
use specula_conformance::tensor::HostTensor;

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("specula-replay-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn softmax_case() -> Case {
    let logits: Vec<half::bf16> = (0..21)
        .map(|i| half::bf16::from_f32(i as f32 * 0.37 - 3.0))
        .collect();
    Case::new("hand::bf16::3x7", softmax::Params { rows: 3, vocab: 7 })
        .with("logits", HostTensor::new(&[3, 7], &logits))
        .with("temperature", HostTensor::vector(&[1.0f32, 0.5, 2.0]))
}

/// The hand-written cases, plus the first two generated cases of every op.
fn sample_cases() -> Vec<Case> {
    let mut all = vec![verify_case(), softmax_case()];
    for op in Op::ALL {
        all.extend(cases::cases(op, Size::Quick).into_iter().take(2));
    }
    all
}

#[test]
fn saved_cases_load_identical_and_give_identical_outputs() {
    let cpu = CpuDevice::new().unwrap();
    for case in sample_cases() {
        let path = tmp(&format!(
            "{}-{}.safetensors",
            case.op(),
            case.name.replace("::", "-")
        ));
        replay::save(&path, &case).unwrap();
        let loaded = replay::load(&path).unwrap();
        assert_eq!(loaded, case, "{}::{}", case.op(), case.name);
        let original = run_case(&cpu, &case);
        let replayed = run_case(&cpu, &loaded);
        match (original, replayed) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.tensors, b.tensors, "{}", case.name);
                assert!(a.guard_violations.is_empty() && b.guard_violations.is_empty());
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("{}: {a:?} vs {b:?}", case.name),
        }
    }
}

#[test]
fn golden_outputs_round_trip_as_expected_tensors() {
    let case = Case::new("golden::f32::1x3", argmax::Params { rows: 1, vocab: 3 })
        .with("input", HostTensor::new(&[1, 3], &[0.0f32, 2.0, 1.0]))
        .expect("out", HostTensor::vector(&[1i32]));
    let bytes = replay::to_bytes(&case).unwrap();
    let raw = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = raw.names();
    names.sort();
    assert_eq!(names, ["expected.out", "input"]);
    assert_eq!(replay::from_bytes(&bytes, "golden").unwrap(), case);
}

#[test]
fn replay_command_round_trip() {
    let case = verify_case();
    let input = tmp("replay-in.safetensors");
    let out = tmp("replay-out.safetensors");
    replay::save(&input, &case).unwrap();
    let run = specula(&[
        "replay",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let text = stdout(&run);
    assert_eq!(run.status.code(), Some(0), "{text}\n{}", stderr(&run));
    assert!(
        text.contains("cpu") && text.contains("passed") && text.contains("PASS"),
        "{text}"
    );

    // The output file is itself a case file: the inputs, the CPU's outputs as `expected.*`, and
    // each backend's outputs as `output.<backend>.*`, identical to a direct run.
    let direct = run_case(&CpuDevice::new().unwrap(), &case).unwrap().tensors;
    let loaded = replay::load(&out).unwrap();
    assert_eq!(loaded.inputs, case.inputs);
    assert_eq!(loaded.expected.as_ref(), Some(&direct));
    let bytes = std::fs::read(&out).unwrap();
    let raw = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, tensor) in &direct {
        let view = raw.tensor(&format!("output.cpu.{name}")).unwrap();
        assert_eq!(view.data(), tensor.bytes.as_slice(), "{name}");
        assert_eq!(view.shape(), tensor.shape.as_slice(), "{name}");
    }
    // Replaying the output file checks the backends against those golden outputs.
    let again = specula(&["replay", out.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
    assert!(stdout(&again).contains("golden"), "{}", stdout(&again));
}

#[test]
fn dump_command_saves_a_generated_case() {
    let unknown = specula(&[
        "dump",
        "--op",
        "argmax",
        "--case",
        "no-such-case",
        "--out",
        "/dev/null",
    ]);
    assert_clean_error(&unknown, &["has no case named `no-such-case`"]);
    for op in [Op::Argmax, Op::VerifyDraftTokens] {
        let Some(case) = cases::cases(op, Size::Quick).into_iter().next() else {
            continue;
        };
        let path = tmp(&format!("dump-{op}.safetensors"));
        let dump = specula(&[
            "dump",
            "--op",
            op.name(),
            "--case",
            &case.name,
            "--out",
            path.to_str().unwrap(),
        ]);
        assert_eq!(dump.status.code(), Some(0), "{}", stderr(&dump));
        assert_eq!(replay::load(&path).unwrap(), case);
        let replayed = specula(&["replay", path.to_str().unwrap()]);
        assert_eq!(replayed.status.code(), Some(0), "{}", stdout(&replayed));
    }
}

fn write_safetensors(
    path: &Path,
    metadata: Option<HashMap<String, String>>,
    dtype: safetensors::Dtype,
) {
    let data = vec![0u8; 2 * dtype.bitsize() / 8];
    let view = safetensors::tensor::TensorView::new(dtype, vec![2], &data).unwrap();
    safetensors::serialize_to_file([("input", view)], metadata, path).unwrap();
}

fn header(json: &str) -> Option<HashMap<String, String>> {
    Some(HashMap::from([("specula".to_owned(), json.to_owned())]))
}

/// Writes a file to the path it is given.
type Writer = Box<dyn Fn(&Path)>;

/// A writer of a two-element f32 `input` under the case header `json` (none: no Specula header).
fn f32_input_under(json: Option<String>) -> Writer {
    Box::new(move |p| {
        write_safetensors(p, json.as_deref().and_then(header), safetensors::Dtype::F32)
    })
}

#[test]
fn malformed_files_give_clear_errors() {
    let argmax = r#"{"format":"specula-case","version":1,"name":"x","params":{"op":"argmax","rows":1,"vocab":2}}"#;
    let cases: Vec<(&str, Writer, &str)> = vec![
        (
            "not-safetensors",
            Box::new(|p| std::fs::write(p, b"hello, world").unwrap()),
            "not a safetensors file",
        ),
        (
            "truncated",
            Box::new(|p| {
                let bytes = replay::to_bytes(&verify_case()).unwrap();
                std::fs::write(p, &bytes[..bytes.len() - 3]).unwrap();
            }),
            "not a safetensors file",
        ),
        (
            "no-header",
            f32_input_under(None),
            "not a Specula case file",
        ),
        (
            "header-not-json",
            f32_input_under(Some("{oops".to_owned())),
            "case header is not JSON",
        ),
        (
            "wrong-version",
            f32_input_under(Some(argmax.replace("\"version\":1", "\"version\":99"))),
            "case file version 99",
        ),
        (
            "unknown-op",
            f32_input_under(Some(argmax.replace("argmax", "frobnicate"))),
            "bad case header",
        ),
        (
            "f64-tensor",
            Box::new(|p| write_safetensors(p, header(argmax), safetensors::Dtype::F64)),
            "has dtype F64",
        ),
    ];
    for (name, write, needle) in cases {
        let path = tmp(&format!("malformed-{name}.safetensors"));
        write(&path);
        let error = replay::load(&path).expect_err(name).to_string();
        assert!(
            error.contains(needle),
            "{name}: `{needle}` not in `{error}`"
        );
        assert!(
            error.contains(path.to_str().unwrap()),
            "{name}: the error names the file: {error}"
        );
        assert_clean_error(&specula(&["replay", path.to_str().unwrap()]), &[needle]);
    }
    // Well-formed file, but an input the op needs is missing.
    let path = tmp("malformed-missing-input.safetensors");
    write_safetensors(&path, header(argmax), safetensors::Dtype::F32);
    let mut case = replay::load(&path).unwrap();
    case.inputs
        .insert("wrong_name".to_owned(), case.inputs["input"].clone());
    case.inputs.remove("input");
    replay::save(&path, &case).unwrap();
    assert_clean_error(
        &specula(&["replay", path.to_str().unwrap()]),
        &["tensor `input` is missing"],
    );
}

#[test]
fn bad_arguments_give_clear_errors() {
    assert_clean_error(
        &specula(&["replay", "/no/such/file.safetensors"]),
        &["/no/such/file.safetensors"],
    );
    assert_clean_error(
        &specula(&["run", "--backend", "tpu"]),
        &["unknown backend `tpu`"],
    );
    assert_clean_error(
        &specula(&["run", "--op", "frobnicate"]),
        &["unknown op `frobnicate`"],
    );
    assert_clean_error(&specula(&["run", "--bogus-flag"]), &["--bogus-flag"]);
    assert_clean_error(
        &specula(&["dump", "--op", "nope", "--case", "x", "--out", "y"]),
        &["unknown op `nope`"],
    );
    assert_clean_error(&specula(&["frob"]), &["frob"]);
    // A backend named explicitly must be there: no silent fallback.
    for kind in ["wgpu", "xpu-sim", "cuda"] {
        if !specula_sampler::registry::is_compiled(kind.parse().unwrap()) {
            assert_clean_error(
                &specula(&["run", "--backend", kind, "--quick"]),
                &["unavailable"],
            );
        }
    }
}

#[test]
fn specula_require_turns_a_skip_into_a_failure() {
    let run = |require: &str| {
        Command::new(env!("CARGO_BIN_EXE_specula"))
            .args(["run", "--quick", "--op", "argmax", "--filter", "golden"])
            .env("SPECULA_REQUIRE", require)
            .output()
            .unwrap()
    };
    let ok = run("cpu");
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    assert!(stdout(&ok).contains("PASS"), "{}", stdout(&ok));
    assert_clean_error(&run("cpu,tpu"), &["SPECULA_REQUIRE: unknown backend `tpu`"]);
    if !specula_sampler::registry::is_compiled("wgpu".parse().unwrap()) {
        let failed = run("wgpu");
        let text = stdout(&failed);
        assert_eq!(failed.status.code(), Some(1), "{text}");
        assert!(
            text.contains("wgpu is required (SPECULA_REQUIRE) but unavailable"),
            "{text}"
        );
        assert!(text.contains("FAIL:"), "{text}");
    }
}

/// A replayed layout that host validation rejects (a decode slot with this_time 9 > S 3) is
/// reported as `rejected: …` naming the argument, with exit status 3 — not as a pass.
#[test]
fn an_invalid_layout_is_reported_as_rejected() {
    let mut case = verify_case();
    case.inputs.insert(
        "seq_lens_this_time".to_owned(),
        HostTensor::vector(&[9i32, 1]),
    );
    let path = tmp("invalid_layout.safetensors");
    replay::save(&path, &case).unwrap();
    let o = specula(&["replay", path.to_str().unwrap(), "--backend", "cpu"]);
    let out = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(3),
        "stdout: {out}\nstderr: {}",
        stderr(&o)
    );
    assert!(out.contains("rejected: "), "{out}");
    assert!(out.contains("seq_lens_this_time"), "{out}");
    assert!(!out.contains("PASS"), "{out}");

    // The same file with expected.error passes: every device rejects it that way.
    let expected = "invalid_argument:seq_lens_this_time".parse().unwrap();
    replay::save(&path, &case.rejects(expected)).unwrap();
    let o = specula(&["replay", path.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
}

/// Loading checks every tensor against the op's table and names the tensor: a `seeds` tensor of
/// the wrong dtype does not load (it used to load and then "pass" as a rejected case).
#[test]
fn loading_checks_dtypes_and_element_counts() {
    let path = tmp("wrong-dtype-seeds.safetensors");
    let mut case = verify_case();
    case.inputs.insert(
        "seeds".to_owned(),
        HostTensor::vector(&[1.0f32, 5.0, 9.0, 13.0]),
    );
    replay::save(&path, &case).unwrap();
    let error = replay::load(&path).unwrap_err().to_string();
    assert!(
        error.contains("tensor `seeds` has dtype f32, expected u64"),
        "{error}"
    );
    assert_clean_error(&specula(&["replay", path.to_str().unwrap()]), &["`seeds`"]);

    let mut case = verify_case();
    case.inputs
        .insert("stop_flags".to_owned(), HostTensor::vector(&[0u8, 0, 0]));
    replay::save(&path, &case).unwrap();
    let error = replay::load(&path).unwrap_err().to_string();
    assert!(
        error.contains("tensor `stop_flags` has 3 elements, expected 2"),
        "{error}"
    );

    let mut case = verify_case();
    case.inputs
        .insert("stray".to_owned(), HostTensor::vector(&[0u8]));
    replay::save(&path, &case).unwrap();
    let error = replay::load(&path).unwrap_err().to_string();
    assert!(
        error.contains("tensor `stray` is not an input of verify_draft_tokens"),
        "{error}"
    );
}
