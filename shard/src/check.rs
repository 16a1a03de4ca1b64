//! Checks of sharded sampling against the unsharded reference device, shared by the unit tests
//! (thread groups) and the `shard_check` example (MPI processes under `mpirun`): random rows and
//! the rows of the conformance shapes, every slice of a partition, every rank's tokens equal to
//! the unsharded op's.

use specula_backend_api::ops::{
    CandidatesInputs, CandidatesOutputs, CandidatesParams, RowShape, SampleInputs, SampleParams,
    Scores, VocabSlice,
};
use specula_backend_api::{Device, DeviceExt};

use crate::error::{Result, ShardError};
use crate::rows::{HostRows, Shard, SliceRows};

/// The slice of rank `rank` of `ranks` over `vocab`: even (`VocabSlice::even`), or uneven with
/// rank 0 holding one token and the others splitting the rest evenly. `None` when a slice would
/// be empty.
pub fn slice_of(vocab: usize, ranks: usize, rank: usize, uneven: bool) -> Option<VocabSlice> {
    if !uneven || ranks == 1 {
        return VocabSlice::even(vocab, ranks, rank);
    }
    if rank == 0 {
        return (vocab >= ranks).then_some(VocabSlice {
            first: 0,
            len: 1,
            vocab,
        });
    }
    let rest = VocabSlice::even(vocab.checked_sub(1)?, ranks - 1, rank - 1)?;
    Some(VocabSlice {
        first: rest.first + 1,
        len: rest.len,
        vocab,
    })
}

/// A deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Lcg(u64);

impl Lcg {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Lcg(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0 .. n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// A value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Rows of one check: `[rows, vocab]` logits (or probabilities) and per-row parameters.
#[derive(Clone, Debug)]
pub struct Rows {
    /// Vocabulary.
    pub vocab: usize,
    /// `[rows, vocab]` values.
    pub values: Vec<f32>,
    /// Logits (with `temperature`) or probabilities.
    pub logits: bool,
    /// Per-row temperature.
    pub temperature: Vec<f32>,
    /// Per-row top_k.
    pub top_k: Vec<i32>,
    /// Per-row top_p.
    pub top_p: Vec<f32>,
    /// Per-row seed.
    pub seed: Vec<u64>,
}

impl Rows {
    /// `rows` random rows of `vocab`: runner-like logits (a Gaussian body, a few peaks, ties) or
    /// their softmax, with every kind of top-k (none, small, at the records' limit, above it,
    /// 1) and top-p, and temperatures including 0 and +inf.
    pub fn random(rng: &mut Lcg, rows: usize, vocab: usize, logits: bool) -> Self {
        let mut values = Vec::with_capacity(rows * vocab);
        for _ in 0..rows {
            let sigma = [0.5, 1.5, 3.0][rng.below(3)];
            let mut row: Vec<f32> = (0..vocab)
                .map(|_| {
                    let (u, v) = (rng.unit().max(1e-300), rng.unit());
                    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos() * sigma) as f32
                })
                .collect();
            for _ in 0..1 + rng.below(6) {
                let t = rng.below(vocab);
                row[t] += 4.0 + 10.0 * rng.unit() as f32;
            }
            for _ in 0..rng.below(5) {
                let (a, b) = (rng.below(vocab), rng.below(vocab));
                row[b] = row[a];
            }
            // Some rows tie many tokens at their maximum (or at +inf), so that a top-p cut
            // falls inside one value and the search must find it by id.
            // Consecutive ids, so that the cut also falls inside a block of 16 ids.
            let (start, len) = (rng.below(vocab), 2 + rng.below(40));
            let tied = start..(start + len).min(vocab);
            match rng.below(4) {
                0 => {
                    let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    row[tied].fill(top);
                }
                1 if logits => row[tied].fill(f32::INFINITY),
                _ => {}
            }
            if !logits {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
                let s: f64 = e.iter().sum();
                row = e.iter().map(|x| (x / s) as f32).collect();
            }
            values.extend(row);
        }
        let pick_k = |rng: &mut Lcg| match rng.below(8) {
            0 | 1 => 0,
            2 => 1,
            3 => 50,
            4 => 1024,
            5 => 1025 + rng.below(3000) as i32,
            6 => rng.below(vocab + 2) as i32,
            _ => 20,
        };
        let pick_p = |rng: &mut Lcg| [1.0, 0.9, 0.5, 0.95, 1e-6, 0.8][rng.below(6)];
        let pick_t = |rng: &mut Lcg| [1.0, 0.7, 0.0, 2.5, f32::INFINITY, 0.05][rng.below(6)];
        Rows {
            vocab,
            logits,
            top_k: (0..rows).map(|_| pick_k(rng)).collect(),
            top_p: (0..rows).map(|_| pick_p(rng)).collect(),
            temperature: (0..rows).map(|_| pick_t(rng)).collect(),
            seed: (0..rows).map(|_| rng.next_u64() >> 2).collect(),
            values,
        }
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.top_k.len()
    }

    /// The host parameters.
    fn host(&self) -> HostRows<'_> {
        HostRows {
            top_k: &self.top_k,
            top_p: &self.top_p,
            seed: &self.seed,
            temperature: self.logits.then_some(self.temperature.as_slice()),
            min_p: None,
        }
    }

