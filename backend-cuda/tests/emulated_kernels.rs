//! The kernels run on a host emulation of CUDA (`tests/emulator`) and are compared with the CPU
//! reference: the sampling kernels (`top_k_top_p_sample`, including the cooperative split path,
//! `top_p_candidates`, `argmax`) on ordinary, tied and hostile rows, in f32, f16 and bf16, with
//! aligned and misaligned windows; `verify_draft_tokens` with every strategy; `accept_logprobs`;
//! the batch ops and `softmax`. Logits rows (`docs/semantics.md` §4b: sampling, candidates and REJECTION,
//! ordinary and hostile logits at every kind of temperature) are compared with the reference device
//! (`specula-reference`), as the CPU backend takes probability rows only. `process_logits`
//! (§5.12), the `fallback` input of the sampling ops and `update_state`'s `token_counts` are
//! compared with the reference bit for bit, hostile inputs included (`process_logits` also over
//! one rank's slice of the vocabulary, §4d); REJECTION's `fallback` (rows
//! of weight 0) with the CPU backend on probability rows and with the reference on logits rows.
//! The ops of sharded rows (§5.13–§5.17, `emulator/shard.rs`) are compared with the reference on
//! slices of ordinary and hostile rows.
//! The real kernel sources (every `kernels/<op>.cu` of the op table) are compiled with a C++20
//! compiler (`g++`, `c++` or `clang++`).
//!
//! Scratch starts full of garbage (REJECTION's stats, `ngram_match`'s proposals,
//! `accept_logprobs`' entries, a split row's histograms), as the device's reused arena leaves it:
//! every kernel must write what it reads. An f32 split row runs twice on the same scratch and
//! barrier words, so the second launch starts from what the first left there.
//!
//! The emulation takes a minute or more (three compiles first), so these tests run only when
//! `SPECULA_REQUIRE` names `cuda-emulator` (the CUDA CI lanes); otherwise they are listed as
//! ignored with the reason, as they are when no compiler is found. With `SPECULA_REQUIRE=cuda-emulator` and no compiler they
//! fail.

#[path = "emulator/host.rs"]
mod host;
#[path = "emulator/shard.rs"]
mod shard;

use std::fmt::{Debug, Display};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use specula_backend_api::named_tests;
use specula_backend_api::ops::*;
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Element};
use specula_backend_cpu::CpuDevice;
use specula_backend_cuda::kernels::{KernelFile, SELECT, SHARD};
use specula_backend_cuda::launch;
use specula_reference::ReferenceDevice;
use specula_reference::fixtures::rows::{
    compact_draft_rows, kinded_logit_rows, kinded_prob_rows, peaked_rows, temperature_kinds,
};
use specula_reference::fixtures::{self, ProcessCase, Rng, score_bytes};

use shard::sharded_row_kernels_match_the_reference;

const SHIM: &str = include_str!("emulator/shim.hpp");
const DRIVER: &str = include_str!("emulator/driver.cpp");

/// What these tests need, as `SPECULA_REQUIRE` names it.
const NEED: &str = "cuda-emulator";

/// The C++ standard the emulator needs (`std::barrier`).
const STD: &str = "c++20";

fn main() -> ExitCode {
    let tests: Vec<(&str, TestFn)> = named_tests![
        panicking => sampling_kernels_match_the_cpu_reference,
        verify_kernels_match_the_cpu_reference,
        logits_sampling_kernels_match_the_reference,
        sampling_fallback_matches_the_reference,
        process_logits_matches_the_reference,
        process_logits_of_a_slice_matches_the_reference,
        logits_rejection_matches_the_reference,
        logprob_kernels_match_the_cpu_reference,
        batch_kernels_match_the_cpu_reference,
        scaled_logits_subtract_the_row_maximum_first,
        an_infinite_temperature_is_uniform_over_the_finite_logits,
        sharded_row_kernels_match_the_reference,
    ];
    testing::run(&needs(), tests)
}

/// A test body that fails by panicking.
fn panicking(body: fn()) -> TestFn {
    Box::new(move || {
        body();
        Ok(())
    })
}

/// The emulator runs when a compiler is found and `SPECULA_REQUIRE` asks for it.
fn needs() -> Needs {
    let availability = host::compiler(STD).map(|_| ()).and_then(|()| {
        if testing::required(NEED) {
            Ok(())
        } else {
            Err(format!(
                "not requested (the host emulation takes minutes): set {}={NEED} to run it",
                testing::REQUIRE_VAR
            ))
        }
    });
    Needs::new(NEED, availability)
}

/// The emulator driver for `dtype`. The first call builds the drivers of every dtype at once (a
/// compiler process each, in parallel: the compiles are most of these tests' time), once per test
/// process.
fn driver(dtype: DType) -> PathBuf {
    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    static BUILT: std::sync::OnceLock<[PathBuf; 3]> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("specula-emulator-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::thread::scope(|scope| {
            let dir = &dir;
            DTYPES
                .map(|d| scope.spawn(move || build_driver(dir, d)))
                .map(|build| build.join().expect("the emulator driver's build panicked"))
        })
    });
    let slot = DTYPES.iter().position(|d| *d == dtype).unwrap_or(0);
    built[slot].clone()
}

/// The defines, the emulator, the headers and every kernel file (after its argument structs,
/// generated from Rust), then the driver, for `dtype`.
fn build_driver(dir: &Path, dtype: DType) -> PathBuf {
    let tag = match dtype {
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        _ => "F32",
    };
    let mut src = host::defines();
    src += &format!(
        "#define SPECULA_T {tag}\n#define SPECULA_D {tag}\n#define SPECULA_SUFFIX {}\n",
        dtype.name()
    );
    src += host::INTRINSICS;
    src += SHIM;
    src += &host::host_common();
    src += SELECT;
    src += SHARD;
    for file in KernelFile::ALL {
        src += &file.declared_body();
    }
    src += DRIVER;
    let compiler = host::compiler(STD).expect("checked before the tests run");
    let name = format!("driver_{}", dtype.name());
    host::build(compiler, STD, &["-pthread"], dir, &name, &src)
        .unwrap_or_else(|e| panic!("emulator: {e}"))
}

/// The directory a driver run reads its inputs (`*.bin`) from and writes its outputs (`*.out`)
/// to; removed when dropped.
struct Workdir(PathBuf);

impl Workdir {
    fn new(test: &str) -> Self {
        let name = format!("specula-emulated-{test}-{}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Workdir(dir)
    }

    /// Writes the input file `name`.
    fn write<T: bytemuck::Pod>(&self, name: &str, data: &[T]) {
        std::fs::write(self.0.join(name), bytemuck::cast_slice(data)).expect("write");
    }

    /// Writes each `(name, data)` of `files` as the input file `name`.
    fn write_each(&self, files: &[(&str, &[i32])]) {
        for (name, data) in files {
            self.write(name, data);
        }
    }

    /// The output file `name`, as `T` values.
    fn read<T: bytemuck::Pod>(&self, name: &str) -> Vec<T> {
        bytemuck::pod_collect_to_vec(&std::fs::read(self.0.join(name)).expect("read output"))
    }

    /// Runs the driver `bin` as `driver KIND DIR ARGS...` (see `emulator/driver.cpp`).
    fn run(&self, bin: &Path, kind: &str, args: &[&dyn Display]) {
        let out = Command::new(bin)
            .arg(kind)
            .arg(&self.0)
            .args(args.iter().map(|a| a.to_string()))
            .output()
            .expect("run the driver");
        assert!(
            out.status.success(),
            "driver {kind} {:?} failed:\n{}{}",
            args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The driver's outputs of one case against the buffers of the device that computed them
/// (the CPU backend or the reference device).
struct Expect<'a> {
    work: &'a Workdir,
    dev: &'a dyn Device,
    label: String,
}

impl<'a> Expect<'a> {
    fn new(work: &'a Workdir, dev: &'a dyn Device, label: String) -> Self {
        Expect { work, dev, label }
    }

    /// The expected buffer's contents as `T` values (`u32` for the bits of an f32 buffer).
    fn want<T: bytemuck::Pod>(&self, buffer: &Buffer) -> Vec<T> {
        bits(self.dev, buffer)
    }

    /// The `[ids, scores, lens]` outputs of `top_p_candidates` (scores bit for bit).
    fn candidates(&self, [ids, scores, lens]: &[Buffer; 3]) {
        self.same::<i32>("ids.out", ids, "ids");
        self.same::<u32>("scores.out", scores, "scores");
        self.same::<i32>("lens.out", lens, "lens");
    }

    /// The `[accept_tokens, accept_num]` outputs of `verify_draft_tokens`.
    fn verified(&self, [accept_tokens, accept_num]: &[Buffer; 2]) {
        self.same::<i32>("accept_num.out", accept_num, "accept_num");
        self.same::<i32>("accept_tokens.out", accept_tokens, "accept_tokens");
    }

    /// Output `file` equals `want` element for element, read as `T`.
    fn same<T: bytemuck::Pod + PartialEq + Debug>(&self, file: &str, want: &Buffer, what: &str) {
        let got = self.work.read::<T>(file);
        assert_eq!(got, self.want::<T>(want), "{}: {what}", self.label);
    }

    /// Output `file` (f32) is `close` to `want`, element for element.
    fn close(&self, file: &str, want: &Buffer, what: &str, close: fn(f32, f32) -> bool) {
        let (got, want) = (self.work.read::<f32>(file), self.want::<f32>(want));
        assert_eq!(got.len(), want.len(), "{}: {what} length", self.label);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                close(g, w),
                "{}: {what}[{i}] emulated {g} expected {w}",
                self.label
            );
        }
    }
}

fn cpu() -> CpuDevice {
    CpuDevice::with_threads(1).expect("cpu")
}

fn up<T: Element>(dev: &dyn Device, data: &[T]) -> Buffer {
    dev.upload(data).expect("upload")
}

fn down<T: Element>(dev: &dyn Device, buffer: &Buffer) -> Vec<T> {
    dev.download(buffer).expect("download")
}

/// The struct `$ty` whose `$field`s are `$source`'s host vectors of the same names uploaded to
/// `$dev`, and whose other fields are the given values.
macro_rules! uploaded {
    ($ty:ident { from $source:ident on $dev:ident: $($field:ident),+; $($other:ident: $value:expr),* $(,)? }) => {
        $ty {
            $($field: up($dev, &$source.$field),)+
            $($other: $value,)*
        }
    };
}

/// The buffer's contents as `T` values (`u32` for the bits of an f32 buffer).
fn bits<T: bytemuck::Pod>(dev: &dyn Device, buffer: &Buffer) -> Vec<T> {
    bytemuck::pod_collect_to_vec(&dev.download_bytes(buffer).expect("download"))
}

/// The rows and per-row parameters of one sampling case.
struct Case {
    dtype: DType,
    rows: usize,
    vocab: usize,
    probs: Vec<u8>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    seed: Vec<u64>,
}

impl Case {
    fn new(rng: &mut Rng, dtype: DType, rows_n: usize, vocab: usize) -> Self {
        let values = kinded_prob_rows(rng, rows_n, vocab);
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
            dtype,
            rows: rows_n,
            vocab,
            probs: score_bytes(&values, dtype),
            top_k: (0..rows_n)
                .map(|r| ks[(r * 7 + r / 3) % ks.len()])
                .collect(),
            top_p: (0..rows_n)
                .map(|r| ps[(r * 5 + r / 2) % ps.len()])
                .collect(),
            seed: (0..rows_n).map(|_| rng.next_u64()).collect(),
        }
    }

