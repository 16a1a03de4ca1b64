//! Serving requests as they arrive: the scheduling loop of a simple runner.
//!
//! [`serve`] inserts each [`Arrival`] at its step (or as soon as a slot is free, or at once when
//! nothing runs), runs the runner's step until every request has finished, and removes each
//! finished request after the step that finished it. The runner's step (forward pass, scores,
//! drafts) is a closure, so one loop serves every way of producing scores.

use std::collections::VecDeque;

use crate::config::Request;
use crate::decoder::Decoder;
use crate::error::{SamplerError, StepError};
use crate::step::{FinishReason, StepOutput};

/// A request that arrives at a given step.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// The step number ([`Decoder::step_number`]) from which the request may be inserted.
    pub step: u64,
    /// The request.
    pub request: Request,
}

/// What [`serve`] produced, per arrival, in arrival order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Served {
    /// The tokens each request generated (empty for one that never finished).
    pub generated: Vec<Vec<i32>>,
    /// Why each request stopped (`None` for one that never finished).
    pub finished: Vec<Option<FinishReason>>,
}

/// The error of [`serve`].
#[derive(Debug, thiserror::Error)]
pub enum ServeError<E> {
    /// The runner's step failed, or the sampler inserting or removing a request.
    #[error(transparent)]
    Step(#[from] StepError<E>),
    /// The step planned no output row although a request was running.
    #[error("a running request produced no output row")]
    NoRows,
    /// A slot that ran emitted no token and did not finish.
    #[error("slot {slot} emitted nothing and did not finish")]
    Silent {
        /// The slot.
        slot: usize,
    },
    /// A slot finished that `serve` had not filled.
    #[error("slot {slot} finished but was not inserted by serve")]
    Untracked {
        /// The slot.
        slot: usize,
    },
    /// Decoding went on for [`MAX_STEPS`] steps.
    #[error("decoding does not terminate ({MAX_STEPS} steps)")]
    Endless,
}

impl<E> From<SamplerError> for ServeError<E> {
    fn from(error: SamplerError) -> Self {
        ServeError::Step(StepError::Sampler(error))
    }
}

/// The most steps [`serve`] runs before it reports [`ServeError::Endless`].
pub const MAX_STEPS: usize = 100_000;

/// Serves `arrivals` on `decoder` until every request has finished and was removed.
///
/// Before each step, the due arrivals are inserted in order while slots are free (an arrival is
/// due at its step, or at once when nothing runs). `step` runs one decoding step, as
/// [`Decoder::step`] does: `Ok(None)` when the plan has no output row (an error here, since a
/// request runs). After it, each finished slot is removed and its tokens recorded.
pub fn serve<F, E>(
    decoder: &mut Decoder,
    arrivals: &[Arrival],
    mut step: F,
) -> Result<Served, ServeError<E>>
where
    F: FnMut(&mut Decoder) -> Result<Option<StepOutput>, StepError<E>>,
{
    let mut pending: VecDeque<(usize, &Arrival)> = arrivals.iter().enumerate().collect();
    let mut in_slot: Vec<Option<usize>> = vec![None; decoder.config().max_bsz];
    let mut served = Served {
        generated: vec![Vec::new(); arrivals.len()],
        finished: vec![None; arrivals.len()],
    };
    for steps in 0.. {
        insert_due(decoder, &mut pending, &mut in_slot)?;
        if pending.is_empty() && !decoder.has_running() {
            break;
        }
        if steps == MAX_STEPS {
            return Err(ServeError::Endless);
        }
        let output = step(decoder)?.ok_or(ServeError::NoRows)?;
        remove_finished(decoder, &output, &mut in_slot, &mut served)?;
    }
    Ok(served)
}

/// Inserts the due arrivals at the front of `pending`, in order, while slots are free.
fn insert_due<E>(
    decoder: &mut Decoder,
    pending: &mut VecDeque<(usize, &Arrival)>,
    in_slot: &mut [Option<usize>],
) -> Result<(), ServeError<E>> {
    while let Some(&(index, arrival)) = pending.front() {
        let due = arrival.step <= decoder.step_number() || !decoder.has_running();
        if !due || decoder.free_slots() == 0 {
            break;
        }
        let slot = decoder.insert(arrival.request.clone())?;
        in_slot[slot] = Some(index);
        pending.pop_front();
    }
    Ok(())
}

/// Removes the slots that finished in `output`, recording what they generated.
fn remove_finished<E>(
    decoder: &mut Decoder,
    output: &StepOutput,
    in_slot: &mut [Option<usize>],
    served: &mut Served,
) -> Result<(), ServeError<E>> {
    for slot_output in &output.slots {
        let slot = slot_output.slot;
        if slot_output.finished.is_none() {
            if slot_output.tokens.is_empty() {
                return Err(ServeError::Silent { slot });
            }
            continue;
        }
        let removed = decoder.remove(slot)?;
        let index = in_slot
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or(ServeError::Untracked { slot })?;
        served.generated[index] = removed.generated;
        served.finished[index] = removed.finished;
    }
    Ok(())
}
