//! How many of the n-gram proposer's drafts a request feeds each step: an adaptive draft length.
//!
//! A draft costs a step about a quarter of a single-token step on the CPU (`docs/performance.md`),
//! and it pays only when it is accepted. On a prompt the model copies nearly every draft is
//! accepted; on a chat prompt few are, and feeding the proposer's drafts every step makes
//! speculation slower than plain decoding. So each request keeps its own limit, learnt from its
//! own steps:
//!
//! - it starts at the most drafts a step may take (`--draft N`);
//! - after a step whose fed drafts were all rejected, the limit halves (down to 0: a plain step);
//! - after a step that accepted every draft it fed at the limit, the limit doubles (up to `N`);
//! - at 0, every few decoding steps one draft is fed as a probe; a rejected probe doubles the wait
//!   before the next (up to [`MAX_PROBE_INTERVAL`]), an accepted one lifts the limit back to 1.
//!
//! The limit only changes how many tokens a step feeds, never which tokens are emitted: TARGET_MATCH
//! emits the plain tokens whatever the drafts (`docs/semantics.md` §1, §5.8).

/// Decoding steps at limit 0 before the first probe.
pub const FIRST_PROBE_INTERVAL: u32 = 4;

/// The longest wait between probes, in decoding steps.
pub const MAX_PROBE_INTERVAL: u32 = 32;

/// How the engine chooses the drafts a request feeds (a command-line value: `fixed`, `adaptive`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftPolicy {
    /// Every draft the proposer makes, up to the most a step may take.
    Fixed,
    /// A limit per request, halved after a step that rejected every draft and doubled after one
    /// that accepted them all (see the module's documentation).
    #[default]
    Adaptive,
}

/// A request's draft limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftLength {
    max: usize,
    limit: usize,
    probe_interval: u32,
    since_probe: u32,
}

impl DraftLength {
    /// A new request's limit: `max` drafts.
    pub fn new(max: usize) -> Self {
        DraftLength {
            max,
            limit: max,
            probe_interval: FIRST_PROBE_INTERVAL,
            since_probe: 0,
        }
    }

    /// The drafts the request may feed this step, out of `proposed` (the proposer's): at most the
    /// limit, or one when the limit is 0 and a probe is due.
    pub fn allowed(&self, proposed: usize) -> usize {
        let limit = match self.limit {
            0 if self.since_probe >= self.probe_interval => 1,
            limit => limit,
        };
        limit.min(proposed)
    }

    /// Learns from a decoding step that fed `fed` drafts and had `accepted` of them accepted.
    pub fn update(&mut self, fed: usize, accepted: usize) {
        if self.limit == 0 {
            self.update_probing(fed, accepted);
        } else if fed > 0 && accepted == 0 {
            self.limit /= 2;
            self.since_probe = 0;
        } else if fed >= self.limit && accepted >= fed {
            self.limit = (2 * self.limit).min(self.max);
        }
    }

    /// The limit is 0: counts the step, or judges the probe it fed.
    fn update_probing(&mut self, fed: usize, accepted: usize) {
        if fed == 0 {
            self.since_probe = self.since_probe.saturating_add(1);
            return;
        }
        self.since_probe = 0;
        if accepted > 0 {
            self.limit = 1.min(self.max);
            self.probe_interval = FIRST_PROBE_INTERVAL;
        } else {
            self.probe_interval = (2 * self.probe_interval).min(MAX_PROBE_INTERVAL);
        }
    }

    /// The current limit (0: plain steps between probes).
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_halve_the_limit_down_to_plain_steps() {
        let mut length = DraftLength::new(5);
        assert_eq!(length.allowed(5), 5);
        let limits: Vec<usize> = (0..3)
            .map(|_| {
                let fed = length.allowed(5);
                length.update(fed, 0);
                length.limit()
            })
            .collect();
        assert_eq!(limits, [2, 1, 0]);
        assert_eq!(length.allowed(5), 0);
    }

    #[test]
    fn full_acceptance_doubles_the_limit_up_to_the_maximum() {
        let mut length = DraftLength::new(5);
        length.update(5, 0);
        assert_eq!(length.limit(), 2);
        length.update(2, 2);
        assert_eq!(length.limit(), 4);
        length.update(4, 4);
        assert_eq!(length.limit(), 5);
        length.update(5, 5);
        assert_eq!(length.limit(), 5);
        // Fewer drafts than the limit, all accepted, or some of them accepted: the limit stays.
        length.update(2, 2);
        length.update(5, 3);
        assert_eq!(length.limit(), 5);
    }

    #[test]
    fn at_zero_a_probe_comes_after_a_wait_that_doubles_when_it_fails() {
        let mut length = DraftLength::new(1);
        length.update(1, 0);
        assert_eq!(length.limit(), 0);
        let probes_at = |length: &mut DraftLength, accept: bool| {
            let mut steps = 0;
            loop {
                steps += 1;
                let fed = length.allowed(3);
                length.update(fed, if accept { fed } else { 0 });
                if fed > 0 {
                    assert_eq!(fed, 1);
                    return steps;
                }
            }
        };
        assert_eq!(probes_at(&mut length, false), 5);
        assert_eq!(probes_at(&mut length, false), 9);
        assert_eq!(probes_at(&mut length, true), 17);
        assert_eq!(length.limit(), 1);
        // No draft to probe with: the wait goes on.
        length.update(1, 0);
        for _ in 0..10 {
            assert_eq!(length.allowed(0), 0);
            length.update(0, 0);
        }
        assert_eq!(length.allowed(2), 1);
    }

    #[test]
    fn no_drafts_allowed_never_exceeds_those_proposed() {
        let length = DraftLength::new(5);
        assert_eq!(length.allowed(3), 3);
        assert_eq!(length.allowed(0), 0);
        assert_eq!(DraftLength::new(0).allowed(4), 0);
    }
}