    fn shape(&self) -> RowShape {
        RowShape {
            rows: self.rows,
            vocab: self.vocab,
        }
    }

    /// The rows on the CPU.
    fn probs(&self, cpu: &CpuDevice) -> Buffer {
        cpu.upload_bytes(self.dtype, &self.probs).expect("upload")
    }

    fn write(&self, work: &Workdir) {
        work.write("probs.bin", &self.probs);
        work.write("top_k.bin", &self.top_k);
        work.write("top_p.bin", &self.top_p);
        work.write("seed.bin", &self.seed);
    }
}

/// `argmax` on `dev`.
fn argmax_on(dev: &dyn Device, probs: &Buffer, shape: RowShape) -> Buffer {
    let mut out = dev.alloc::<i32>(shape.rows).expect("alloc");
    dev.argmax(probs, &mut out, &shape).expect("argmax");
    out
}

/// `top_k_top_p_sample` on `dev`: the tokens.
fn sample_on(dev: &dyn Device, inputs: &SampleInputs<'_>, shape: RowShape) -> Buffer {
    let mut tokens = dev.alloc::<i32>(shape.rows).expect("alloc");
    let params = SampleParams::new(shape);
    dev.top_k_top_p_sample(inputs, &mut tokens, &params)
        .expect("sample");
    tokens
}

/// `top_p_candidates` on `dev`: `[ids, scores, lens]`.
fn candidates_on(
    dev: &dyn Device,
    inputs: &CandidatesInputs<'_>,
    shape: RowShape,
    candidates: usize,
) -> [Buffer; 3] {
    let mut ids = dev.alloc::<i32>(shape.rows * candidates).expect("alloc");
    let mut scores = dev.alloc::<f32>(shape.rows * candidates).expect("alloc");
    let mut lens = dev.alloc::<i32>(shape.rows).expect("alloc");
    dev.top_p_candidates(
        inputs,
        &mut CandidatesOutputs {
            ids: &mut ids,
            scores: &mut scores,
            lens: &mut lens,
        },
        &CandidatesParams::new(shape, candidates),
    )
    .expect("candidates");
    [ids, scores, lens]
}

fn sampling_kernels_match_the_cpu_reference() {
    let work = Workdir::new("sampling");
    let cpu = cpu();
    let mut rng = Rng(0xC0DA);
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
            let mut c = Case::new(&mut rng, dtype, rows_n, vocab);
            if vocab == split_vocab {
                // Top-p (mass selection across blocks, with and without top-k), a degenerate
                // all-zero row (first in rank order across blocks), and plain top-k.
                c.top_p = vec![0.9, 0.3, 0.7, 1.0];
                c.top_k = vec![0, 50, 0, 3];
            }
            c.write(&work);
            let stride = launch::split_row_scratch_bytes(splits);
            // f32 split rows run twice (probabilities, no fallback, again).
            let again = u32::from(dtype == DType::F32);
            work.run(
                &bin,
                "sample",
                &[&rows_n, &vocab, &offset, &splits, &stride, &0, &0, &again],
            );
            let got = work.read::<i32>("tokens.out");
            let (probs, top_k, top_p, seed) = (
                c.probs(&cpu),
                up(&cpu, &c.top_k),
                up(&cpu, &c.top_p),
                up(&cpu, &c.seed),
            );
            let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
            let want = down::<i32>(&cpu, &sample_on(&cpu, &inputs, c.shape()));
            for r in 0..rows_n {
                assert_eq!(
                    got[r], want[r],
                    "{dtype} sample row {r} of {rows_n}x{vocab} (offset {offset}, splits {splits}): top_k {} top_p {}",
                    c.top_k[r], c.top_p[r]
                );
            }
            if splits > 1 && again == 1 {
                // The same launch again on the scratch and barrier words the first one left.
                let again = work.read::<i32>("tokens_again.out");
                assert_eq!(again, want, "{dtype} split sample, second launch");
            }
            if splits == 1 {
                // argmax and top_p_candidates (a few widths, padding rows) on the same rows.
                work.run(&bin, "argmax", &[&rows_n, &vocab, &offset]);
                let label = format!("{dtype} argmax {rows_n}x{vocab}");
                let want = argmax_on(&cpu, &probs, c.shape());
                Expect::new(&work, &cpu, label).same::<i32>("tokens.out", &want, "tokens");
                for cands in [1usize, 7, 128] {
                    check_candidates(&work, &bin, &cpu, &c, offset, cands);
                }
            }
        }
    }
}

/// `top_p_candidates` of width `cands` on the rows of `c`, every fifth row padding.
fn check_candidates(
    work: &Workdir,
    bin: &Path,
    cpu: &CpuDevice,
    c: &Case,
    offset: usize,
    cands: usize,
) {
    let batch_id = padded_batch_ids(c.rows, 5);
    work.write("batch_id.bin", &batch_id);
    work.run(bin, "candidates", &[&c.rows, &c.vocab, &offset, &cands]);
    let (probs, top_p, bid) = (c.probs(cpu), up(cpu, &c.top_p), up(cpu, &batch_id));
    let inputs = CandidatesInputs::new(Scores::Probs(&probs), &top_p).with_batch_id(Some(&bid));
    let want = candidates_on(cpu, &inputs, c.shape(), cands);
    let (dtype, rows, vocab) = (c.dtype, c.rows, c.vocab);
    let label = format!("{dtype} candidates C={cands} {rows}x{vocab} offset {offset}");
    Expect::new(work, cpu, label).candidates(&want);
}

