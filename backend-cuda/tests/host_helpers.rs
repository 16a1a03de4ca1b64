//! The exact-arithmetic helpers of `kernels/common.cuh` (Philox, draws, seeds, fixed-point
//! weights, top-p, the 128-bit helpers) compiled for the host with g++ behind a small shim, and
//! compared bit for bit with `specula-backend-api` on many inputs. This runs on machines without a
//! GPU; it is skipped (with a message) when no C++ compiler is found.

use std::process::{Command, Stdio};

use specula_backend_api::fixed_point::{
    key_weight, rank_key, reaches_top_p, scale_draw, top_p_fixed, top_p_target_mass,
};
use specula_backend_api::rng::{Purpose, draw, row_seed};

const SHIM: &str = r#"
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#include <math.h>
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx, blockIdx, blockDim;
inline void __syncthreads() {}
template <class T> T __shfl_xor_sync(unsigned, T v, int) { return v; }
template <class T> T __shfl_up_sync(unsigned, T v, int) { return v; }
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
using std::isnan;
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

fn defines() -> String {
    specula_backend_cuda::kernels::defines()
        .into_iter()
        .map(|(name, value)| format!("#define {name} {value}\n"))
        .collect()
}

/// A deterministic stream of u64 values.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = self.0;
        x ^ (x >> 29)
    }
}

#[test]
fn common_helpers_match_the_reference_bit_for_bit() {
    let compiler = ["g++", "c++", "clang++"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok());
    let Some(compiler) = compiler else {
        eprintln!("skipped: no C++ compiler found for the host build of common.cuh");
        return;
    };
    let common = specula_backend_cuda::kernels::COMMON.replace(
        "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));",
        "f = 0.0f; (void)h;",
    );
    let source = format!("{}{SHIM}{common}{MAIN}", defines());
    let dir = std::env::temp_dir().join(format!("specula-host-helpers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("helpers.cpp");
    let bin = dir.join("helpers");
    std::fs::write(&src, source).expect("write source");
    let built = Command::new(compiler)
        .args(["-std=c++17", "-O1", "-w", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run the compiler");
    assert!(
        built.status.success(),
        "host build of common.cuh failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );

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

    // Inputs go through a file: feeding a pipe while the child fills the other would deadlock.
    let queries_path = dir.join("queries.txt");
    std::fs::write(&queries_path, &input).expect("write queries");
    let output = Command::new(&bin)
        .stdin(Stdio::from(
            std::fs::File::open(&queries_path).expect("open queries"),
        ))
        .output()
        .expect("run the helper binary");
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<&str> = std::str::from_utf8(&output.stdout)
        .expect("utf8")
        .lines()
        .collect();
    let queries: Vec<&str> = input.lines().collect();
    assert_eq!(got.len(), expected.len(), "one answer per query");
    for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "query {:?}", queries[k]);
    }
}
