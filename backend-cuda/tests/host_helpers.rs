//! The exact-arithmetic helpers of `kernels/common.cuh` (Philox, draws, seeds, fixed-point
//! weights, top-p, the 128- and 192-bit helpers, the weights from logits of `docs/semantics.md` §4b and the
//! candidates' scores) compiled for the host behind the emulator's intrinsics, and
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
use specula_backend_api::logit_weights::row_weights;
use specula_backend_api::rng::{Purpose, draw, row_seed};

use specula_reference::fixtures::Rng;

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
            const u192 lhs = u192_mul_128x64(mul_64x64(u, wq), wpt);
            const u192 rhs = u192_shl_128(mul_64x64(wp, wqt), 32);
            printf("%d\n", u192_lt(lhs, rhs) ? 1 : 0);
        }
        else if (!strcmp(op, "lrow")) {
            // The weights of a logits row (f32 bits) at temperature t (f32 bits), as the sampling
            // kernels weigh it: the maximum (largest rank key, lowest id), then each token's key.
            unsigned long long t, n;
            scanf("%llu %llu", &t, &n);
            float row[64];
            u64 best = 0;
            for (u64 i = 0; i < n; ++i) {
                scanf("%llu", &a);
                row[i] = __uint_as_float((u32)a);
                const u64 packed = pack_key_id(logit_rank_key(row[i]), (u32)i);
                best = packed > best ? packed : best;
            }
            const Weigh w = logits_weigh((u32)(best >> 32), packed_id(best), __uint_as_float((u32)t));
            for (u64 i = 0; i < n; ++i) printf(i == 0 ? "%llu" : " %llu", weight_of(w, row_key(w, row[i], (u32)i)));
            printf("\n");
        }
        else if (!strcmp(op, "score")) {
            scanf("%llu %llu", &a, &b);
            printf("%u\n", __float_as_uint(candidate_score(a, b)));
        }
        else if (!strcmp(op, "shr")) {
            // floor((a · b) / 2^c), c < 64, known to fit.
            scanf("%llu %llu %llu", &a, &b, &c);
            printf("%llu\n", u128_shr_fit(mul_64x64(a, b), (u32)c));
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
    let mut rng = Rng(0x5eed);
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
    floats.extend((0..2000).map(|_| rng.next_u64() as u32));
    floats.extend((0..2000).map(|_| (rng.next_u64() as u32) % 0x3f80_0001));
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
            _ => rng.next_u64(),
        };
        let purpose = [
            Purpose::Sample,
            Purpose::Candidate,
            Purpose::Accept,
            Purpose::Residual,
        ][(i % 4) as usize];
        input += &format!("draw {seed} {}\n", purpose as u32);
        expected.push(draw(seed, purpose).to_string());
        let mass = rng.next_u64() >> (rng.next_u64() % 64);
        input += &format!("scale {seed} {mass}\n");
        expected.push(scale_draw(seed, mass).to_string());
        let j = rng.next_u64() % 1024;
        input += &format!("seed {seed} {j}\n");
        expected.push(row_seed(seed, j).to_string());
        let p = 1 + rng.next_u64() % (1 << 24);
        let w = rng.next_u64() >> 4; // up to 2^60
        input += &format!("target {p} {w}\n");
        expected.push(top_p_target_mass(p, w).to_string());
        let c = rng.next_u64() >> 4;
        let c = if i % 3 == 0 {
            top_p_target_mass(p, w) - (i % 2)
        } else {
            c
        };
        input += &format!("reach {c} {p} {w}\n");
        expected.push(u8::from(reaches_top_p(c, p, w)).to_string());
        // The REJECTION residual and acceptance test, against u128.
        let (wp, wqt, wq) = (
            rng.next_u64() >> 24,
            rng.next_u64() >> 23,
            rng.next_u64() >> 24,
        );
        input += &format!("mulsub {wp} {wqt} {wq}\n");
        let x = u128::from(wp) * u128::from(wqt);
        let y = u128::from(wq) * u128::from(wqt / 2 + 1);
        expected.push((x.saturating_sub(y) >> 41).to_string());
        let u = rng.next_u64() >> 32;
        let (wq_d, wp_total, wp_d, wq_total) = (
            rng.next_u64() >> 24,
            rng.next_u64() >> 23,
            rng.next_u64() >> 24,
            rng.next_u64() >> 23,
        );
        input += &format!("accept {u} {wq_d} {wp_total} {wp_d} {wq_total}\n");
        let lhs = u128::from(u) * u128::from(wq_d) * u128::from(wp_total);
        let rhs = (u128::from(wp_d) * u128::from(wq_total)) << 32;
        expected.push(u8::from(lhs < rhs).to_string());
        // The same test on logits rows: weights up to 2^40, totals up to 2^60 (products to 2^133).
        let u = rng.next_u64() >> 32;
        let (wq_d, wp_d) = (rng.next_u64() >> 24, rng.next_u64() >> 24);
        let wp_total = if i % 5 == 0 {
            1 << 60
        } else {
            rng.next_u64() >> 4
        };
        let wq_total = if i % 7 == 0 {
            exact_accept_tie(u, wq_d, wp_total, wp_d)
        } else {
            rng.next_u64() >> 4
        };
        input += &format!("accept {u} {wq_d} {wp_total} {wp_d} {wq_total}\n");
        expected.push(u8::from(accepts_exactly(u, wq_d, wp_total, wp_d, wq_total)).to_string());
        // The residual's division by 2^k, k from 0 (logits rows) to 63.
        let (a, b, k) = (
            rng.next_u64() >> 24,
            rng.next_u64() >> 4,
            rng.next_u64() % 64,
        );
        let x = (u128::from(a) * u128::from(b)) >> k;
        if x <= u128::from(u64::MAX) {
            input += &format!("shr {a} {b} {k}\n");
            expected.push(x.to_string());
        }
        // Candidate scores: q = floor(w · 2^40 / W) cut to 24 bits, times 2^-40.
        let total = (rng.next_u64() >> (4 + rng.next_u64() % 20)).max(1);
        let w = match i % 4 {
            0 => total,
            1 => 0,
            _ => rng.next_u64() % (total.min(1 << 40) + 1),
        };
        input += &format!("score {w} {total}\n");
        expected.push(candidate_score(w, total).to_bits().to_string());
    }
    for i in 0..2000usize {
        // Logits rows of every kind at every kind of temperature.
        let n = 1 + i % 12;
        let row: Vec<f32> = (0..n).map(|_| hostile_logit(&mut rng)).collect();
        let t = [
            1.0f32,
            0.0,
            -0.0,
            0.7,
            2.5,
            f32::INFINITY,
            f32::NAN,
            -1.0,
            1e-30,
            1e30,
            f32::from_bits(1),
            f32::MAX,
        ][i % 12];
        let t = if i % 13 == 12 {
            f32::from_bits(rng.next_u64() as u32 & 0x7fff_ffff)
        } else {
            t
        };
        input += &format!("lrow {} {n}", t.to_bits());
        for l in &row {
            input += &format!(" {}", l.to_bits());
        }
        input += "\n";
        let weights: Vec<String> = row_weights(&row, t)
            .iter()
            .map(|w| format!("{w} "))
            .collect();
        expected.push(weights.concat().trim_end().to_owned());
    }

    (input, expected)
}

