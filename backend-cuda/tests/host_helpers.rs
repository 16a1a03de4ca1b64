//! The exact-arithmetic helpers of `kernels/common.cuh` (Philox, draws, seeds, fixed-point
//! weights, top-p, the 128-bit helpers) compiled for the host behind the emulator's intrinsics, and
//! compared bit for bit with `specula-backend-api` on many inputs. This runs on machines without a
//! GPU. It needs a C++17 compiler (`g++`, `c++` or `clang++`): without one the test is ignored with
//! the reason, and fails when `SPECULA_REQUIRE` names `g++`.

#[path = "emulator/host.rs"]
mod host;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use specula_backend_api::testing::{self, Needs};

use specula_backend_api::fixed_point::{
    key_weight, rank_key, reaches_top_p, scale_draw, top_p_fixed, top_p_target_mass,
};
use specula_backend_api::rng::{Purpose, draw, row_seed};

use host::Lcg;

/// One host thread calls the helpers: the block collectives of `common.cuh` compile against
/// these and are never called.
const ONE_THREAD: &str = r#"
inline void __syncthreads() {}
template <class T> T __shfl_xor_sync(unsigned, T v, int) { return v; }
template <class T> T __shfl_up_sync(unsigned, T v, int) { return v; }
"#;

const MAIN: &str = r#"
int main() {
    char op[32];
    while (scanf("%31s", op) == 1) {
        unsigned long long a, b, c;
        if (!strcmp(op, "draw")) { scanf("%llu %llu", &a, &b); printf("%llu\n", specula_draw(a, (u32)b)); }
        else if (!strcmp(op, "scale")) { scanf("%llu %llu", &a, &b); printf("%llu\n", scale_draw(a, b)); }
        else if (!strcmp(op, "seed")) { scanf("%llu %llu", &a, &b); printf("%llu\n", row_seed(a, b)); }
        else if (!strcmp(op, "key")) { scanf("%llu", &a); float f = __uint_as_float((u32)a); printf("%u %llu\n", rank_key(f), key_weight(rank_key(f))); }
        else if (!strcmp(op, "topp")) { scanf("%llu", &a); printf("%llu\n", top_p_fixed(__uint_as_float((u32)a))); }
        else if (!strcmp(op, "target")) { scanf("%llu %llu", &a, &b); printf("%llu\n", top_p_target_mass(a, b)); }
        else if (!strcmp(op, "reach")) { scanf("%llu %llu %llu", &a, &b, &c); printf("%d\n", reaches_top_p(a, b, c) ? 1 : 0); }
        else if (!strcmp(op, "mulsub")) {
            // ((a·b) − (b·c)) >> 41 when a·b > b·c, else 0 (the REJECTION residual).
            scanf("%llu %llu %llu", &a, &b, &c);
            const u128 x = mul_64x64(a, b), y = mul_64x64(c, b / 2 + 1);
            printf("%llu\n", u128_lt(y, x) ? u128_shr_lo(u128_sub(x, y), 41) : 0ull);
        }
        else if (!strcmp(op, "accept")) {
            // u · wq · wp_total < (wp · wq_total) << 32, as verify_draft_tokens.cu computes it.
            unsigned long long u, wq, wpt, wp, wqt;
            scanf("%llu %llu %llu %llu %llu", &u, &wq, &wpt, &wp, &wqt);
            const u128 lhs = u128_mul_u64(mul_64x64(u, wq), wpt);
            const u128 rhs = u128_shl(mul_64x64(wp, wqt), 32);
            printf("%d\n", u128_lt(lhs, rhs) ? 1 : 0);
        }
    }
    return 0;
}
"#;

fn main() -> ExitCode {
    let compiler = host::compiler("c++17");
    let needs = Needs::new("g++", compiler.clone().map(|_| ()));
    testing::run(
        &needs,
        vec![(
            "common_helpers_match_the_reference_bit_for_bit",
            Box::new(move || common_helpers_match_the_reference_bit_for_bit(compiler?)),
        )],
    )
}

/// Builds `common.cuh` for one host thread, with the query loop, into `dir`; returns the binary.
fn build_helpers(compiler: &str, dir: &Path) -> Result<PathBuf, String> {
    let source = format!(
        "{}{}{ONE_THREAD}{}{MAIN}",
        host::defines(),
        host::INTRINSICS,
        host::host_common()
    );
    host::build(compiler, "c++17", &[], dir, "helpers", &source)
}