    /// `[rows, len]` values of the slice `[first, first + len)`.
    fn cut(&self, first: usize, len: usize) -> Vec<f32> {
        self.values
            .chunks(self.vocab)
            .flat_map(|row| row[first..first + len].to_vec())
            .collect()
    }
}

/// What the unsharded device answers for `rows`: the sample, the argmax, the candidates.
pub fn unsharded(
    device: &dyn Device,
    rows: &Rows,
    candidates: usize,
) -> Result<(Vec<i32>, Vec<i32>, Candidates)> {
    let n = rows.rows();
    let shape = RowShape {
        rows: n,
        vocab: rows.vocab,
    };
    let values = device.upload(&rows.values)?;
    let temperature = device.upload(&rows.temperature)?;
    let scores = match rows.logits {
        true => Scores::logits(&values, &temperature),
        false => Scores::probs(&values),
    };
    let top_k = device.upload(&rows.top_k)?;
    let top_p = device.upload(&rows.top_p)?;
    let seed = device.upload(&rows.seed)?;
    let mut tokens = device.alloc::<i32>(n)?;
    device.top_k_top_p_sample(
        &SampleInputs::new(scores, &top_k, &top_p, &seed),
        &mut tokens,
        &SampleParams::new(shape),
    )?;
    let mut argmax = device.alloc::<i32>(n)?;
    device.argmax(&values, &mut argmax, &shape)?;
    let mut ids = device.alloc::<i32>(n * candidates)?;
    let mut cand_scores = device.alloc::<f32>(n * candidates)?;
    let mut lens = device.alloc::<i32>(n)?;
    device.top_p_candidates(
        &CandidatesInputs::new(scores, &top_p),
        &mut CandidatesOutputs {
            ids: &mut ids,
            scores: &mut cand_scores,
            lens: &mut lens,
        },
        &CandidatesParams::new(shape, candidates),
    )?;
    let candidates = Candidates {
        ids: device.download(&ids)?,
        scores: device.download(&cand_scores)?,
        lens: device.download(&lens)?,
    };
    Ok((
        device.download(&tokens)?,
        device.download(&argmax)?,
        candidates,
    ))
}

use crate::candidates::Candidates;

/// This rank's answers for `rows`: the sharded sample, argmax and candidates over its slice.
pub fn sharded(
    shard: &Shard<'_>,
    rows: &Rows,
    candidates: usize,
) -> Result<(Vec<i32>, Vec<i32>, Candidates)> {
    let slice = shard.partition.mine();
    let device = shard.device;
    let values = device.upload(&rows.cut(slice.first, slice.len))?;
    let temperature = device.upload(&rows.temperature)?;
    let scores = match rows.logits {
        true => Scores::logits(&values, &temperature),
        false => Scores::probs(&values),
    };
    let slice_rows = SliceRows::new(scores);
    let tokens = crate::top_k_top_p_sample(shard, &slice_rows, &rows.host())?;
    let argmax = crate::argmax(shard, scores, rows.rows())?;
    let cands = crate::top_p_candidates(shard, &slice_rows, &rows.top_p, candidates, None)?;
    Ok((tokens, argmax, cands))
}

/// Compares a rank's answers with the unsharded ones; an error names the first difference.
pub fn compare(
    what: &str,
    sharded: &(Vec<i32>, Vec<i32>, Candidates),
    unsharded: &(Vec<i32>, Vec<i32>, Candidates),
) -> Result<()> {
    let differ = |name: &str, i: usize, a: String, b: String| ShardError::Mismatch {
        what: format!("{what}: {name}[{i}] sharded {a}, unsharded {b}"),
    };
    let first = |a: &[i32], b: &[i32]| a.iter().zip(b).position(|(x, y)| x != y);
    if let Some(i) = first(&sharded.0, &unsharded.0) {
        return Err(differ(
            "token",
            i,
            sharded.0[i].to_string(),
            unsharded.0[i].to_string(),
        ));
    }
    if let Some(i) = first(&sharded.1, &unsharded.1) {
        return Err(differ(
            "argmax",
            i,
            sharded.1[i].to_string(),
            unsharded.1[i].to_string(),
        ));
    }
    let (a, b) = (&sharded.2, &unsharded.2);
    if let Some(i) = first(&a.ids, &b.ids) {
        return Err(differ(
            "candidate id",
            i,
            a.ids[i].to_string(),
            b.ids[i].to_string(),
        ));
    }
    if let Some(i) = a
        .scores
        .iter()
        .zip(&b.scores)
        .position(|(x, y)| x.to_bits() != y.to_bits())
    {
        return Err(differ(
            "candidate score",
            i,
            a.scores[i].to_string(),
            b.scores[i].to_string(),
        ));
    }
    if let Some(i) = first(&a.lens, &b.lens) {
        return Err(differ(
            "candidate lens",
            i,
            a.lens[i].to_string(),
            b.lens[i].to_string(),
        ));
    }
    Ok(())
}