/// A logit of every kind: ordinary, tied, ±inf, NaN, tiny, huge, subnormal, ±0, any bits.
fn hostile_logit(rng: &mut Rng) -> f32 {
    let u = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
    match rng.next_u64() % 16 {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        3 => 1e-30,
        4 => -1e30,
        5 => f32::from_bits(1),
        6 => -0.0,
        7 => 0.0,
        8 => f32::from_bits(rng.next_u64() as u32),
        9 => 3e19,
        10 => (u * 4.0).floor(),
        _ => u * 40.0 - 20.0,
    }
}

/// `u · wq · Wp < 2^32 · wp · Wq`, exact (products up to 2^133), as the reference computes it.
fn accepts_exactly(u: u64, wq: u64, wp_total: u64, wp: u64, wq_total: u64) -> bool {
    let a = u128::from(wq) * u128::from(wp_total);
    let low = (a & u128::from(u64::MAX)) * u128::from(u);
    let lhs = ((a >> 64) * u128::from(u) + (low >> 64), low as u64);
    let b = u128::from(wp) * u128::from(wq_total);
    let rhs = (b >> 32, ((b & 0xffff_ffff) << 32) as u64);
    lhs < rhs
}

/// A draft total that makes both sides of the acceptance test nearly equal (or equal).
fn exact_accept_tie(u: u64, wq: u64, wp_total: u64, wp: u64) -> u64 {
    if wp == 0 {
        return 1;
    }
    let tie = u as f64 * wq as f64 * wp_total as f64 / (1u64 << 32) as f64 / wp as f64;
    (tie as u64).min(u64::MAX >> 4)
}

/// The reference's score of a logits candidate of weight `w` in a row of total `total`.
fn candidate_score(w: u64, total: u64) -> f32 {
    let q = ((u128::from(w) << 40) / u128::from(total)) as u64;
    let low_bits = (64 - q.leading_zeros()).saturating_sub(24);
    let q = q >> low_bits << low_bits;
    (q as f64 / (1u64 << 40) as f64) as f32
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