/// The queries for the helper binary (one per line) and the answers the reference gives.
fn queries() -> (String, Vec<String>) {
    let mut rng = Lcg(0x5eed);
    let mut input = String::new();
    let mut expected: Vec<String> = Vec::new();
    let specials = [
        0u32,
        0x8000_0000,
        0x3f80_0000,
        0x4000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x2b80_0000,
        0x2b7f_ffff,
        0x0000_0001,
        0x3f7f_ffff,
        0xbf00_0000,
    ];
    let mut floats: Vec<u32> = specials.to_vec();
    floats.extend((0..2000).map(|_| rng.next() as u32));
    floats.extend((0..2000).map(|_| (rng.next() as u32) % 0x3f80_0001));
    for bits in floats {
        input += &format!("key {bits}\n");
        let key = rank_key(f32::from_bits(bits));
        expected.push(format!("{key} {}", key_weight(key)));
        input += &format!("topp {bits}\n");
        expected.push(top_p_fixed(f32::from_bits(bits)).to_string());
    }
    for i in 0..3000u64 {
        let seed = match i {
            0 => 0,
            1 => u64::MAX,
            _ => rng.next(),
        };
        let purpose = [
            Purpose::Sample,
            Purpose::Candidate,
            Purpose::Accept,
            Purpose::Residual,
        ][(i % 4) as usize];
        input += &format!("draw {seed} {}\n", purpose as u32);
        expected.push(draw(seed, purpose).to_string());
        let mass = rng.next() >> (rng.next() % 64);
        input += &format!("scale {seed} {mass}\n");
        expected.push(scale_draw(seed, mass).to_string());
        let j = rng.next() % 1024;
        input += &format!("seed {seed} {j}\n");
        expected.push(row_seed(seed, j).to_string());
        let p = 1 + rng.next() % (1 << 24);
        let w = rng.next() >> 4; // up to 2^60
        input += &format!("target {p} {w}\n");
        expected.push(top_p_target_mass(p, w).to_string());
        let c = rng.next() >> 4;
        let c = if i % 3 == 0 {
            top_p_target_mass(p, w) - (i % 2)
        } else {
            c
        };
        input += &format!("reach {c} {p} {w}\n");
        expected.push(u8::from(reaches_top_p(c, p, w)).to_string());
        // The REJECTION residual and acceptance test, against u128.
        let (wp, wqt, wq) = (rng.next() >> 24, rng.next() >> 23, rng.next() >> 24);
        input += &format!("mulsub {wp} {wqt} {wq}\n");
        let x = u128::from(wp) * u128::from(wqt);
        let y = u128::from(wq) * u128::from(wqt / 2 + 1);
        expected.push((x.saturating_sub(y) >> 41).to_string());
        let u = rng.next() >> 32;
        let (wq_d, wp_total, wp_d, wq_total) = (
            rng.next() >> 24,
            rng.next() >> 23,
            rng.next() >> 24,
            rng.next() >> 23,
        );
        input += &format!("accept {u} {wq_d} {wp_total} {wp_d} {wq_total}\n");
        let lhs = u128::from(u) * u128::from(wq_d) * u128::from(wp_total);
        let rhs = (u128::from(wp_d) * u128::from(wq_total)) << 32;
        expected.push(u8::from(lhs < rhs).to_string());
    }

    (input, expected)
}

fn common_helpers_match_the_reference_bit_for_bit(compiler: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("specula-host-helpers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
    let bin = build_helpers(compiler, &dir)?;
    let (input, expected) = queries();
    // Inputs go through a file: feeding a pipe while the child fills the other would deadlock.
    let queries_path = dir.join("queries.txt");
    std::fs::write(&queries_path, &input).map_err(|e| format!("write queries: {e}"))?;
    let stdin = std::fs::File::open(&queries_path).map_err(|e| format!("open queries: {e}"))?;
    let output = Command::new(&bin)
        .stdin(Stdio::from(stdin))
        .output()
        .map_err(|e| format!("run the helper binary: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<&str> = std::str::from_utf8(&output.stdout)
        .map_err(|e| format!("helper output: {e}"))?
        .lines()
        .collect();
    let lines: Vec<&str> = input.lines().collect();
    assert_eq!(got.len(), expected.len(), "one answer per query");
    for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "query {:?}", lines[k]);
    }
    Ok(())
}