/// `batch_id` for `rows` rows: row `r`, or −1 (padding) for every `every`-th row.
fn padded_batch_ids(rows: usize, every: i32) -> Vec<i32> {
    (0..rows as i32)
        .map(|r| if r % every == every - 1 { -1 } else { r })
        .collect()
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

/// `cu_seqlens_q_output` of the first `real_bsz` slots.
fn output_offsets(this_time: &[i32], encoder: &[i32], real_bsz: usize, s: usize) -> Vec<i32> {
    let mut cu_out = vec![0i32; real_bsz + 1];
    for b in 0..real_bsz {
        cu_out[b + 1] = cu_out[b] + slot_rows(this_time[b], encoder[b], s) as i32;
    }
    cu_out
}

/// REJECTION gives a draft outside `[0, V)` weight 0 in both rows (`docs/semantics.md` §5.8): it is rejected
/// and corrected from the residual like any rejected draft. The id `V − 1`, which weighs 0 in
/// every row of [`peaked_rows`], takes the same path, so a reference given it in place of each
/// out-of-vocabulary draft must agree with the kernel given the original drafts.
fn as_zero_weight(drafts: &[i32], vocab: usize) -> Vec<i32> {
    let zero_weight = vocab as i32 - 1;
    drafts
        .iter()
        .map(|&d| {
            if (0..zero_weight).contains(&d) {
                d
            } else {
                zero_weight
            }
        })
        .collect()
}

/// `verify_draft_tokens` on `dev` of `rows` of `vocab` in a batch of `dims`, under the
/// `(accept_all, reject_all)` flags: `[accept_tokens, accept_num]`.
fn verify_on(
    dev: &dyn Device,
    inputs: &VerifyInputs<'_>,
    (dims, rows, vocab): (BatchDims, usize, usize),
    (accept_all, reject_all): (bool, bool),
) -> [Buffer; 2] {
    let params = &VerifyParams {
        dims,
        rows,
        vocab,
        accept_all,
        reject_all,
        host: None,
    };
    let mut accept_tokens = dev
        .alloc::<i32>(dims.max_bsz * dims.max_step_tokens)
        .expect("alloc");
    let mut accept_num = dev.alloc::<i32>(dims.max_bsz).expect("alloc");
    let mut outputs = VerifyOutputs {
        accept_tokens: &mut accept_tokens,
        accept_num: &mut accept_num,
    };
    dev.verify_draft_tokens(inputs, &mut outputs, params)
        .expect("verify");
    [accept_tokens, accept_num]
}

/// The slot state of one `verify` trial, as host vectors.
struct VerifySlots {
    this_time: Vec<i32>,
    encoder: Vec<i32>,
    cu_out: Vec<i32>,
    stop_flags: Vec<u8>,
    is_block: Vec<u8>,
    reasoning: Vec<i32>,
    step_idx: Vec<i32>,
    max_dec_len: Vec<i32>,
}

/// [`VerifySlots`] and the end tokens, uploaded to a device.
struct SlotBuffers {
    this_time: Buffer,
    encoder: Buffer,
    cu_out: Buffer,
    stop_flags: Buffer,
    is_block: Buffer,
    reasoning: Buffer,
    step_idx: Buffer,
    max_dec_len: Buffer,
    end_tokens: Buffer,
}

impl VerifySlots {
    /// Drafts for every slot: mostly the sampled target token of their row (so runs of acceptances
    /// happen), some random, some −1 or beyond the vocabulary, and some `end_token` where given.
    fn drafts(
        &self,
        rng: &mut Rng,
        s: usize,
        vocab: usize,
        sampled: &[i32],
        end_token: Option<i32>,
    ) -> Vec<i32> {
        let random_below = if end_token.is_some() { 6 } else { 5 };
        let max_bsz = self.this_time.len();
        let mut draft_tokens = vec![0i32; max_bsz * s];
        for b in 0..max_bsz {
            for i in 0..s {
                let row =
                    self.cu_out.get(b).map_or(0, |&c| c.max(0) as usize) + i.saturating_sub(1);
                draft_tokens[b * s + i] = match (rng.next_u64() % 10, end_token) {
                    (0, _) => -1,
                    (1, _) => vocab as i32 + 3,
                    (2, Some(end)) => end,
                    (roll, _) if roll < random_below => (rng.next_u64() % vocab as u64) as i32,
                    _ => *sampled.get(row).unwrap_or(&0),
                };
            }
        }
        draft_tokens
    }

    /// Writes the slot inputs and `end_tokens` for the `verify` driver.
    fn write(&self, work: &Workdir, end_tokens: &[i32]) {
        work.write_each(&[
            ("this_time.bin", &self.this_time),
            ("encoder.bin", &self.encoder),
            ("cu_out.bin", &self.cu_out),
            ("reasoning.bin", &self.reasoning),
            ("step_idx.bin", &self.step_idx),
            ("max_dec_len.bin", &self.max_dec_len),
            ("end_tokens.bin", end_tokens),
        ]);
        work.write("stop_flags.bin", &self.stop_flags);
        work.write("is_block_step.bin", &self.is_block);
    }

    /// The slot inputs and `end_tokens` on `dev`.
    fn upload(&self, dev: &dyn Device, end_tokens: &[i32]) -> SlotBuffers {
        uploaded!(SlotBuffers {
            from self on dev: this_time, encoder, cu_out, stop_flags, is_block, reasoning,
                step_idx, max_dec_len;
            end_tokens: up(dev, end_tokens),
        })
    }
}

impl SlotBuffers {
    /// The `verify_draft_tokens` inputs of these slots with `draft_tokens`, `seeds` and `strategy`.
    fn inputs<'a>(
        &'a self,
        draft_tokens: &'a Buffer,
        seeds: &'a Buffer,
        strategy: StrategyInputs<'a>,
    ) -> VerifyInputs<'a> {
        VerifyInputs {
            draft_tokens,
            lens: SlotLens {
                seq_lens_this_time: &self.this_time,
                seq_lens_encoder: &self.encoder,
            },
            cu_seqlens_q_output: &self.cu_out,
            state: VerifySlotState {
                stop_flags: &self.stop_flags,
                is_block_step: &self.is_block,
                reasoning_status: &self.reasoning,
                step_idx: &self.step_idx,
                max_dec_len: &self.max_dec_len,
                end_tokens: &self.end_tokens,
            },
            seeds,
            strategy,
        }
    }
}

/// Writes the sampling rows of a `verify` trial for the driver.
fn write_verify_rows(
    work: &Workdir,
    top_k: &[i32],
    top_p: &[f32],
    seeds: &[u64],
    target_bytes: &[u8],
    draft_bytes: &[u8],
) {
    work.write("top_k.bin", top_k);
    work.write("top_p.bin", top_p);
    work.write("seeds.bin", seeds);
    work.write("target_probs.bin", target_bytes);
    work.write("draft_probs.bin", draft_bytes);
}

/// One `driver verify` run (see `emulator/driver.cpp`) over rows at window offset 0, its
/// numeric arguments by name.
struct VerifyRun {
    rows: usize,
    vocab: usize,
    dims: BatchDims,
    n_end: usize,
    /// 0 GREEDY, 1 TARGET_MATCH, 2 TOP_P, 3 REJECTION.
    strategy: u32,
    accept_all: bool,
    reject_all: bool,
    candidates: usize,
    /// REJECTION's rows are logits (it reads `temperature.bin`).
    logits: bool,
    /// REJECTION reads `fallback.bin`.
    fallback: bool,
    /// With more than 0, the draft rows are that many compact rows (`draft_index.bin`).
    draft_rows: usize,
}

impl VerifyRun {
    /// A run of `strategy` without flags, candidates or compact draft rows.
    fn new(rows: usize, vocab: usize, dims: BatchDims, n_end: usize, strategy: u32) -> Self {
        VerifyRun {
            rows,
            vocab,
            dims,
            n_end,
            strategy,
            accept_all: false,
            reject_all: false,
            candidates: 0,
            logits: false,
            fallback: false,
            draft_rows: 0,
        }
    }

    /// Runs the driver `bin` on the inputs in `work`.
    fn run(&self, work: &Workdir, bin: &Path) {
        let d = &self.dims;
        let args: [&dyn Display; 14] = [
            &self.rows,
            &self.vocab,
            &0,
            &d.max_bsz,
            &d.real_bsz,
            &d.max_step_tokens,
            &self.strategy,
            &u32::from(self.accept_all),
            &u32::from(self.reject_all),
            &self.candidates,
            &self.n_end,
            &u32::from(self.logits),
            &u32::from(self.fallback),
            &self.draft_rows,
        ];
        work.run(bin, "verify", &args);
    }
}

fn verify_kernels_match_the_cpu_reference() {
    let work = Workdir::new("verify");
    let cpu = cpu();
    let mut rng = Rng(0xBEEF);
    let (max_bsz, real_bsz, s, vocab, cands) = (8usize, 7usize, 4usize, 300usize, 8usize);
    let dims = BatchDims::new(max_bsz, real_bsz, s);
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
            let mut cu_out = output_offsets(&this_time, &encoder, real_bsz, s);
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
            let step_idx: Vec<i32> = (0..max_bsz)
                .map(|_| (rng.next_u64() % 12) as i32 - 1)
                .collect();
            let max_dec_len: Vec<i32> = (0..max_bsz)
                .map(|b| if b % 3 == 0 { step_idx[b] + 2 } else { 100 })
                .collect();
            let slots = VerifySlots {
                this_time,
                encoder,
                cu_out,
                stop_flags,
                is_block,
                reasoning,
                step_idx,
                max_dec_len,
            };
            let seeds: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
            let target = peaked_rows(&mut rng, rows, vocab, trial % 2 == 1);
            let draft = peaked_rows(&mut rng, max_bsz * (s - 1), vocab, trial % 4 == 3);
            let top_k: Vec<i32> = (0..rows).map(|r| [0, 3, 50, -1][r % 4]).collect();
            let top_p: Vec<f32> = (0..rows)
                .map(|r| [1.0, 0.8, 0.3, f32::NAN][(r + trial) % 4])
                .collect();
            // REJECTION's fallback on the hostile trials (their rows of weight 0 sample it):
            // tokens, -1 and ids beyond the vocabulary (end_tokens[0] and stop), an end token.
            let with_fallback = trial % 2 == 1;
            let fallback: Vec<i32> = (0..rows)
                .map(|r| [-1, 0, vocab as i32 - 2, 12345, end_tokens[1], 42][r % 6])
                .collect();
            let fb = up(&cpu, &fallback);
            work.write("fallback.bin", &fallback);
            let (target_bytes, draft_bytes) =
                (score_bytes(&target, dtype), score_bytes(&draft, dtype));
            let target_buf = cpu.upload_bytes(dtype, &target_bytes).expect("u");
            let draft_buf = cpu.upload_bytes(dtype, &draft_bytes).expect("u");
            // Strategy inputs from the CPU: argmax, samples and candidates of the target rows.
            let shape = RowShape { rows, vocab };
            let greedy = down::<i32>(&cpu, &argmax_on(&cpu, &target_buf, shape));
            let (tk, tp, sd) = (up(&cpu, &top_k), up(&cpu, &top_p), up(&cpu, &seeds));
            let sample = SampleInputs::new(Scores::Probs(&target_buf), &tk, &tp, &sd);
            let sampled = down::<i32>(&cpu, &sample_on(&cpu, &sample, shape));
            let candidates = CandidatesInputs::new(Scores::Probs(&target_buf), &tp);
            let [ids, scores, lens] = candidates_on(&cpu, &candidates, shape, cands);
            let mut cand_ids = down::<i32>(&cpu, &ids);
            let cand_scores = down::<f32>(&cpu, &scores);
            let mut cand_lens = down::<i32>(&cpu, &lens);
            if trial % 6 == 5 {
                // Candidates a caller made itself: garbage lengths and ids.
                cand_lens
                    .iter_mut()
                    .enumerate()
                    .for_each(|(r, l)| *l = [-3, 0, 99, 2][r % 4]);
                cand_ids.iter_mut().step_by(5).for_each(|x| *x = -4);
            }
            let draft_tokens = slots.drafts(&mut rng, s, vocab, &sampled, Some(end_tokens[0]));
            slots.write(&work, &end_tokens);
            write_verify_rows(&work, &top_k, &top_p, &seeds, &target_bytes, &draft_bytes);
            work.write("cand_ids.bin", &cand_ids);
            work.write("cand_lens.bin", &cand_lens);
            work.write("cand_scores.bin", &cand_scores);
            // The CPU side of every strategy.
            let slot_bufs = slots.upload(&cpu, &end_tokens);
            let (ci, cs, cl) = (
                up(&cpu, &cand_ids),
                up(&cpu, &cand_scores),
                up(&cpu, &cand_lens),
            );
            let (greedy_buf, sampled_buf) = (up(&cpu, &greedy), up(&cpu, &sampled));
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
                // The REJECTION reference sees out-of-vocabulary drafts as V − 1. `accept_all`
                // accepts that in-vocabulary id but never an out-of-vocabulary one, so under it
                // the kernel gets V − 1 too.
                let rejection = strategy == Strategy::Rejection;
                let cpu_drafts = if rejection {
                    as_zero_weight(&draft_tokens, vocab)
                } else {
                    draft_tokens.clone()
                };
                let kernel_drafts = if rejection && accept_all && !reject_all {
                    &cpu_drafts
                } else {
                    &draft_tokens
                };
                let targets = if strategy_code == 0 {
                    &greedy
                } else {
                    &sampled
                };
                work.write("draft_tokens.bin", kernel_drafts);
                work.write("target_tokens.bin", targets);
                let fallback = rejection && with_fallback;
                VerifyRun {
                    accept_all: accept_all && !reject_all,
                    reject_all,
                    candidates: cands,
                    fallback,
                    ..VerifyRun::new(rows, vocab, dims, end_tokens.len(), strategy_code)
                }
                .run(&work, &bin);
                let target_tokens = if strategy_code == 0 {
                    &greedy_buf
                } else {
                    &sampled_buf
                };
                let strategy_inputs = match strategy {
                    Strategy::Greedy => StrategyInputs::Greedy { target_tokens },
                    Strategy::TargetMatch => StrategyInputs::TargetMatch { target_tokens },
                    Strategy::TopP => StrategyInputs::TopP(CandidateInputs {
                        candidate_ids: &ci,
                        candidate_scores: &cs,
                        candidate_lens: &cl,
                        candidates: cands,
                    }),
                    Strategy::Rejection => StrategyInputs::Rejection(RejectionInputs {
                        target: Scores::Probs(&target_buf),
                        draft: &draft_buf,
                        top_k: &tk,
                        top_p: &tp,
                        fallback: with_fallback.then_some(&fb),
                        draft_index: None,
                    }),
                };
                let dt = up(&cpu, &cpu_drafts);
                let inputs = slot_bufs.inputs(&dt, &sd, strategy_inputs);
                let want = verify_on(&cpu, &inputs, (dims, rows, vocab), (accept_all, reject_all));
                let label = format!(
                    "{dtype} {} trial {trial} (accept_all {accept_all}, reject_all {reject_all}, \
                     fallback {})",
                    strategy.name(),
                    fallback
                );
                Expect::new(&work, &cpu, label).verified(&want);
            }
        }
    }
}

