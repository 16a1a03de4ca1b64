#![deny(unsafe_code)]
//! # specula-shard
//!
//! Tensor-parallel sampling (`docs/semantics.md` §4d): a runner whose LM head is split over `N`
//! ranks holds each logits row as `N` contiguous slices of the vocabulary. Each rank runs the
//! per-rank ops of Specula (`shard_key`, `shard_records`, `shard_histogram`, `shard_walk`,
//! `shard_exp_sum`) on its own device over its slice, and a few exact collectives join them:
//! **every rank obtains the token the unsharded op returns on the whole row, bit for bit, for
//! every `N` and every partition**, exchanging about `k · N` small records a row instead of `V`
//! values.
//!
//! - [`Collective`]: the exact collectives (MAX over `u64` / `f32`, SUM over `u64` / `u128`,
//!   all-gather of `u64` records), on existing engines: [`MpiGroup`] (feature `mpi`, Open MPI
//!   through the `mpi` crate), [`NcclGroup`] (feature `nccl`, through cudarc), and
//!   [`ThreadGroup`] for unit tests. [`Group`] counts what each rank exchanges
//!   ([`ExchangeStats`]).
//! - [`Partition::agree`]: the ranks' slices, checked to partition one vocabulary (a
//!   [`ShardError::Mismatch`] on every rank otherwise).
//! - [`top_k_top_p_sample`], [`argmax`], [`top_p_candidates`], [`verify_draft_tokens`] (REJECTION
//!   reads the rows; the other strategies run replicated) and [`accept_logprobs`]: the sharded
//!   ops.
//!
//! Failures are typed errors on every rank, never a hang or a wrong token: a mismatch is found
//! by a collective whose result every rank sees, and a rank that stops calling makes the
//! others' collectives time out.
//!
//! ```
//! use specula_backend_api::{Device, DeviceExt};
//! use specula_backend_api::ops::{Scores, VocabSlice};
//! use specula_shard::{Group, HostRows, Partition, Shard, SliceRows, ThreadGroup, top_k_top_p_sample};
//!
//! // Two ranks (threads here; MPI or NCCL processes in a runner) split a row of 6 logits.
//! let row = [0.5f32, 3.0, -1.0, 2.0, 2.5, 0.0];
//! let handles: Vec<_> = ThreadGroup::new(2).into_iter().map(|member| {
//!     std::thread::spawn(move || -> Result<Vec<i32>, Box<dyn std::error::Error + Send + Sync>> {
//!         let group = Group::new(member);
//!         let slice = VocabSlice::even(6, 2, group.rank()).ok_or("a slice")?;
//!         let partition = Partition::agree(&group, slice)?;
//!         let device = specula_reference::ReferenceDevice::new();
//!         let logits = device.upload(&row[slice.first..slice.first + slice.len])?;
//!         let temperature = device.upload(&[1.0f32])?;
//!         let shard = Shard { device: &device, group: &group, partition: &partition };
//!         let rows = SliceRows::new(Scores::logits(&logits, &temperature));
//!         let host = HostRows { top_k: &[2], top_p: &[1.0], seed: &[7], temperature: Some(&[1.0]), min_p: None };
//!         Ok(top_k_top_p_sample(&shard, &rows, &host)?)
//!     })
//! }).collect();
//! let tokens: Vec<Vec<i32>> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
//! assert_eq!(tokens[0], tokens[1]); // the same token on every rank: 1 or 4, the top two
//! assert!(tokens[0] == [1] || tokens[0] == [4]);
//! ```

mod argmax;
mod candidates;
pub mod check;
mod collective;
mod error;
mod logprobs;
#[cfg(feature = "mpi")]
#[allow(unsafe_code)]
mod mpi;
#[cfg(feature = "nccl")]
#[allow(unsafe_code)]
mod nccl;
mod partition;
mod rows;
mod sample;
mod search;
mod threads;
mod verify;

pub use argmax::argmax;
pub use candidates::{Candidates, top_p_candidates};
pub use collective::{Collective, DEFAULT_TIMEOUT, ExchangeStats, Group, fingerprint};
pub use error::{Result, ShardError};
pub use logprobs::accept_logprobs;
#[cfg(feature = "mpi")]
pub use mpi::MpiGroup;
#[cfg(feature = "nccl")]
pub use nccl::NcclGroup;
pub use partition::Partition;
pub use rows::{Fallback, HostRows, Shard, SliceRows, row_fallbacks};
pub use sample::top_k_top_p_sample;
pub use threads::ThreadGroup;
pub use verify::{TargetExtras, verify_draft_tokens};
