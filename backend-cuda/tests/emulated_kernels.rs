//! The sampling kernels (`top_k_top_p_sample`, including the cooperative split path,
//! `top_p_candidates`, `argmax`) run on a host emulation of CUDA (`tests/emulator`) and compared
//! with the CPU reference on ordinary, tied and hostile rows, in f32, f16 and bf16, with aligned
//! and misaligned windows. The real kernel sources are compiled with g++; skipped (with a message)
//! when no C++20 compiler is found.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use specula_backend_api::ops::{
    CandidatesInputs, CandidatesOutputs, CandidatesParams, RowShape, SampleInputs, SampleParams,
};
use specula_backend_api::{DType, Device, DeviceExt};
use specula_backend_cpu::CpuDevice;
use specula_backend_cuda::kernels::{COMMON, KernelFile, SELECT, defines};
use specula_backend_cuda::launch;

const SHIM: &str = include_str!("emulator/shim.hpp");
const DRIVER: &str = include_str!("emulator/driver.cpp");

fn compiler() -> Option<&'static str> {
    ["g++", "clang++"].into_iter().find(|c| {
        Command::new(c)
            .args(["-std=c++20", "-x", "c++", "-fsyntax-only", "-"])
            .stdin(std::process::Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Builds the emulator driver for `dtype` once per test process.
fn driver(dtype: DType) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(DType, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().expect("lock");
    if let Some((_, p)) = built.iter().find(|(d, _)| *d == dtype) {
        return p.clone();
    }
    let dir = std::env::temp_dir().join(format!("specula-emulator-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = build_driver(&dir, dtype);
    built.push((dtype, p.clone()));
    p
}

fn build_driver(dir: &Path, dtype: DType) -> PathBuf {
    let tag = match dtype {
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        _ => "F32",
    };
    let mut src: String = defines()
        .into_iter()
        .map(|(n, v)| format!("#define {n} {v}\n"))
        .collect();
    src += &format!(
        "#define SPECULA_T {tag}\n#define SPECULA_D {tag}\n#define SPECULA_SUFFIX {}\n",
        dtype.name()
    );
    src += SHIM;
    src += &COMMON.replace(
        "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));",
        "f = shim_half_to_float(h);",
    );
    src += SELECT;
    for file in [
        KernelFile::TopKTopPSample,
        KernelFile::TopPCandidates,
        KernelFile::Argmax,
        KernelFile::VerifyDraftTokens,
        KernelFile::AcceptLogprobs,
        KernelFile::BuildOutputLayout,
        KernelFile::BuildSamplingParams,
        KernelFile::GatherNextToken,
        KernelFile::UpdateState,
        KernelFile::NgramMatch,
        KernelFile::Softmax,
    ] {
        src += file.body();
    }
    src += DRIVER;
    let cpp = dir.join(format!("driver_{}.cpp", dtype.name()));
    let bin = dir.join(format!("driver_{}", dtype.name()));
    std::fs::write(&cpp, src).expect("write driver");
    let compiler = compiler().expect("checked by the caller");
    let out = Command::new(compiler)
        .args(["-std=c++20", "-O1", "-pthread", "-w", "-o"])
        .arg(&bin)
        .arg(&cpp)
        .output()
        .expect("run the compiler");
    assert!(
        out.status.success(),
        "emulator build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

fn run(bin: &Path, args: &[String]) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("run the driver");
    assert!(
        out.status.success(),
        "driver {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_i32(path: &Path) -> Vec<i32> {
    bytemuck::pod_collect_to_vec(&std::fs::read(path).expect("read output"))
}

fn read_f32(path: &Path) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&std::fs::read(path).expect("read output"))
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Rows of every kind: softmax-like, heavy-tailed, tied, hostile, all-zero, tiny, one-hot.
fn rows(rng: &mut Lcg, count: usize, vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(count * vocab);
    for r in 0..count {
        let kind = r % 8;
        let mut row: Vec<f32> = (0..vocab)
            .map(|_| {
                let u = rng.unit();
                match kind {
                    0 => u * u * u * u,
                    1 => (u * 8.0).floor() / 64.0,
                    2 => {
                        let x = rng.next() % 16;
                        match x {
                            0 => f32::NAN,
                            1 => f32::INFINITY,
                            2 => -0.5,
                            3 => 1.5,
                            4 => -0.0,
                            5 => f32::NEG_INFINITY,
                            _ => u / 50.0,
                        }
                    }
                    3 => 0.0,
                    4 => u * 1e-13,
                    5 => (u * 3.0).floor() * 0.25,
                    6 => u.powi(12),
                    _ => u / vocab as f32,
                }
            })
            .collect();
        if kind == 7 {
            row[(rng.next() as usize) % vocab] = 0.75;
        }
        if kind == 0 {
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= s);
        }
        out.extend(row);
    }
    out
}

fn to_bytes(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F16 => {
            bytemuck::cast_slice(&values.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>())
                .to_vec()
        }
        DType::BF16 => bytemuck::cast_slice(
            &values
                .iter()
                .map(|&v| bf16::from_f32(v))
                .collect::<Vec<_>>(),
        )
        .to_vec(),
        _ => bytemuck::cast_slice(values).to_vec(),
    }
}

struct Case {
    rows: usize,
    vocab: usize,
    probs: Vec<u8>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    seed: Vec<u64>,
}

fn case(rng: &mut Lcg, dtype: DType, rows_n: usize, vocab: usize) -> Case {
    let values = rows(rng, rows_n, vocab);
    let ks = [
        0,
        1,
        2,
        5,
        50,
        -3,
        vocab as i32 - 1,
        vocab as i32,
        vocab as i32 + 7,
        17,
    ];
    let ps = [
        1.0,
        0.9,
        0.5,
        0.1,
        1e-7,
        f32::NAN,
        0.0,
        1.5,
        -1.0,
        0.999,
        0.3,
    ];
    Case {
        rows: rows_n,
        vocab,
        probs: to_bytes(dtype, &values),
        top_k: (0..rows_n)
            .map(|r| ks[(r * 7 + r / 3) % ks.len()])
            .collect(),
        top_p: (0..rows_n)
            .map(|r| ps[(r * 5 + r / 2) % ps.len()])
            .collect(),
        seed: (0..rows_n).map(|_| rng.next()).collect(),
    }
}

fn cpu_sample(cpu: &CpuDevice, dtype: DType, c: &Case) -> Vec<i32> {
    let probs = cpu.upload_bytes(dtype, &c.probs).expect("upload");
    let top_k = cpu.upload(&c.top_k).expect("upload");
    let top_p = cpu.upload(&c.top_p).expect("upload");
    let seed = cpu.upload(&c.seed).expect("upload");
    let mut tokens = cpu.alloc::<i32>(c.rows).expect("alloc");
    cpu.top_k_top_p_sample(
        &SampleInputs {
            probs: &probs,
            top_k: &top_k,
            top_p: &top_p,
            seed: &seed,
        },
        &mut tokens,
        &SampleParams {
            shape: RowShape {
                rows: c.rows,
                vocab: c.vocab,
            },
            host_top_p: None,
        },
    )
    .expect("cpu sample");
    cpu.download(&tokens).expect("download")
}

fn write_case(dir: &Path, c: &Case) {
    std::fs::write(dir.join("probs.bin"), &c.probs).expect("write");
    std::fs::write(dir.join("top_k.bin"), bytemuck::cast_slice(&c.top_k)).expect("write");
    std::fs::write(dir.join("top_p.bin"), bytemuck::cast_slice(&c.top_p)).expect("write");
    std::fs::write(dir.join("seed.bin"), bytemuck::cast_slice(&c.seed)).expect("write");
}

#[test]
#[ignore = "slow (minutes): host emulation of the CUDA kernels; run with --ignored in the CUDA CI lane"]
fn sampling_kernels_match_the_cpu_reference_on_the_host_emulator() {
    if compiler().is_none() {
        eprintln!("skipped: no C++20 compiler for the host emulation of the kernels");
        return;
    }
    let dir = std::env::temp_dir().join(format!("specula-emulated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cpu = CpuDevice::with_threads(1).expect("cpu");
    let mut rng = Lcg(0xC0DA);
    let d = dir.to_string_lossy().into_owned();
    for dtype in DType::FLOATS {
        let bin = driver(dtype);
        // (rows, vocab, window offset in elements, splits)
        let vocab_main = if dtype == DType::F32 { 1000 } else { 999 };
        let split_vocab = 3 * launch::SELECT_CHUNK as usize - 123;
        let shapes: Vec<(usize, usize, usize, u32)> = vec![
            (16, vocab_main, 0, 1),
            (8, 1000, 1, 1),
            (3, 1, 0, 1),
            (4, split_vocab, 0, 3),
            (4, split_vocab, 0, 1),
        ];
        for (rows_n, vocab, offset, splits) in shapes {
            let mut c = case(&mut rng, dtype, rows_n, vocab);
            if vocab == split_vocab {
                // Top-p (mass selection across blocks, with and without top-k), a degenerate
                // all-zero row (first in rank order across blocks), and plain top-k.
                c.top_p = vec![0.9, 0.3, 0.7, 1.0];
                c.top_k = vec![0, 50, 0, 3];
            }
            write_case(&dir, &c);
            let stride = launch::split_row_scratch_bytes(splits);
            run(
                &bin,
                &[
                    "sample".into(),
                    d.clone(),
                    rows_n.to_string(),
                    vocab.to_string(),
                    offset.to_string(),
                    splits.to_string(),
                    stride.to_string(),
                ],
            );
            let got = read_i32(&dir.join("tokens.out"));
            let want = cpu_sample(&cpu, dtype, &c);
            for r in 0..rows_n {
                assert_eq!(
                    got[r], want[r],
                    "{dtype} sample row {r} of {rows_n}x{vocab} (offset {offset}, splits {splits}): top_k {} top_p {}",
                    c.top_k[r], c.top_p[r]
                );
            }

            // argmax on the same rows.
            if splits == 1 {
                run(
                    &bin,
                    &[
                        "argmax".into(),
                        d.clone(),
                        rows_n.to_string(),
                        vocab.to_string(),
                        offset.to_string(),
                    ],
                );
                let got = read_i32(&dir.join("tokens.out"));
                let input = cpu.upload_bytes(dtype, &c.probs).expect("upload");
                let mut out = cpu.alloc::<i32>(rows_n).expect("alloc");
                cpu.argmax(
                    &input,
                    &mut out,
                    &RowShape {
                        rows: rows_n,
                        vocab,
                    },
                )
                .expect("cpu argmax");
                assert_eq!(
                    got,
                    cpu.download::<i32>(&out).expect("download"),
                    "{dtype} argmax {rows_n}x{vocab}"
                );
            }

            // top_p_candidates with a few widths and padding rows.
            if splits == 1 {
                for cands in [1usize, 7, 128] {
                    let batch_id: Vec<i32> = (0..rows_n as i32)
                        .map(|r| if r % 5 == 4 { -1 } else { r })
                        .collect();
                    std::fs::write(dir.join("batch_id.bin"), bytemuck::cast_slice(&batch_id))
                        .expect("write");
                    run(
                        &bin,
                        &[
                            "candidates".into(),
                            d.clone(),
                            rows_n.to_string(),
                            vocab.to_string(),
                            offset.to_string(),
                            cands.to_string(),
                        ],
                    );
                    let probs = cpu.upload_bytes(dtype, &c.probs).expect("upload");
                    let top_p = cpu.upload(&c.top_p).expect("upload");
                    let bid = cpu.upload(&batch_id).expect("upload");
                    let mut ids = cpu.alloc::<i32>(rows_n * cands).expect("alloc");
                    let mut scores = cpu.alloc::<f32>(rows_n * cands).expect("alloc");
                    let mut lens = cpu.alloc::<i32>(rows_n).expect("alloc");
                    cpu.top_p_candidates(
                        &CandidatesInputs {
                            probs: &probs,
                            top_p: &top_p,
                            batch_id_per_token_output: Some(&bid),
                        },
                        &mut CandidatesOutputs {
                            ids: &mut ids,
                            scores: &mut scores,
                            lens: &mut lens,
                        },
                        &CandidatesParams {
                            shape: RowShape {
                                rows: rows_n,
                                vocab,
                            },
                            candidates: cands,
                            host_top_p: None,
                        },
                    )
                    .expect("cpu candidates");
                    let label =
                        format!("{dtype} candidates C={cands} {rows_n}x{vocab} offset {offset}");
                    assert_eq!(
                        read_i32(&dir.join("ids.out")),
                        cpu.download::<i32>(&ids).expect("d"),
                        "{label}: ids"
                    );
                    let want_scores: Vec<u32> = cpu
                        .download::<f32>(&scores)
                        .expect("d")
                        .iter()
                        .map(|x| x.to_bits())
                        .collect();
                    let got_scores: Vec<u32> = read_f32(&dir.join("scores.out"))
                        .iter()
                        .map(|x| x.to_bits())
                        .collect();
                    assert_eq!(got_scores, want_scores, "{label}: scores");
                    assert_eq!(
                        read_i32(&dir.join("lens.out")),
                        cpu.download::<i32>(&lens).expect("d"),
                        "{label}: lens"
                    );
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The output rows of a slot (the layout rule), for building consistent batches.
fn slot_rows(this_time: i32, encoder: i32, s: usize) -> usize {
    if this_time <= 0 {
        0
    } else if encoder > 0 {
        1
    } else {
        (this_time as usize).min(s)
    }
}

fn write<T: bytemuck::Pod>(dir: &Path, name: &str, data: &[T]) {
    std::fs::write(dir.join(name), bytemuck::cast_slice(data)).expect("write");
}

fn peaked_rows(rng: &mut Lcg, count: usize, vocab: usize, hostile: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(count * vocab);
    for r in 0..count {
        let mut row: Vec<f32> = (0..vocab).map(|_| rng.unit().powi(8)).collect();
        for _ in 0..3 {
            row[(rng.next() as usize) % vocab] += 2.0;
        }
        let sum: f32 = row.iter().sum();
        row.iter_mut().for_each(|x| *x /= sum);
        if hostile && r % 4 == 3 {
            row[1] = f32::NAN;
            row[2] = -1.0;
            row[3] = 3.0; // raw total weight ≥ 2^41: not a distribution
        }
        if hostile && r % 7 == 5 {
            row.iter_mut().for_each(|x| *x = 0.0);
        }
        out.extend(row);
    }
    out
}

#[test]
#[ignore = "slow (minutes): host emulation of the CUDA kernels; run with --ignored in the CUDA CI lane"]
fn verify_kernels_match_the_cpu_reference_on_the_host_emulator() {
    use specula_backend_api::ops::*;
    if compiler().is_none() {
        eprintln!("skipped: no C++20 compiler for the host emulation of the kernels");
        return;
    }
    let dir = std::env::temp_dir().join(format!("specula-emulated-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let d = dir.to_string_lossy().into_owned();
    let cpu = CpuDevice::with_threads(1).expect("cpu");
    let mut rng = Lcg(0xBEEF);
    let (max_bsz, real_bsz, s, vocab, cands) = (8usize, 7usize, 4usize, 300usize, 8usize);
    let end_tokens = [7i32, 13];
    for dtype in [DType::F32, DType::BF16] {
        let bin = driver(dtype);
        for trial in 0..12 {
            // Slot kinds: decode of each length, prefill, empty, beyond real_bsz; some hostile.
            let this_time: Vec<i32> = (0..max_bsz)
                .map(|b| match (b + trial) % 8 {
                    0 => 4,
                    1 => 1,
                    2 => 5,
                    3 => 0,
                    4 => 3,
                    5 => 2,
                    6 if trial % 3 == 0 => 9,
                    6 => 4,
                    _ => {
                        if trial % 4 == 0 {
                            -2
                        } else {
                            2
                        }
                    }
                })
                .collect();
            let encoder: Vec<i32> = (0..max_bsz)
                .map(|b| if (b + trial) % 8 == 2 { 5 } else { 0 })
                .collect();
            let mut cu_out = vec![0i32; real_bsz + 1];
            for b in 0..real_bsz {
                cu_out[b + 1] = cu_out[b] + slot_rows(this_time[b], encoder[b], s) as i32;
            }
            let rows = cu_out[real_bsz] as usize;
            if trial == 11 {
                cu_out[2] = -5; // hostile layout: rows outside the buffers
                cu_out[4] = 1000;
            }
            let stop_flags: Vec<u8> = (0..max_bsz)
                .map(|b| u8::from(trial % 5 == 1 && b == 4))
                .collect();
            let is_block: Vec<u8> = (0..max_bsz)
                .map(|b| u8::from(trial % 5 == 2 && b == 0))
                .collect();
            let reasoning: Vec<i32> = (0..max_bsz)
                .map(|b| i32::from(trial % 3 == 1 && b == 5))
                .collect();
            let step_idx: Vec<i32> = (0..max_bsz).map(|_| (rng.next() % 12) as i32 - 1).collect();
            let max_dec_len: Vec<i32> = (0..max_bsz)
                .map(|b| if b % 3 == 0 { step_idx[b] + 2 } else { 100 })
                .collect();
            let seeds: Vec<u64> = (0..rows).map(|_| rng.next()).collect();
            let target = peaked_rows(&mut rng, rows, vocab, trial % 2 == 1);
            let draft = peaked_rows(&mut rng, max_bsz * (s - 1), vocab, trial % 4 == 3);
            let top_k: Vec<i32> = (0..rows).map(|r| [0, 3, 50, -1][r % 4]).collect();
            let top_p: Vec<f32> = (0..rows)
                .map(|r| [1.0, 0.8, 0.3, f32::NAN][(r + trial) % 4])
                .collect();
            let target_buf = cpu
                .upload_bytes(dtype, &to_bytes(dtype, &target))
                .expect("u");
            let draft_buf = cpu
                .upload_bytes(dtype, &to_bytes(dtype, &draft))
                .expect("u");
            // Strategy inputs from the CPU: argmax, samples and candidates of the target rows.
            let shape = RowShape { rows, vocab };
            let mut greedy = cpu.alloc::<i32>(rows).expect("a");
            cpu.argmax(&target_buf, &mut greedy, &shape)
                .expect("argmax");
            let greedy = cpu.download::<i32>(&greedy).expect("d");
            let (tk, tp, sd) = (
                cpu.upload(&top_k).expect("u"),
                cpu.upload(&top_p).expect("u"),
                cpu.upload(&seeds).expect("u"),
            );
            let mut sampled = cpu.alloc::<i32>(rows).expect("a");
            cpu.top_k_top_p_sample(
                &SampleInputs {
                    probs: &target_buf,
                    top_k: &tk,
                    top_p: &tp,
                    seed: &sd,
                },
                &mut sampled,
                &SampleParams {
                    shape,
                    host_top_p: None,
                },
            )
            .expect("sample");
            let sampled = cpu.download::<i32>(&sampled).expect("d");
            let mut ids = cpu.alloc::<i32>(rows * cands).expect("a");
            let mut scores = cpu.alloc::<f32>(rows * cands).expect("a");
            let mut lens = cpu.alloc::<i32>(rows).expect("a");
            cpu.top_p_candidates(
                &CandidatesInputs {
                    probs: &target_buf,
                    top_p: &tp,
                    batch_id_per_token_output: None,
                },
                &mut CandidatesOutputs {
                    ids: &mut ids,
                    scores: &mut scores,
                    lens: &mut lens,
                },
                &CandidatesParams {
                    shape,
                    candidates: cands,
                    host_top_p: None,
                },
            )
            .expect("candidates");
            let mut cand_ids = cpu.download::<i32>(&ids).expect("d");
            let cand_scores = cpu.download::<f32>(&scores).expect("d");
            let mut cand_lens = cpu.download::<i32>(&lens).expect("d");
            if trial % 6 == 5 {
                // Candidates a caller made itself: garbage lengths and ids.
                cand_lens
                    .iter_mut()
                    .enumerate()
                    .for_each(|(r, l)| *l = [-3, 0, 99, 2][r % 4]);
                cand_ids.iter_mut().step_by(5).for_each(|x| *x = -4);
            }
            // Drafts: mostly the target's choice (so runs of acceptances happen), some garbage.
            let mut draft_tokens = vec![0i32; max_bsz * s];
            for b in 0..max_bsz {
                for i in 0..s {
                    let row = cu_out.get(b).map_or(0, |&c| c.max(0) as usize) + i.saturating_sub(1);
                    draft_tokens[b * s + i] = match rng.next() % 10 {
                        0 => -1,
                        1 => vocab as i32 + 3,
                        2 => end_tokens[0],
                        3..=5 => (rng.next() % vocab as u64) as i32,
                        _ => *sampled.get(row).unwrap_or(&0),
                    };
                }
            }
            for (strategy_code, strategy) in [
                (0u32, Strategy::Greedy),
                (1, Strategy::TargetMatch),
                (2, Strategy::TopP),
                (3, Strategy::Rejection),
            ] {
                let (accept_all, reject_all) = match trial % 6 {
                    3 => (true, false),
                    4 => (false, true),
                    0 if strategy_code == 3 => (true, true),
                    _ => (false, false),
                };
                for (name, data) in [
                    ("draft_tokens.bin", &draft_tokens),
                    ("this_time.bin", &this_time),
                    ("encoder.bin", &encoder),
                    ("cu_out.bin", &cu_out),
                    ("reasoning.bin", &reasoning),
                    ("step_idx.bin", &step_idx),
                    ("max_dec_len.bin", &max_dec_len),
                    ("top_k.bin", &top_k),
                    ("cand_ids.bin", &cand_ids),
                    ("cand_lens.bin", &cand_lens),
                ] {
                    write(&dir, name, data);
                }
                write(&dir, "end_tokens.bin", &end_tokens);
                write(&dir, "stop_flags.bin", &stop_flags);
                write(&dir, "is_block_step.bin", &is_block);
                write(&dir, "seeds.bin", &seeds);
                write(&dir, "top_p.bin", &top_p);
                write(&dir, "cand_scores.bin", &cand_scores);
                let targets = if strategy_code == 0 {
                    &greedy
                } else {
                    &sampled
                };
                write(&dir, "target_tokens.bin", targets);
                std::fs::write(dir.join("target_probs.bin"), to_bytes(dtype, &target)).expect("w");
                std::fs::write(dir.join("draft_probs.bin"), to_bytes(dtype, &draft)).expect("w");
                run(
                    &bin,
                    &[
                        "verify".into(),
                        d.clone(),
                        rows.to_string(),
                        vocab.to_string(),
                        "0".into(),
                        max_bsz.to_string(),
                        real_bsz.to_string(),
                        s.to_string(),
                        strategy_code.to_string(),
                        u32::from(accept_all && !reject_all).to_string(),
                        u32::from(reject_all).to_string(),
                        cands.to_string(),
                        end_tokens.len().to_string(),
                    ],
                );
                // The CPU reference.
                let up = |v: &[i32]| cpu.upload(v).expect("u");
                let (dt, tt, en, co) =
                    (up(&draft_tokens), up(&this_time), up(&encoder), up(&cu_out));
                let (sf, bs) = (
                    cpu.upload(&stop_flags).expect("u"),
                    cpu.upload(&is_block).expect("u"),
                );
                let (rs, si, md, et) = (
                    up(&reasoning),
                    up(&step_idx),
                    up(&max_dec_len),
                    up(&end_tokens),
                );
                let tt_buf = up(targets);
                let (ci, cl) = (up(&cand_ids), up(&cand_lens));
                let cs = cpu.upload(&cand_scores).expect("u");
                let strategy_inputs = match strategy {
                    Strategy::Greedy => StrategyInputs::Greedy {
                        target_tokens: &tt_buf,
                    },
                    Strategy::TargetMatch => StrategyInputs::TargetMatch {
                        target_tokens: &tt_buf,
                    },
                    Strategy::TopP => StrategyInputs::TopP {
                        candidate_ids: &ci,
                        candidate_scores: &cs,
                        candidate_lens: &cl,
                        candidates: cands,
                    },
                    Strategy::Rejection => StrategyInputs::Rejection {
                        target_probs: &target_buf,
                        draft_probs: &draft_buf,
                        top_k: &tk,
                        top_p: &tp,
                    },
                };
                let mut accept_tokens = cpu.alloc::<i32>(max_bsz * s).expect("a");
                let mut accept_num = cpu.alloc::<i32>(max_bsz).expect("a");
                cpu.verify_draft_tokens(
                    &VerifyInputs {
                        draft_tokens: &dt,
                        lens: SlotLens {
                            seq_lens_this_time: &tt,
                            seq_lens_encoder: &en,
                        },
                        cu_seqlens_q_output: &co,
                        state: VerifySlotState {
                            stop_flags: &sf,
                            is_block_step: &bs,
                            reasoning_status: &rs,
                            step_idx: &si,
                            max_dec_len: &md,
                            end_tokens: &et,
                        },
                        seeds: &sd,
                        strategy: strategy_inputs,
                    },
                    &mut VerifyOutputs {
                        accept_tokens: &mut accept_tokens,
                        accept_num: &mut accept_num,
                    },
                    &VerifyParams {
                        dims: BatchDims {
                            max_bsz,
                            real_bsz,
                            max_step_tokens: s,
                        },
                        rows,
                        vocab,
                        accept_all,
                        reject_all,
                        host: None,
                    },
                )
                .expect("cpu verify");
                let label = format!(
                    "{dtype} {} trial {trial} (accept_all {accept_all}, reject_all {reject_all})",
                    strategy.name()
                );
                assert_eq!(
                    read_i32(&dir.join("accept_num.out")),
                    cpu.download::<i32>(&accept_num).expect("d"),
                    "{label}: accept_num"
                );
                assert_eq!(
                    read_i32(&dir.join("accept_tokens.out")),
                    cpu.download::<i32>(&accept_tokens).expect("d"),
                    "{label}: accept_tokens"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "slow (minutes): host emulation of the CUDA kernels; run with --ignored in the CUDA CI lane"]
fn logprob_kernels_match_the_cpu_reference_on_the_host_emulator() {
    use specula_backend_api::ops::*;
    if compiler().is_none() {
        eprintln!("skipped: no C++20 compiler for the host emulation of the kernels");
        return;
    }
    let dir =
        std::env::temp_dir().join(format!("specula-emulated-logprobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let d = dir.to_string_lossy().into_owned();
    let cpu = CpuDevice::with_threads(1).expect("cpu");
    let mut rng = Lcg(0x10C);
    let (max_bsz, real_bsz, s) = (5usize, 4usize, 3usize);
    for dtype in [DType::F32, DType::F16] {
        let bin = driver(dtype);
        for (vocab, k) in [(50usize, 64usize), (300, 5), (300, 0), (1, 3)] {
            let encoder = vec![0i32, 4, 0, 0, 0];
            let this_time = [3i32, 4, 2, 3, 3];
            let mut cu_out = vec![0i32; real_bsz + 1];
            for b in 0..real_bsz {
                cu_out[b + 1] = cu_out[b] + slot_rows(this_time[b], encoder[b], s) as i32;
            }
            let rows = cu_out[real_bsz] as usize;
            let mut logits: Vec<f32> = (0..rows * vocab).map(|_| rng.unit() * 10.0 - 5.0).collect();
            // Hostile rows: NaN, ±inf, ties.
            if vocab > 4 && rows > 3 {
                logits[vocab] = f32::NAN;
                logits[vocab + 1] = f32::INFINITY;
                logits[vocab + 2] = f32::INFINITY;
                logits[2 * vocab..3 * vocab]
                    .iter_mut()
                    .for_each(|x| *x = f32::NEG_INFINITY);
                logits[3 * vocab..4 * vocab]
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (i % 3) as f32);
                logits[3 * vocab + 1] = -0.0;
                logits[3 * vocab] = 0.0;
            }
            // Rows are rounded to the dtype so both sides see the same values.
            let bytes = to_bytes(dtype, &logits);
            let temperature: Vec<f32> = (0..rows)
                .map(|r| [1.0, 0.0, 0.7, f32::NAN, -1.0, f32::INFINITY][r % 6])
                .collect();
            let accept_num = vec![3i32, 2, 9, -1, 2];
            let accept_tokens: Vec<i32> = (0..max_bsz * s)
                .map(|i| match i % 7 {
                    0 => -1,
                    1 => vocab as i32,
                    _ => (rng.next() % vocab as u64) as i32,
                })
                .collect();
            std::fs::write(dir.join("probs.bin"), &bytes).expect("w");
            write(&dir, "temperature.bin", &temperature);
            write(&dir, "accept_tokens.bin", &accept_tokens);
            write(&dir, "accept_num.bin", &accept_num);
            write(&dir, "encoder.bin", &encoder);
            write(&dir, "cu_out.bin", &cu_out);
            run(
                &bin,
                &[
                    "logprobs".into(),
                    d.clone(),
                    rows.to_string(),
                    vocab.to_string(),
                    "0".into(),
                    max_bsz.to_string(),
                    real_bsz.to_string(),
                    s.to_string(),
                    k.to_string(),
                ],
            );
            let lg = cpu.upload_bytes(dtype, &bytes).expect("u");
            let temp = cpu.upload(&temperature).expect("u");
            let (at, an, en, co) = (
                cpu.upload(&accept_tokens).expect("u"),
                cpu.upload(&accept_num).expect("u"),
                cpu.upload(&encoder).expect("u"),
                cpu.upload(&cu_out).expect("u"),
            );
            let entries = max_bsz * s;
            let mut cu_accept = cpu.alloc::<i32>(max_bsz + 1).expect("a");
            let mut token_ids = cpu.alloc::<i32>(entries).expect("a");
            let mut lps = cpu.alloc::<f32>(entries).expect("a");
            let mut ranks = cpu.alloc::<i32>(entries).expect("a");
            let mut top_ids = cpu.alloc::<i32>(entries * k).expect("a");
            let mut top_lps = cpu.alloc::<f32>(entries * k).expect("a");
            cpu.accept_logprobs(
                &LogprobsInputs {
                    logits: &lg,
                    temperature: &temp,
                    accept_tokens: &at,
                    accept_num: &an,
                    seq_lens_encoder: &en,
                    cu_seqlens_q_output: &co,
                },
                &mut LogprobsOutputs {
                    cu_accept: &mut cu_accept,
                    token_ids: &mut token_ids,
                    logprobs: &mut lps,
                    ranks: &mut ranks,
                    top_ids: &mut top_ids,
                    top_logprobs: &mut top_lps,
                },
                &LogprobsParams {
                    dims: BatchDims {
                        max_bsz,
                        real_bsz,
                        max_step_tokens: s,
                    },
                    shape: RowShape { rows, vocab },
                    top_k: k,
                    host_temperature: None,
                },
            )
            .expect("cpu logprobs");
            let label = format!("{dtype} logprobs V={vocab} K={k}");
            assert_eq!(
                read_i32(&dir.join("cu_accept.out")),
                cpu.download::<i32>(&cu_accept).expect("d"),
                "{label}: cu_accept"
            );
            assert_eq!(
                read_i32(&dir.join("token_ids.out")),
                cpu.download::<i32>(&token_ids).expect("d"),
                "{label}: token_ids"
            );
            assert_eq!(
                read_i32(&dir.join("ranks.out")),
                cpu.download::<i32>(&ranks).expect("d"),
                "{label}: ranks"
            );
            assert_eq!(
                read_i32(&dir.join("top_ids.out")),
                cpu.download::<i32>(&top_ids).expect("d"),
                "{label}: top_ids"
            );
            let close = |a: &[f32], b: &[f32], what: &str| {
                assert_eq!(a.len(), b.len());
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    let ok = (x.is_nan() && y.is_nan())
                        || x == y
                        || (x - y).abs() <= 1e-4 * (1.0 + y.abs());
                    assert!(ok, "{label}: {what}[{i}] emulated {x} cpu {y}");
                }
            };
            close(
                &read_f32(&dir.join("logprobs.out")),
                &cpu.download::<f32>(&lps).expect("d"),
                "logprobs",
            );
            close(
                &read_f32(&dir.join("top_logprobs.out")),
                &cpu.download::<f32>(&top_lps).expect("d"),
                "top_logprobs",
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "slow (minutes): host emulation of the CUDA kernels; run with --ignored in the CUDA CI lane"]
fn batch_kernels_match_the_cpu_reference_on_the_host_emulator() {
    use specula_backend_api::ops::*;
    if compiler().is_none() {
        eprintln!("skipped: no C++20 compiler for the host emulation of the kernels");
        return;
    }
    let dir = std::env::temp_dir().join(format!("specula-emulated-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let d = dir.to_string_lossy().into_owned();
    let cpu = CpuDevice::with_threads(1).expect("cpu");
    let mut rng = Lcg(0xBA7C);
    let bin = driver(DType::F32);
    let (s, hidden, max_model_len) = (4usize, 6usize, 24usize);
    let end_tokens = [5i32, 9];
    for trial in 0..10 {
        let max_bsz = 9usize;
        let real_bsz = [7usize, 9, 0, 3][trial % 4];
        let this_time: Vec<i32> = (0..max_bsz)
            .map(|b| match (b + trial) % 9 {
                0 => 1,
                1 => 4,
                2 => 3,
                3 => 0,
                4 => 6, // prefill (encoder 6)
                5 if trial % 2 == 0 => -3,
                5 => 2,
                6 if trial % 3 == 0 => 11,
                6 => 1, // > S: hostile decode length
                7 => 2,
                _ => 1,
            })
            .collect();
        let encoder: Vec<i32> = (0..max_bsz)
            .map(|b| match (b + trial) % 9 {
                4 => 6,
                7 if trial % 4 == 1 => -2,
                7 => 0,
                8 if trial % 5 == 2 => 3,
                8 => 0, // prefill whose length disagrees
                _ => 0,
            })
            .collect();
        let capacity = real_bsz * s + 3;
        let token_sum: usize = (0..real_bsz).map(|b| this_time[b].max(0) as usize).sum();
        let token_num = if trial % 3 == 2 {
            token_sum.saturating_sub(2)
        } else {
            token_sum
        };
        let hidden_bytes: Vec<u8> = (0..token_num * hidden * 4)
            .map(|_| rng.next() as u8)
            .collect();
        let slot_top_p: Vec<f32> = (0..max_bsz)
            .map(|b| [0.9, 1.0, 0.5, f32::NAN][b % 4])
            .collect();
        let slot_top_k: Vec<i32> = (0..max_bsz).map(|b| b as i32 * 3 - 2).collect();
        let slot_temperature: Vec<f32> = (0..max_bsz).map(|b| [1.0, 0.0, 0.7][b % 3]).collect();
        let slot_seed: Vec<u64> = (0..max_bsz)
            .map(|b| match b % 4 {
                0 => u64::MAX,
                1 => specula_backend_api::abi::MAX_INFER_SEED - 5,
                _ => rng.next(),
            })
            .collect();
        // update_state / ngram state
        let accept_tokens: Vec<i32> = (0..max_bsz * s)
            .map(|i| [3, 5, 8, 9, 1, 2][(i + trial) % 6])
            .collect();
        let accept_num: Vec<i32> = (0..max_bsz)
            .map(|b| (b as i32 + trial as i32) % (s as i32 + 3) - 1)
            .collect();
        let stop_flags: Vec<u8> = (0..max_bsz)
            .map(|b| u8::from(b == 2 && trial % 2 == 0))
            .collect();
        let is_block: Vec<u8> = (0..max_bsz).map(|b| u8::from(b == 3)).collect();
        let prompt_lens: Vec<i32> = (0..max_bsz)
            .map(|b| [6, 10, 0, 30, -1, 8, 12, 5, 7][b])
            .collect();
        let step_idx: Vec<i32> = (0..max_bsz)
            .map(|b| [4, 3, 0, 2, 5, 20, 9, 1, 6][(b + trial) % 9])
            .collect();
        let max_dec_len: Vec<i32> = (0..max_bsz)
            .map(|b| [10, 5, 100, 7, 6, 3, 12, 2, 30][b])
            .collect();
        let infer_seed: Vec<u64> = slot_seed.clone();
        let draft_tokens: Vec<i32> = (0..max_bsz * s).map(|i| 100 + i as i32).collect();
        let decoder: Vec<i32> = (0..max_bsz)
            .map(|b| if b == 1 { i32::MAX - 1 } else { b as i32 * 10 })
            .collect();
        let alphabet = [10, 20, 30, 40, 50];
        let token_ids_all: Vec<i32> = (0..max_bsz * max_model_len)
            .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize])
            .collect();
        let draft_token_num: Vec<i32> = (0..max_bsz)
            .map(|b| [3, 1, 0, 5, -1, 3, 2, 3, 3][b])
            .collect();
        // Mandatory tokens (prefill tokens + one per decode slot), then a budget that binds.
        let mandatory: usize = (0..real_bsz)
            .map(|b| {
                if encoder[b] > 0 {
                    this_time[b].max(0) as usize
                } else if this_time[b] > 0 {
                    1
                } else {
                    0
                }
            })
            .sum();
        let threshold = mandatory + [100usize, 2, 0, 1, 3][trial % 5];
        let (min_n, max_n) = [(1usize, 3usize), (2, 2), (1, 1), (3, 5)][trial % 4];

        for (name, data) in [
            ("this_time.bin", &this_time),
            ("encoder.bin", &encoder),
            ("slot_top_k.bin", &slot_top_k),
            ("accept_tokens.bin", &accept_tokens),
            ("prompt_lens.bin", &prompt_lens),
            ("max_dec_len.bin", &max_dec_len),
            ("accept_num.bin", &accept_num),
            ("token_ids_all.bin", &token_ids_all),
            ("step_idx.bin", &step_idx),
            ("draft_tokens.bin", &draft_tokens),
            ("decoder.bin", &decoder),
            ("draft_token_num.bin", &draft_token_num),
        ] {
            write(&dir, name, data);
        }
        write(&dir, "end_tokens.bin", &end_tokens);
        write(&dir, "slot_top_p.bin", &slot_top_p);
        write(&dir, "slot_temperature.bin", &slot_temperature);
        write(&dir, "slot_seed.bin", &slot_seed);
        write(&dir, "infer_seed.bin", &infer_seed);
        write(&dir, "stop_flags.bin", &stop_flags);
        write(&dir, "is_block_step.bin", &is_block);
        std::fs::write(dir.join("hidden.bin"), &hidden_bytes).expect("w");
        run(
            &bin,
            &[
                "batch".into(),
                d.clone(),
                max_bsz.to_string(),
                real_bsz.to_string(),
                s.to_string(),
                capacity.to_string(),
                (hidden * 4).to_string(),
                token_num.to_string(),
                max_model_len.to_string(),
                threshold.to_string(),
                min_n.to_string(),
                max_n.to_string(),
                end_tokens.len().to_string(),
            ],
        );
        let label = format!("batch trial {trial}");
        let dims = BatchDims {
            max_bsz,
            real_bsz,
            max_step_tokens: s,
        };
        let up = |v: &[i32]| cpu.upload(v).expect("u");
        let (tt, en) = (up(&this_time), up(&encoder));
        let lens = SlotLens {
            seq_lens_this_time: &tt,
            seq_lens_encoder: &en,
        };
        let mut seq_lens_output = cpu.alloc::<i32>(max_bsz).expect("a");
        let mut cu_in = cpu.alloc::<i32>(real_bsz + 1).expect("a");
        let mut cu_out = cpu.alloc::<i32>(real_bsz + 1).expect("a");
        let mut batch_id = cpu.alloc::<i32>(capacity).expect("a");
        cpu.build_output_layout(
            &lens,
            &mut LayoutOutputs {
                seq_lens_output: &mut seq_lens_output,
                cu_seqlens_q: &mut cu_in,
                cu_seqlens_q_output: &mut cu_out,
                batch_id_per_token_output: &mut batch_id,
            },
            &LayoutParams { dims, host: None },
        )
        .expect("layout");
        let dl = |b: &specula_backend_api::Buffer| cpu.download::<i32>(b).expect("d");
        assert_eq!(
            read_i32(&dir.join("seq_lens_output.out")),
            dl(&seq_lens_output),
            "{label}: seq_lens_output"
        );
        assert_eq!(
            read_i32(&dir.join("cu_in.out")),
            dl(&cu_in),
            "{label}: cu_seqlens_q"
        );
        assert_eq!(
            read_i32(&dir.join("cu_out.out")),
            dl(&cu_out),
            "{label}: cu_seqlens_q_output"
        );
        assert_eq!(
            read_i32(&dir.join("batch_id.out")),
            dl(&batch_id),
            "{label}: batch_id"
        );
        let layout = OutputLayout {
            cu_seqlens_q_output: &cu_out,
            batch_id_per_token_output: &batch_id,
        };

        let (stp, stk) = (cpu.upload(&slot_top_p).expect("u"), up(&slot_top_k));
        let (stt, sts) = (
            cpu.upload(&slot_temperature).expect("u"),
            cpu.upload(&slot_seed).expect("u"),
        );
        let mut top_p = cpu.alloc::<f32>(capacity).expect("a");
        let mut top_k = cpu.alloc::<i32>(capacity).expect("a");
        let mut temperature = cpu.alloc::<f32>(capacity).expect("a");
        let mut seed = cpu.alloc::<u64>(capacity).expect("a");
        cpu.build_sampling_params(
            &SamplingParamsInputs {
                slots: SlotSamplingParams {
                    top_p: &stp,
                    top_k: &stk,
                    temperature: &stt,
                    infer_seed: &sts,
                },
                lens,
                layout,
            },
            &mut RowSamplingParams {
                top_p: &mut top_p,
                top_k: &mut top_k,
                temperature: &mut temperature,
                seed: &mut seed,
            },
            &SamplingParamsParams {
                dims,
                host: None,
                host_top_p: None,
                host_temperature: None,
            },
        )
        .expect("sampling params");
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(
            bits(read_f32(&dir.join("top_p.out"))),
            bits(cpu.download::<f32>(&top_p).expect("d")),
            "{label}: top_p"
        );
        assert_eq!(
            read_i32(&dir.join("top_k.out")),
            dl(&top_k),
            "{label}: top_k"
        );
        assert_eq!(
            bits(read_f32(&dir.join("temperature.out"))),
            bits(cpu.download::<f32>(&temperature).expect("d")),
            "{label}: temperature"
        );
        let seeds: Vec<u64> =
            bytemuck::pod_collect_to_vec(&std::fs::read(dir.join("seed.out")).expect("r"));
        assert_eq!(
            seeds,
            cpu.download::<u64>(&seed).expect("d"),
            "{label}: seeds"
        );

        let hidden_buf = cpu.upload_bytes(DType::F32, &hidden_bytes).expect("u");
        for speculative in [true, false] {
            let rows = if speculative { capacity } else { max_bsz };
            let mut out = cpu.alloc::<f32>(rows * hidden).expect("a");
            cpu.gather_next_token(
                &GatherInputs {
                    hidden_states: &hidden_buf,
                    cu_seqlens_q: &cu_in,
                    lens,
                    layout,
                },
                &mut out,
                &GatherParams {
                    dims,
                    token_num,
                    hidden,
                    is_speculative: speculative,
                    host: None,
                },
            )
            .expect("gather");
            let file = if speculative {
                "gather_spec.out"
            } else {
                "gather_plain.out"
            };
            assert_eq!(
                std::fs::read(dir.join(file)).expect("r"),
                cpu.download_bytes(&out).expect("d"),
                "{label}: gather (speculative {speculative})"
            );
        }

        // update_state on fresh copies.
        let (at, ib, pl, md, et) = (
            up(&accept_tokens),
            cpu.upload(&is_block).expect("u"),
            up(&prompt_lens),
            up(&max_dec_len),
            up(&end_tokens),
        );
        let mut an = up(&accept_num);
        let mut sf = cpu.upload(&stop_flags).expect("u");
        let mut tia = up(&token_ids_all);
        let mut si = up(&step_idx);
        let mut is = cpu.upload(&infer_seed).expect("u");
        let mut dt = up(&draft_tokens);
        let mut enc = up(&encoder);
        let mut dec = up(&decoder);
        cpu.update_state(
            &UpdateStateInputs {
                accept_tokens: &at,
                is_block_step: &ib,
                prompt_lens: &pl,
                max_dec_len: &md,
                end_tokens: &et,
            },
            &mut DecodeState {
                accept_num: &mut an,
                stop_flags: &mut sf,
                token_ids_all: &mut tia,
                step_idx: &mut si,
                infer_seed: &mut is,
                draft_tokens: &mut dt,
                seq_lens_encoder: &mut enc,
                seq_lens_decoder: &mut dec,
            },
            &UpdateStateParams {
                dims,
                max_model_len,
            },
        )
        .expect("update_state");
        assert_eq!(
            read_i32(&dir.join("u_accept_num.out")),
            dl(&an),
            "{label}: accept_num"
        );
        assert_eq!(
            std::fs::read(dir.join("u_stop_flags.out")).expect("r"),
            cpu.download::<u8>(&sf).expect("d"),
            "{label}: stop_flags"
        );
        assert_eq!(
            read_i32(&dir.join("u_token_ids_all.out")),
            dl(&tia),
            "{label}: token_ids_all"
        );
        assert_eq!(
            read_i32(&dir.join("u_step_idx.out")),
            dl(&si),
            "{label}: step_idx"
        );
        let got_seed: Vec<u64> =
            bytemuck::pod_collect_to_vec(&std::fs::read(dir.join("u_infer_seed.out")).expect("r"));
        assert_eq!(
            got_seed,
            cpu.download::<u64>(&is).expect("d"),
            "{label}: infer_seed"
        );
        assert_eq!(
            read_i32(&dir.join("u_draft_tokens.out")),
            dl(&dt),
            "{label}: draft_tokens"
        );
        assert_eq!(
            read_i32(&dir.join("u_encoder.out")),
            dl(&enc),
            "{label}: encoder"
        );
        assert_eq!(
            read_i32(&dir.join("u_decoder.out")),
            dl(&dec),
            "{label}: decoder"
        );

        // ngram_match on fresh copies.
        let (tia, pl, si, dtn, en2, md) = (
            up(&token_ids_all),
            up(&prompt_lens),
            up(&step_idx),
            up(&draft_token_num),
            up(&encoder),
            up(&max_dec_len),
        );
        let mut dt = up(&draft_tokens);
        let mut tt2 = up(&this_time);
        cpu.ngram_match(
            &NgramInputs {
                token_ids_all: &tia,
                prompt_lens: &pl,
                step_idx: &si,
                draft_token_num: &dtn,
                seq_lens_encoder: &en2,
                max_dec_len: &md,
            },
            &mut NgramOutputs {
                draft_tokens: &mut dt,
                seq_lens_this_time: &mut tt2,
            },
            &NgramParams {
                dims,
                max_model_len,
                max_ngram_size: max_n,
                min_ngram_size: min_n,
                threshold,
            },
        )
        .expect("ngram");
        assert_eq!(
            read_i32(&dir.join("n_draft_tokens.out")),
            dl(&dt),
            "{label}: ngram draft_tokens"
        );
        assert_eq!(
            read_i32(&dir.join("n_this_time.out")),
            dl(&tt2),
            "{label}: ngram seq_lens_this_time"
        );
    }

    // softmax, tolerance-compared.
    for dtype in [DType::F32, DType::BF16] {
        let bin = driver(dtype);
        let (rows, vocab) = (6usize, 333usize);
        let mut logits: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.unit() * 20.0 - 10.0)
            .collect();
        logits[vocab + 5] = f32::INFINITY;
        logits[vocab + 9] = f32::INFINITY;
        logits[2 * vocab..3 * vocab]
            .iter_mut()
            .for_each(|x| *x = f32::NEG_INFINITY);
        logits[3 * vocab + 7] = f32::NAN;
        let bytes = to_bytes(dtype, &logits);
        let temperature = vec![1.0f32, 0.5, 1.0, 0.0, f32::NAN, f32::INFINITY];
        std::fs::write(dir.join("probs.bin"), &bytes).expect("w");
        write(&dir, "temperature.bin", &temperature);
        run(
            &bin,
            &[
                "softmax".into(),
                d.clone(),
                rows.to_string(),
                vocab.to_string(),
                "0".into(),
            ],
        );
        let lg = cpu.upload_bytes(dtype, &bytes).expect("u");
        let tp = cpu.upload(&temperature).expect("u");
        let mut probs = cpu.alloc::<f32>(rows * vocab).expect("a");
        cpu.softmax(
            &lg,
            &tp,
            &mut probs,
            &SoftmaxParams {
                shape: RowShape { rows, vocab },
                host_temperature: None,
            },
        )
        .expect("softmax");
        let want = cpu.download::<f32>(&probs).expect("d");
        for (i, (g, w)) in read_f32(&dir.join("probs.out"))
            .iter()
            .zip(&want)
            .enumerate()
        {
            assert!(
                (g - w).abs() <= 1e-6 + 1e-5 * w.abs(),
                "{dtype} softmax[{i}] emulated {g} cpu {w}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