/// `top_k_top_p_sample` of `scores` with the settings of `c` and `fallback` on `dev`.
fn case_sample(
    dev: &dyn Device,
    scores: Scores<'_>,
    c: &Case,
    fallback: Option<&Buffer>,
) -> Buffer {
    let (top_k, top_p, seed) = (up(dev, &c.top_k), up(dev, &c.top_p), up(dev, &c.seed));
    let inputs = SampleInputs::new(scores, &top_k, &top_p, &seed).with_fallback(fallback);
    sample_on(dev, &inputs, c.shape())
}

/// `top_p_candidates` of width `cands` of `scores` with the `top_p` of `c`, the padding rows of
/// `batch_id` and `fallback` on `dev`: `[ids, scores, lens]`.
fn case_candidates(
    dev: &dyn Device,
    (scores, c, cands): (Scores<'_>, &Case, usize),
    batch_id: &[i32],
    fallback: Option<&Buffer>,
) -> [Buffer; 3] {
    let (top_p, bid) = (up(dev, &c.top_p), up(dev, batch_id));
    let inputs = CandidatesInputs::new(scores, &top_p)
        .with_batch_id(Some(&bid))
        .with_fallback(fallback);
    candidates_on(dev, &inputs, c.shape(), cands)
}

fn logits_sampling_kernels_match_the_reference() {
    let work = Workdir::new("logits-sampling");
    let dev = ReferenceDevice::new();
    let mut rng = Rng(0x10_61_75);
    let split_vocab = 3 * launch::SELECT_CHUNK as usize - 123;
    for dtype in DType::FLOATS {
        let bin = driver(dtype);
        // (rows, vocab, window offset in elements, splits)
        let mut shapes: Vec<(usize, usize, usize, u32)> =
            vec![(24, 1000, 0, 1), (3, 1, 0, 1), (8, split_vocab, 0, 3)];
        if dtype == DType::F32 {
            shapes.push((12, 999, 1, 1));
        }
        for (shape_index, (rows_n, vocab, offset, splits)) in shapes.into_iter().enumerate() {
            let mut c = Case::new(&mut rng, dtype, rows_n, vocab);
            let values = kinded_logit_rows(&mut rng, rows_n, vocab);
            c.probs = score_bytes(&values, dtype);
            let temperature = temperature_kinds(rows_n, shape_index);
            if vocab == split_vocab {
                // Top-p across blocks with and without top-k, plain top-k, everything.
                c.top_p = (0..rows_n).map(|r| [0.9, 0.3, 0.7, 1.0][r % 4]).collect();
                c.top_k = (0..rows_n).map(|r| [0, 50, 0, 3, 0][r % 5]).collect();
            }
            c.write(&work);
            work.write("temperature.bin", &temperature);
            let stride = launch::split_row_scratch_bytes(splits);
            // f32 split rows run twice (logits, no fallback, again).
            let again = u32::from(dtype == DType::F32);
            work.run(
                &bin,
                "sample",
                &[&rows_n, &vocab, &offset, &splits, &stride, &1, &0, &again],
            );
            let got = work.read::<i32>("tokens.out");
            let logits = dev.upload_bytes(dtype, &c.probs).expect("upload");
            let temp = up(&dev, &temperature);
            let want = down::<i32>(
                &dev,
                &case_sample(&dev, Scores::logits(&logits, &temp), &c, None),
            );
            for r in 0..rows_n {
                assert_eq!(
                    got[r],
                    want[r],
                    "{dtype} logits sample row {r} (kind {}) of {rows_n}x{vocab} (offset {offset}, splits {splits}): T {} top_k {} top_p {}",
                    r % 8,
                    temperature[r],
                    c.top_k[r],
                    c.top_p[r]
                );
            }
            if splits > 1 {
                if again == 1 {
                    let again = work.read::<i32>("tokens_again.out");
                    assert_eq!(again, want, "{dtype} logits split sample, second launch");
                }
                continue;
            }
            let batch_id = padded_batch_ids(rows_n, 5);
            work.write("batch_id.bin", &batch_id);
            for cands in [1usize, 7, 128] {
                work.run(&bin, "candidates", &[&rows_n, &vocab, &offset, &cands, &1]);
                let scores = Scores::logits(&logits, &temp);
                let want = case_candidates(&dev, (scores, &c, cands), &batch_id, None);
                let label =
                    format!("{dtype} logits candidates C={cands} {rows_n}x{vocab} offset {offset}");
                Expect::new(&work, &dev, label).candidates(&want);
            }
        }
    }
}

/// The `fallback` input of `top_k_top_p_sample` (one block per row and split rows) and
/// `top_p_candidates`, on probability and logits rows, a third of them of weight 0 (all −inf/NaN
/// logits; zero, negative, NaN and weightless tiny probabilities), fallbacks −1 and tokens,
/// against the reference.
fn sampling_fallback_matches_the_reference() {
    let work = Workdir::new("fallback");
    let dev = ReferenceDevice::new();
    let mut rng = Rng(0xFA11_BAC4);
    let split_vocab = 3 * launch::SELECT_CHUNK as usize - 77;
    for dtype in DType::FLOATS {
        let bin = driver(dtype);
        let mut shapes: Vec<(usize, usize, u32)> = vec![(18, 37, 1), (4, 1, 1)];
        if dtype == DType::F32 {
            shapes.push((3, split_vocab, 3));
        }
        for (rows_n, vocab, splits) in shapes {
            for logits in [false, true] {
                let mut c = Case::new(&mut rng, dtype, rows_n, vocab);
                let mut values = if logits {
                    kinded_logit_rows(&mut rng, rows_n, vocab)
                } else {
                    kinded_prob_rows(&mut rng, rows_n, vocab)
                };
                for (r, row) in values.chunks_mut(vocab).enumerate() {
                    if r % 3 == 0 {
                        for (v, x) in row.iter_mut().enumerate() {
                            *x = match (v + r) % 4 {
                                0 => f32::NAN,
                                1 if logits => f32::NEG_INFINITY,
                                1 => -0.5,
                                2 if logits => f32::NEG_INFINITY,
                                2 => 1e-13,
                                _ if logits => f32::NAN,
                                _ => 0.0,
                            };
                        }
                    }
                }
                c.probs = score_bytes(&values, dtype);
                let fallback: Vec<i32> = (0..rows_n)
                    .map(|r| [-1, 0, vocab as i32 - 1, 3, -1, 12345][r % 6])
                    .collect();
                let temperature = temperature_kinds(rows_n, rows_n);
                c.write(&work);
                work.write("temperature.bin", &temperature);
                work.write("fallback.bin", &fallback);
                let stride = launch::split_row_scratch_bytes(splits);
                let flag = u32::from(logits);
                work.run(
                    &bin,
                    "sample",
                    &[&rows_n, &vocab, &0, &splits, &stride, &flag, &1],
                );
                let matrix = dev.upload_bytes(dtype, &c.probs).expect("upload");
                let temp = up(&dev, &temperature);
                let scores = if logits {
                    Scores::logits(&matrix, &temp)
                } else {
                    Scores::probs(&matrix)
                };
                let fb = up(&dev, &fallback);
                let tokens = case_sample(&dev, scores, &c, Some(&fb));
                let label =
                    format!("{dtype} fallback logits {logits} {rows_n}x{vocab} splits {splits}");
                Expect::new(&work, &dev, label.clone()).same::<i32>(
                    "tokens.out",
                    &tokens,
                    "sample",
                );
                if splits > 1 {
                    continue;
                }
                let batch_id = padded_batch_ids(rows_n, 7);
                work.write("batch_id.bin", &batch_id);
                for cands in [1usize, 5] {
                    work.run(
                        &bin,
                        "candidates",
                        &[&rows_n, &vocab, &0, &cands, &flag, &1],
                    );
                    let want = case_candidates(&dev, (scores, &c, cands), &batch_id, Some(&fb));
                    Expect::new(&work, &dev, format!("{label} C={cands}")).candidates(&want);
                }
            }
        }
    }
}

/// REJECTION on logits target and draft rows (weighed at the output rows' temperatures), against
/// the reference: every slot kind, hostile rows and temperatures, out-of-vocabulary drafts, and
/// the `accept_all` / `reject_all` flags.
fn logits_rejection_matches_the_reference() {
    let work = Workdir::new("logits-rejection");
    let dev = ReferenceDevice::new();
    let mut rng = Rng(0x4E1EC7);
    let (max_bsz, real_bsz, s, vocab) = (8usize, 7usize, 4usize, 300usize);
    let dims = BatchDims::new(max_bsz, real_bsz, s);
    let end_tokens = [7i32, 13];
    for dtype in [DType::F32, DType::BF16] {
        let bin = driver(dtype);
        // Drafts accepted by the test itself (not by accept_all), over every trial.
        let mut accepted = 0;
        for trial in 0..8 {
            let this_time: Vec<i32> = (0..max_bsz)
                .map(|b| [4, 1, 5, 0, 3, 2, 4, 2][(b + trial) % 8])
                .collect();
            let encoder: Vec<i32> = (0..max_bsz)
                .map(|b| if (b + trial) % 8 == 2 { 5 } else { 0 })
                .collect();
            let cu_out = output_offsets(&this_time, &encoder, real_bsz, s);
            let rows = cu_out[real_bsz] as usize;
            let step_idx: Vec<i32> = (0..max_bsz).map(|_| (rng.next_u64() % 12) as i32).collect();
            let max_dec_len: Vec<i32> = (0..max_bsz)
                .map(|b| if b % 3 == 0 { step_idx[b] + 3 } else { 100 })
                .collect();
            let slots = VerifySlots {
                this_time,
                encoder,
                cu_out,
                stop_flags: vec![0u8; max_bsz],
                is_block: vec![0u8; max_bsz],
                reasoning: vec![0i32; max_bsz],
                step_idx,
                max_dec_len,
            };
            let seeds: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
            // The draft rows are the target rows disturbed (so that drafts are often accepted),
            // some of them wholly different; both of every kind.
            let target = kinded_logit_rows(&mut rng, rows, vocab);
            let draft_rows = max_bsz * (s - 1);
            let other = kinded_logit_rows(&mut rng, draft_rows, vocab);
            let draft: Vec<f32> = (0..draft_rows * vocab)
                .map(|k| {
                    let (q, v) = (k / vocab, k % vocab);
                    let source = q % rows.max(1);
                    if q % 3 == 2 || rows == 0 {
                        other[k]
                    } else {
                        target[source * vocab + v] + rng.unit_f32() - 0.5
                    }
                })
                .collect();
            // Compact draft rows on odd trials (`docs/semantics.md` §5.8.1): shuffled, every
            // fifth dropped (its entry negative or too large: rejected, the target sampled).
            let (draft, index) = match trial % 2 {
                1 => compact_draft_rows(&mut rng, &draft, vocab),
                _ => (draft, Vec::new()),
            };
            let compact_rows = if index.is_empty() {
                0
            } else {
                draft.len() / vocab
            };
            let temperature = temperature_kinds(rows, trial);
            // The fallback on two trials of three: rows of kind 3 (all −inf / NaN) weigh 0 and
            // sample it wherever REJECTION samples the target row.
            let with_fallback = trial % 3 != 0;
            let fallback: Vec<i32> = (0..rows)
                .map(|r| [-1, 0, vocab as i32 - 1, 12345, end_tokens[1], 42][(r / 8) % 6])
                .collect();
            let fb = up(&dev, &fallback);
            let top_k: Vec<i32> = (0..rows).map(|r| [0, 3, 50, -1][(r + trial) % 4]).collect();
            let top_p: Vec<f32> = (0..rows)
                .map(|r| [1.0, 0.8, 0.3, f32::NAN][(r + trial / 2) % 4])
                .collect();
            let (target_bytes, draft_bytes) =
                (score_bytes(&target, dtype), score_bytes(&draft, dtype));
            let target_buf = dev.upload_bytes(dtype, &target_bytes).expect("u");
            let draft_buf = dev.upload_bytes(dtype, &draft_bytes).expect("u");
            let (tk, tp, sd, tt) = (
                up(&dev, &top_k),
                up(&dev, &top_p),
                up(&dev, &seeds),
                up(&dev, &temperature),
            );
            let sampled = if rows > 0 {
                let sample = SampleInputs::new(Scores::logits(&target_buf, &tt), &tk, &tp, &sd);
                down::<i32>(&dev, &sample_on(&dev, &sample, RowShape { rows, vocab }))
            } else {
                vec![0]
            };
            let draft_tokens = slots.drafts(&mut rng, s, vocab, &sampled, None);
            let (accept_all, reject_all) = match trial % 4 {
                1 => (true, false),
                2 => (false, true),
                _ => (false, false),
            };
            slots.write(&work, &end_tokens);
            write_verify_rows(&work, &top_k, &top_p, &seeds, &target_bytes, &draft_bytes);
            work.write("draft_tokens.bin", &draft_tokens);
            work.write("temperature.bin", &temperature);
            work.write("fallback.bin", &fallback);
            work.write("draft_index.bin", &index);
            VerifyRun {
                accept_all,
                reject_all,
                logits: true,
                fallback: with_fallback,
                draft_rows: compact_rows,
                ..VerifyRun::new(rows, vocab, dims, end_tokens.len(), 3)
            }
            .run(&work, &bin);
            let slot_bufs = slots.upload(&dev, &end_tokens);
            let dt = up(&dev, &draft_tokens);
            let draft_index = (compact_rows > 0).then(|| up(&dev, &index));
            let inputs = slot_bufs.inputs(
                &dt,
                &sd,
                StrategyInputs::Rejection(RejectionInputs {
                    target: Scores::logits(&target_buf, &tt),
                    draft: &draft_buf,
                    top_k: &tk,
                    top_p: &tp,
                    fallback: with_fallback.then_some(&fb),
                    draft_index: draft_index.as_ref(),
                }),
            );
            let want = verify_on(&dev, &inputs, (dims, rows, vocab), (accept_all, reject_all));
            let label = format!(
                "{dtype} logits REJECTION trial {trial} (accept_all {accept_all}, reject_all {reject_all}, fallback {with_fallback}, compact rows {compact_rows})"
            );
            if !accept_all {
                let want_num = bits::<i32>(&dev, &want[1]);
                accepted += want_num.iter().map(|&n| (n - 1).max(0)).sum::<i32>();
            }
            Expect::new(&work, &dev, label).verified(&want);
        }
        assert!(accepted > 0, "{dtype}: no draft passed the acceptance test");
    }
}

/// Whether an emulated logprob is the CPU's: both NaN, equal, or within the f32 rounding of `exp`
/// and `log` over a row.
fn logprob_close(x: f32, y: f32) -> bool {
    (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-4 * (1.0 + y.abs())
}

/// `accept_logprobs` on the CPU.
fn cpu_logprobs(
    cpu: &CpuDevice,
    inputs: &LogprobsInputs<'_>,
    params: &LogprobsParams,
) -> LogprobsBuffers {
    let (dims, k) = (params.dims, params.top_k);
    let entries = dims.max_bsz * dims.max_step_tokens;
    let mut out = LogprobsBuffers::alloc(cpu, dims.max_bsz, entries, k).expect("a");
    cpu.accept_logprobs(inputs, &mut out.outputs(), params)
        .expect("cpu logprobs");
    out
}

fn logprob_kernels_match_the_cpu_reference() {
    let work = Workdir::new("logprobs");
    let cpu = cpu();
    let mut rng = Rng(0x10C);
    let (max_bsz, real_bsz, s) = (5usize, 4usize, 3usize);
    let dims = BatchDims::new(max_bsz, real_bsz, s);
    for dtype in [DType::F32, DType::F16] {
        let bin = driver(dtype);
        for (vocab, k) in [(50usize, 64usize), (300, 5), (300, 0), (1, 3)] {
            let encoder = vec![0i32, 4, 0, 0, 0];
            let this_time = [3i32, 4, 2, 3, 3];
            let cu_out = output_offsets(&this_time, &encoder, real_bsz, s);
            let rows = cu_out[real_bsz] as usize;
            let mut logits: Vec<f32> = (0..rows * vocab)
                .map(|_| rng.unit_f32() * 10.0 - 5.0)
                .collect();
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
            let bytes = score_bytes(&logits, dtype);
            let temperature: Vec<f32> = (0..rows)
                .map(|r| [1.0, 0.0, 0.7, f32::NAN, -1.0, f32::INFINITY][r % 6])
                .collect();
            let accept_num = vec![3i32, 2, 9, -1, 2];
            let accept_tokens: Vec<i32> = (0..max_bsz * s)
                .map(|i| match i % 7 {
                    0 => -1,
                    1 => vocab as i32,
                    _ => (rng.next_u64() % vocab as u64) as i32,
                })
                .collect();
            work.write("probs.bin", &bytes);
            work.write("temperature.bin", &temperature);
            work.write("accept_tokens.bin", &accept_tokens);
            work.write("accept_num.bin", &accept_num);
            work.write("encoder.bin", &encoder);
            work.write("cu_out.bin", &cu_out);
            let args: [&dyn Display; 7] = [&rows, &vocab, &0, &max_bsz, &real_bsz, &s, &k];
            work.run(&bin, "logprobs", &args);
            let logits = cpu.upload_bytes(dtype, &bytes).expect("u");
            let temperature = up(&cpu, &temperature);
            let (at, an) = (up(&cpu, &accept_tokens), up(&cpu, &accept_num));
            let (en, co) = (up(&cpu, &encoder), up(&cpu, &cu_out));
            let inputs = LogprobsInputs {
                logits: &logits,
                temperature: &temperature,
                accept_tokens: &at,
                accept_num: &an,
                seq_lens_encoder: &en,
                cu_seqlens_q_output: &co,
            };
            let params = LogprobsParams {
                dims,
                shape: RowShape { rows, vocab },
                top_k: k,
                host_temperature: None,
            };
            let out = cpu_logprobs(&cpu, &inputs, &params);
            let expect = Expect::new(&work, &cpu, format!("{dtype} logprobs V={vocab} K={k}"));
            expect.same::<i32>("cu_accept.out", &out.cu_accept, "cu_accept");
            expect.same::<i32>("token_ids.out", &out.token_ids, "token_ids");
            expect.same::<i32>("ranks.out", &out.ranks, "ranks");
            expect.same::<i32>("top_ids.out", &out.top_ids, "top_ids");
            expect.close("logprobs.out", &out.logprobs, "logprobs", logprob_close);
            expect.close(
                "top_logprobs.out",
                &out.top_logprobs,
                "top_logprobs",
                logprob_close,
            );
        }
    }
}

/// The per-slot state of one batch trial (`max_bsz` slots).
struct BatchState {
    this_time: Vec<i32>,
    encoder: Vec<i32>,
    accept_tokens: Vec<i32>,
    accept_num: Vec<i32>,
    stop_flags: Vec<u8>,
    is_block: Vec<u8>,
    prompt_lens: Vec<i32>,
    step_idx: Vec<i32>,
    max_dec_len: Vec<i32>,
    infer_seed: Vec<u64>,
    draft_tokens: Vec<i32>,
    decoder: Vec<i32>,
    token_ids_all: Vec<i32>,
    draft_token_num: Vec<i32>,
}

fn batch_kernels_match_the_cpu_reference() {
    let work = Workdir::new("batch");
    let cpu = cpu();
    let mut rng = Rng(0xBA7C);
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
            .map(|_| rng.next_u64() as u8)
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
                _ => rng.next_u64(),
            })
            .collect();
        // update_state / ngram state
        let alphabet = [10, 20, 30, 40, 50];
        let state = BatchState {
            accept_tokens: (0..max_bsz * s)
                .map(|i| [3, 5, 8, 9, 1, 2][(i + trial) % 6])
                .collect(),
            accept_num: (0..max_bsz)
                .map(|b| (b as i32 + trial as i32) % (s as i32 + 3) - 1)
                .collect(),
            stop_flags: (0..max_bsz)
                .map(|b| u8::from(b == 2 && trial % 2 == 0))
                .collect(),
            is_block: (0..max_bsz).map(|b| u8::from(b == 3)).collect(),
            prompt_lens: (0..max_bsz)
                .map(|b| [6, 10, 0, 30, -1, 8, 12, 5, 7][b])
                .collect(),
            step_idx: (0..max_bsz)
                .map(|b| [4, 3, 0, 2, 5, 20, 9, 1, 6][(b + trial) % 9])
                .collect(),
            max_dec_len: (0..max_bsz)
                .map(|b| [10, 5, 100, 7, 6, 3, 12, 2, 30][b])
                .collect(),
            infer_seed: slot_seed.clone(),
            draft_tokens: (0..max_bsz * s).map(|i| 100 + i as i32).collect(),
            decoder: (0..max_bsz)
                .map(|b| if b == 1 { i32::MAX - 1 } else { b as i32 * 10 })
                .collect(),
            token_ids_all: (0..max_bsz * max_model_len)
                .map(|_| alphabet[(rng.next_u64() % alphabet.len() as u64) as usize])
                .collect(),
            draft_token_num: (0..max_bsz)
                .map(|b| [3, 1, 0, 5, -1, 3, 2, 3, 3][b])
                .collect(),
            this_time,
            encoder,
        };
        let (this_time, encoder) = (&state.this_time, &state.encoder);
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

        work.write_each(&[
            ("this_time.bin", this_time),
            ("encoder.bin", encoder),
            ("slot_top_k.bin", &slot_top_k),
            ("accept_tokens.bin", &state.accept_tokens),
            ("prompt_lens.bin", &state.prompt_lens),
            ("max_dec_len.bin", &state.max_dec_len),
            ("accept_num.bin", &state.accept_num),
            ("token_ids_all.bin", &state.token_ids_all),
            ("step_idx.bin", &state.step_idx),
            ("draft_tokens.bin", &state.draft_tokens),
            ("decoder.bin", &state.decoder),
            ("draft_token_num.bin", &state.draft_token_num),
            ("end_tokens.bin", &end_tokens),
        ]);
        work.write("slot_top_p.bin", &slot_top_p);
        work.write("slot_temperature.bin", &slot_temperature);
        work.write("slot_seed.bin", &slot_seed);
        work.write("infer_seed.bin", &state.infer_seed);
        work.write("stop_flags.bin", &state.stop_flags);
        work.write("is_block_step.bin", &state.is_block);
        work.write("hidden.bin", &hidden_bytes);
        let args: [&dyn Display; 11] = [
            &max_bsz,
            &real_bsz,
            &s,
            &capacity,
            &(hidden * 4),
            &token_num,
            &max_model_len,
            &threshold,
            &min_n,
            &max_n,
            &end_tokens.len(),
        ];
        work.run(&bin, "batch", &args);
        let expect = Expect::new(&work, &cpu, format!("batch trial {trial}"));
        let dims = BatchDims::new(max_bsz, real_bsz, s);
        let (tt, en) = (up(&cpu, this_time), up(&cpu, encoder));
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
        expect.same::<i32>("seq_lens_output.out", &seq_lens_output, "seq_lens_output");
        expect.same::<i32>("cu_in.out", &cu_in, "cu_seqlens_q");
        expect.same::<i32>("cu_out.out", &cu_out, "cu_seqlens_q_output");
        expect.same::<i32>("batch_id.out", &batch_id, "batch_id");
        let layout = OutputLayout {
            cu_seqlens_q_output: &cu_out,
            batch_id_per_token_output: &batch_id,
        };

        let (stp, stk) = (up(&cpu, &slot_top_p), up(&cpu, &slot_top_k));
        let (stt, sts) = (up(&cpu, &slot_temperature), up(&cpu, &slot_seed));
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
        expect.same::<u32>("top_p.out", &top_p, "top_p");
        expect.same::<i32>("top_k.out", &top_k, "top_k");
        expect.same::<u32>("temperature.out", &temperature, "temperature");
        expect.same::<u64>("seed.out", &seed, "seeds");

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
            let what = format!("gather (speculative {speculative})");
            expect.same::<u8>(file, &out, &what);
        }
        check_update_state(&expect, &state, dims, max_model_len, &end_tokens);
        check_token_counts(
            &work,
            &args,
            &state,
            dims,
            max_model_len,
            &end_tokens,
            trial,
        );
        check_ngram_match(
            &expect,
            &state,
            dims,
            max_model_len,
            (min_n, max_n, threshold),
        );
    }
    softmax_kernels_match_the_cpu_reference(&work, &cpu, &mut rng);
}

