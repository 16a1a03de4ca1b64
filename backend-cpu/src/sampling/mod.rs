//! The machinery of the sampling ops (`top_k_top_p_sample`, `top_p_candidates`, REJECTION's
//! target rows): the single streaming pass (`scan`), the floor-and-collect fast path (`fast`) and
//! the histogram path for the rows the fast path leaves (`histogram`). All three make the same
//! integer decisions; `docs/performance.md` describes them. Logits rows (`docs/semantics.md` §4b) have their
//! own exact path (`logits`).

pub(crate) mod band;
pub(crate) mod fast;
pub(crate) mod histogram;
#[cfg(test)]
pub(crate) mod lcg;
pub(crate) mod logits;
pub(crate) mod scan;