/// `update_state` on fresh copies of the trial's state: the driver's `u_*` outputs.
fn check_update_state(
    expect: &Expect<'_>,
    state: &BatchState,
    dims: BatchDims,
    max_model_len: usize,
    end_tokens: &[i32],
) {
    let params = UpdateStateParams {
        dims,
        max_model_len,
        vocab: 0,
    };
    let updated = update_state_on(expect.dev, state, end_tokens, None, &params);
    updated.expect(expect);
}

/// `update_state` with `token_counts` (hostile counts: negative, near and at `i32::MAX`; tokens
/// outside the vocabulary) on fresh copies of the trial's state, against the reference: the
/// driver's `counts` run.
fn check_token_counts(
    work: &Workdir,
    batch_args: &[&dyn Display; 11],
    state: &BatchState,
    dims: BatchDims,
    max_model_len: usize,
    end_tokens: &[i32],
    trial: usize,
) {
    // accept_tokens draw from [1, 9]: tokens 8 and 9 lie outside a vocabulary of 7 or 8.
    let vocab = 7 + trial % 2;
    let counts: Vec<i32> = (0..dims.max_bsz * vocab)
        .map(|i| [0, 3, -4, i32::MAX, i32::MAX - 1, 1, i32::MIN, 0][(i + trial) % 8])
        .collect();
    work.write("token_counts.bin", &counts);
    let mut args: Vec<&dyn Display> = batch_args.to_vec();
    args.push(&vocab);
    work.run(&driver(DType::F32), "counts", &args);
    let dev = ReferenceDevice::new();
    let params = UpdateStateParams {
        dims,
        max_model_len,
        vocab,
    };
    let updated = update_state_on(&dev, state, end_tokens, Some(&counts), &params);
    let label = format!("update_state with token_counts, trial {trial}");
    updated.expect(&Expect::new(work, &dev, label));
}

/// The decode state of a batch trial after `update_state` on a device.
struct Updated {
    accept_num: Buffer,
    stop_flags: Buffer,
    token_ids_all: Buffer,
    step_idx: Buffer,
    infer_seed: Buffer,
    draft_tokens: Buffer,
    encoder: Buffer,
    decoder: Buffer,
    token_counts: Option<Buffer>,
}

impl Updated {
    /// The driver's `u_*` outputs are this state.
    fn expect(&self, expect: &Expect<'_>) {
        if let Some(counts) = &self.token_counts {
            expect.same::<i32>("u_token_counts.out", counts, "token_counts");
        }
        expect.same::<i32>("u_accept_num.out", &self.accept_num, "accept_num");
        expect.same::<u8>("u_stop_flags.out", &self.stop_flags, "stop_flags");
        expect.same::<i32>("u_token_ids_all.out", &self.token_ids_all, "token_ids_all");
        expect.same::<i32>("u_step_idx.out", &self.step_idx, "step_idx");
        expect.same::<u64>("u_infer_seed.out", &self.infer_seed, "infer_seed");
        expect.same::<i32>("u_draft_tokens.out", &self.draft_tokens, "draft_tokens");
        expect.same::<i32>("u_encoder.out", &self.encoder, "encoder");
        expect.same::<i32>("u_decoder.out", &self.decoder, "decoder");
    }
}

/// `update_state` on `dev` of fresh copies of `state` (with `token_counts` where given).
fn update_state_on(
    dev: &dyn Device,
    state: &BatchState,
    end_tokens: &[i32],
    counts: Option<&[i32]>,
    params: &UpdateStateParams,
) -> Updated {
    let (at, ib, pl) = (
        up(dev, &state.accept_tokens),
        up(dev, &state.is_block),
        up(dev, &state.prompt_lens),
    );
    let (md, et) = (up(dev, &state.max_dec_len), up(dev, end_tokens));
    let mut out = uploaded!(Updated {
        from state on dev: accept_num, stop_flags, token_ids_all, step_idx, infer_seed,
            draft_tokens, encoder, decoder;
        token_counts: counts.map(|c| up(dev, c)),
    });
    dev.update_state(
        &UpdateStateInputs {
            accept_tokens: &at,
            is_block_step: &ib,
            prompt_lens: &pl,
            max_dec_len: &md,
            end_tokens: &et,
        },
        &mut DecodeState {
            accept_num: &mut out.accept_num,
            stop_flags: &mut out.stop_flags,
            token_ids_all: &mut out.token_ids_all,
            step_idx: &mut out.step_idx,
            infer_seed: &mut out.infer_seed,
            draft_tokens: &mut out.draft_tokens,
            seq_lens_encoder: &mut out.encoder,
            seq_lens_decoder: &mut out.decoder,
            token_counts: out.token_counts.as_mut(),
        },
        params,
    )
    .expect("update_state");
    out
}

/// `ngram_match` on fresh copies of the trial's state: the driver's `n_*` outputs.
fn check_ngram_match(
    expect: &Expect<'_>,
    state: &BatchState,
    dims: BatchDims,
    max_model_len: usize,
    (min_ngram_size, max_ngram_size, threshold): (usize, usize, usize),
) {
    let cpu = expect.dev;
    let (tia, pl, si) = (
        up(cpu, &state.token_ids_all),
        up(cpu, &state.prompt_lens),
        up(cpu, &state.step_idx),
    );
    let (dtn, en, md) = (
        up(cpu, &state.draft_token_num),
        up(cpu, &state.encoder),
        up(cpu, &state.max_dec_len),
    );
    let mut dt = up(cpu, &state.draft_tokens);
    let mut tt = up(cpu, &state.this_time);
    cpu.ngram_match(
        &NgramInputs {
            token_ids_all: &tia,
            prompt_lens: &pl,
            step_idx: &si,
            draft_token_num: &dtn,
            seq_lens_encoder: &en,
            max_dec_len: &md,
        },
        &mut NgramOutputs {
            draft_tokens: &mut dt,
            seq_lens_this_time: &mut tt,
        },
        &NgramParams {
            dims,
            max_model_len,
            max_ngram_size,
            min_ngram_size,
            threshold,
        },
    )
    .expect("ngram");
    expect.same::<i32>("n_draft_tokens.out", &dt, "ngram draft_tokens");
    expect.same::<i32>("n_this_time.out", &tt, "ngram seq_lens_this_time");
}

/// `softmax`, tolerance-compared.
fn softmax_kernels_match_the_cpu_reference(work: &Workdir, cpu: &CpuDevice, rng: &mut Rng) {
    for dtype in [DType::F32, DType::BF16] {
        let bin = driver(dtype);
        let (rows, vocab) = (6usize, 333usize);
        let mut logits: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.unit_f32() * 20.0 - 10.0)
            .collect();
        logits[vocab + 5] = f32::INFINITY;
        logits[vocab + 9] = f32::INFINITY;
        logits[2 * vocab..3 * vocab]
            .iter_mut()
            .for_each(|x| *x = f32::NEG_INFINITY);
        logits[3 * vocab + 7] = f32::NAN;
        let bytes = score_bytes(&logits, dtype);
        let temperature = vec![1.0f32, 0.5, 1.0, 0.0, f32::NAN, f32::INFINITY];
        work.write("probs.bin", &bytes);
        work.write("temperature.bin", &temperature);
        work.run(&bin, "softmax", &[&rows, &vocab, &0]);
        let lg = cpu.upload_bytes(dtype, &bytes).expect("u");
        let tp = up(cpu, &temperature);
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
        let close = |g: f32, w: f32| (g - w).abs() <= 1e-6 + 1e-5 * w.abs();
        Expect::new(work, cpu, format!("{dtype} softmax")).close(
            "probs.out",
            &probs,
            "probs",
            close,
        );
    }
}

/// Whether an emulated value is the contract's: equal (infinities and zeros exactly), or within
/// the f32 rounding of `exp` and `log`.
fn close_to(got: f32, want: f32) -> bool {
    got == want || (got - want).abs() <= 1e-6 * want.abs()
}

/// `softmax` and `accept_logprobs` scale `(l − m) / T`, subtracting the row maximum first (contract
/// §5.5): with a temperature so small that `l / T` overflows, the row still tends to the one-hot
/// of `T = 0` (uniform over a tied maximum) instead of spreading over every overflowing entry.
fn scaled_logits_subtract_the_row_maximum_first() {
    let work = Workdir::new("scaling");
    let bin = driver(DType::F32);
    let vocab = 8usize;
    // Row 0: a unique maximum at id 5; row 1: the maximum tied at ids 2 and 6. Every positive
    // logit divided by its row's temperature first would be +inf.
    let logits: Vec<f32> = vec![
        1e9, 2e9, 3e9, 4e9, 5e9, 9e9, 6e9, 7e9, //
        10.0, 20.0, 50.0, 30.0, 40.0, 5.0, 50.0, 45.0,
    ];
    let temperature = [1e-30f32, 1e-37];
    let rows = temperature.len();
    let stats: Vec<(f32, f32)> = logits
        .chunks(vocab)
        .zip(temperature)
        .map(|(row, t)| {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum = row
                .iter()
                .map(|&x| fixtures::scaled_logit(x, m, t).exp())
                .sum();
            (m, sum)
        })
        .collect();
    work.write("probs.bin", &logits);
    work.write("temperature.bin", &temperature);

    work.run(&bin, "softmax", &[&rows, &vocab, &0]);
    let probs = work.read::<f32>("probs.out");
    assert_eq!(&probs[..vocab], &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    assert_eq!(&probs[vocab..], &[0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.5, 0.0]);

    // accept_logprobs: slot b (decode, one row) accepted the token `tokens[b]`, with the top 3.
    let (tokens, k) = ([5i32, 2], 3usize);
    work.write("accept_tokens.bin", &tokens);
    work.write("accept_num.bin", &[1i32, 1]);
    work.write("encoder.bin", &[0i32, 0]);
    work.write("cu_out.bin", &[0i32, 1, 2]);
    work.run(&bin, "logprobs", &[&rows, &vocab, &0, &rows, &rows, &1, &k]);
    let logprob = |r: usize, id: usize| {
        let (m, sum) = stats[r];
        fixtures::scaled_logit(logits[r * vocab + id], m, temperature[r]) - sum.ln()
    };
    let lps = work.read::<f32>("logprobs.out");
    let top_ids = work.read::<i32>("top_ids.out");
    let top_lps = work.read::<f32>("top_logprobs.out");
    assert_eq!(work.read::<i32>("ranks.out"), vec![1, 1]);
    assert_eq!(top_ids, vec![5, 7, 6, 2, 6, 7]);
    for r in 0..rows {
        let want = logprob(r, tokens[r] as usize);
        assert!(
            close_to(lps[r], want),
            "row {r}: logprob {} != {want}",
            lps[r]
        );
        for (j, &id) in top_ids[r * k..(r + 1) * k].iter().enumerate() {
            let (got, want) = (top_lps[r * k + j], logprob(r, id as usize));
            assert!(
                close_to(got, want),
                "row {r}: top logprob of {id} {got} != {want}"
            );
        }
    }
    assert_eq!(lps[0], 0.0, "the unique maximum holds all the mass");
    assert_eq!(top_lps[1], f32::NEG_INFINITY, "(7e9 − 9e9) / 1e-30 is −inf");
}

/// At `T = +inf` every finite logit scales to 0 (`docs/semantics.md` §5.5), even where `l − m` overflows f32:
/// the row is uniform over its finite logits, and -inf and NaN logits get nothing.
fn an_infinite_temperature_is_uniform_over_the_finite_logits() {
    let work = Workdir::new("infinite-temperature");
    let bin = driver(DType::F32);
    let logits = [3.0e38f32, -3.0e38, 0.0, f32::NEG_INFINITY, f32::NAN, -1.0];
    work.write("probs.bin", &logits);
    work.write("temperature.bin", &[f32::INFINITY]);
    work.run(&bin, "softmax", &[&1usize, &logits.len(), &0]);
    let quarter = 0.25f32;
    assert_eq!(
        work.read::<f32>("probs.out"),
        vec![quarter, quarter, quarter, 0.0, 0.0, quarter]
    );
}

/// A `process_logits` case of `fixtures` with every slot kind (decode rows at several positions
/// with repeated drafts, prefill rows, padding rows), every rule on, and when `hostile`, garbage in
/// every buffer; its rows are the emulator tests' row kinds ([`logit_rows`], [`rows`]) at
/// temperatures of every kind ([`temperatures`]).
fn process_case(
    rng: &mut Rng,
    dtype: DType,
    logits: bool,
    vocab: usize,
    hostile: bool,
) -> ProcessCase {
    let fx = &mut Rng(rng.next_u64());
    let spec = fixtures::Spec {
        shape: fixtures::Shape::slots(fx, vocab),
        dtype,
        logits,
        hostile,
        layout: Some(fixtures::Layout::SlotKinds),
    };
    let mut case = ProcessCase::random(fx, &spec);
    case.scores = if logits {
        kinded_logit_rows(rng, case.rows, vocab)
    } else {
        kinded_prob_rows(rng, case.rows, vocab)
    };
    case.temperature = temperature_kinds(case.rows, rng.next_u64() as usize % 12);
    case
}

/// Writes the inputs of `case` for the driver.
fn write_process_case(work: &Workdir, case: &ProcessCase) {
    work.write("probs.bin", &case.score_bytes());
    work.write("temperature.bin", &case.temperature);
    work.write_each(&[
        ("cu_out.bin", &case.cu_out),
        ("batch_id.bin", &case.batch_id),
        ("token_ids_all.bin", &case.token_ids_all),
        ("prompt_lens.bin", &case.prompt_lens),
        ("step_idx.bin", &case.step_idx),
        ("draft_tokens.bin", &case.draft_tokens),
        ("token_counts.bin", &case.token_counts),
        ("min_tokens.bin", &case.min_tokens),
        ("end_tokens.bin", &case.end_tokens),
        ("bias_offsets.bin", &case.bias_offsets),
        ("bias_ids.bin", &case.bias_ids),
        ("bad_word_offsets.bin", &case.bad_word_offsets),
        ("bad_words.bin", &case.bad_words),
    ]);
    work.write("prompt_mask.bin", &case.prompt_mask);
    work.write("penalties.bin", &case.penalties);
    work.write("bias_values.bin", &case.bias_values);
    if let Some(m) = &case.allowed {
        work.write("allowed.bin", m);
    }
    if let Some(m) = &case.bitmask {
        work.write("bitmask.bin", m);
    }
}

/// The blocks each `process_logits` case runs on: every row, then (with rows) a middle block, the
/// last row alone and an empty block at the end.
fn process_blocks(rows: usize) -> Vec<Option<RowBlock>> {
    let mut blocks = vec![None];
    if rows > 0 {
        let first = rows / 3;
        blocks.extend(
            [
                (first, (rows - first).div_ceil(2)),
                (rows - 1, 1),
                (rows, 0),
            ]
            .map(|(first, rows)| Some(RowBlock { first, rows })),
        );
    }
    blocks
}

/// Runs the driver on `case`: every row, or the rows of `block`; with `slice`, every row of one
/// rank's slice (`probs.bin` then holds the slice's columns of the scores).
fn run_process_case(
    work: &Workdir,
    bin: &Path,
    case: &ProcessCase,
    (block, slice): (Option<RowBlock>, Option<VocabSlice>),
) {
    let d = &case.dims;
    let mut args = vec![
        case.rows,
        case.vocab,
        d.max_bsz,
        d.real_bsz,
        d.max_step_tokens,
        case.max_model_len,
        case.end_tokens.len(),
        case.bias_ids.len(),
        case.bad_words.len(),
        usize::from(case.logits),
        usize::from(case.allowed.is_some()),
        usize::from(case.bitmask.is_some()),
    ];
    if let Some(block) = block {
        args.extend([block.first, block.rows]);
    }
    if let Some(slice) = slice {
        if block.is_none() {
            args.extend([0, case.rows]);
        }
        args.extend([slice.first, slice.len]);
    }
    let args: Vec<&dyn Display> = args.iter().map(|a| a as &dyn Display).collect();
    work.run(bin, "process", &args);
}

/// `process_logits` against the reference, bit for bit: logits and probability rows in f32, f16
/// and bf16, vocabularies of 1, 33 (not a multiple of 32) and 300, ordinary and hostile cases;
/// each case on every row, then on blocks of its rows (a middle block, the last row, an empty
/// block at the end).
fn process_logits_matches_the_reference() {
    let work = Workdir::new("process");
    let dev = ReferenceDevice::new();
    let mut rng = Rng(0x9_40CE55);
    let mut checked = 0usize;
    for dtype in DType::FLOATS {
        let bin = driver(dtype);
        let cases: &[(usize, bool, bool)] = if dtype == DType::F32 {
            &[
                (33, true, false),
                (33, true, true),
                (300, true, true),
                (1, true, true),
                (33, false, true),
                (300, false, false),
                (1, false, true),
                (64, true, true),
            ]
        } else {
            &[(33, true, true), (100, false, true), (1, true, false)]
        };
        for (k, &(vocab, logits, hostile)) in cases.iter().enumerate() {
            let case = process_case(&mut rng, dtype, logits, vocab, hostile);
            write_process_case(&work, &case);
            for block in process_blocks(case.rows) {
                run_process_case(&work, &bin, &case, (block, None));
                let (want, want_fallback) = fixtures::run_process_block(&dev, &case, block)
                    .expect("reference process_logits");
                let got = work.read::<u32>("processed.out");
                let label = format!(
                    "{dtype} process_logits case {k}: vocab {vocab} logits {logits} hostile \
                     {hostile} block {block:?}"
                );
                let RowBlock { first, rows } = block.unwrap_or(RowBlock {
                    first: 0,
                    rows: case.rows,
                });
                assert_eq!(got.len(), rows * vocab, "{label}: processed length");
                for i in 0..rows {
                    let span = i * vocab..(i + 1) * vocab;
                    assert_eq!(
                        got[span.clone()],
                        want[span],
                        "{label}: processed row {i} (scores row {}, slot {})",
                        first + i,
                        case.batch_id[first + i]
                    );
                }
                assert_eq!(
                    work.read::<i32>("fallback.out"),
                    want_fallback,
                    "{label}: fallback"
                );
                checked += rows;
            }
        }
    }
    assert!(checked > 0);
}

/// The slices each `process_logits` slice case runs on: a first and a last part of uneven
/// lengths, and a one-token slice at the end (none for a vocabulary of one token).
fn process_slices(vocab: usize) -> Vec<VocabSlice> {
    if vocab < 2 {
        return Vec::new();
    }
    let cut = vocab / 3 + 1;
    [(0, cut), (cut, vocab - cut), (vocab - 1, 1)]
        .map(|(first, len)| VocabSlice { first, len, vocab })
        .to_vec()
}

/// `process_logits` over one rank's slice of the vocabulary (`docs/semantics.md` §4d) against the
/// reference, bit for bit: every table read by global id, the fallback a global id, no min_p;
/// logits and probability rows in f32, f16 and bf16, ordinary and hostile cases.
fn process_logits_of_a_slice_matches_the_reference() {
    let work = Workdir::new("process-slice");
    let dev = ReferenceDevice::new();
    let mut rng = Rng(0x5_11CE);
    let mut checked = 0usize;
    for dtype in DType::FLOATS {
        let bin = driver(dtype);
        let cases: &[(usize, bool, bool)] = if dtype == DType::F32 {
            &[
                (33, true, false),
                (300, true, true),
                (64, false, true),
                (2, true, true),
            ]
        } else {
            &[(33, true, true), (100, false, true)]
        };
        for (k, &(vocab, logits, hostile)) in cases.iter().enumerate() {
            let case = process_case(&mut rng, dtype, logits, vocab, hostile);
            write_process_case(&work, &case);
            for slice in process_slices(vocab) {
                let cut: Vec<f32> = case
                    .scores
                    .chunks(vocab)
                    .flat_map(|row| row[slice.first..slice.end()].to_vec())
                    .collect();
                work.write("probs.bin", &fixtures::score_bytes(&cut, dtype));
                run_process_case(&work, &bin, &case, (None, Some(slice)));
                let (want, want_fallback) = fixtures::run_process_slice(&dev, &case, slice)
                    .expect("reference process_logits of a slice");
                let label = format!(
                    "{dtype} process_logits slice case {k}: vocab {vocab} logits {logits} \
                     hostile {hostile} slice {slice:?}"
                );
                assert_eq!(
                    work.read::<u32>("processed.out"),
                    want,
                    "{label}: processed"
                );
                assert_eq!(
                    work.read::<i32>("fallback.out"),
                    want_fallback,
                    "{label}: fallback"
                );
                checked += case.rows;
            }
        }
    }
    assert!(checked > 0);
}
