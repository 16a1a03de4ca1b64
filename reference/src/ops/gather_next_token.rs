//! `gather_next_token` (`docs/semantics.md` §5.2): a bit copy of the hidden-state
//! row each output row predicts from.

use specula_backend_api::ops::gather_next_token::OpCall;
use specula_backend_api::ops::{GatherInputs, GatherParams};
use specula_backend_api::slots::SlotKind;
use specula_backend_api::{Buffer, Result};

use crate::ReferenceDevice;
use crate::layout::Layout;
use specula_backend_api::host::{bytes, bytes_mut, slice};

/// How output rows find their packed input row.
struct Sources<'a> {
    layout: Layout<'a>,
    cu_seqlens_q: &'a [i32],
    token_num: usize,
}

impl Sources<'_> {
    /// Packed input token `pos` of slot `b`, if it is inside `hidden_states`.
    fn packed(&self, b: usize, pos: i64) -> Option<usize> {
        let row = i64::from(*self.cu_seqlens_q.get(b)?) + pos;
        usize::try_from(row).ok().filter(|&r| r < self.token_num)
    }

    /// The last packed token of slot `b`.
    fn last(&self, b: usize) -> Option<usize> {
        self.packed(b, i64::from(self.layout.this_time(b)?) - 1)
    }

    /// Speculative output row `t`: a prefill row reads its slot's last token, decode row `k` its
    /// slot's token `k`.
    fn speculative(&self, t: usize) -> Option<usize> {
        let src = self.layout.source(t)?;
        match self.layout.kind(src.slot)? {
            SlotKind::Prefill => self.last(src.slot),
            SlotKind::Decode => self.packed(src.slot, src.pos as i64),
            SlotKind::Empty => None,
        }
    }

    /// Non-speculative row `b`: the slot's last token if the slot has output.
    fn per_slot(&self, b: usize) -> Option<usize> {
        (self.layout.output_rows(b) > 0)
            .then(|| self.last(b))
            .flatten()
    }
}

/// Copies, per output row, the source row's bytes; a row without a source is zeros.
pub(crate) fn gather_next_token(
    inputs: &GatherInputs<'_>,
    out: &mut Buffer,
    params: &GatherParams<'_>,
) -> Result<()> {
    let row_bytes = params.hidden * inputs.hidden_states.dtype().size_bytes();
    let hidden_states = bytes(inputs.hidden_states)?;
    let sources = Sources {
        layout: Layout::new(&inputs.lens, &inputs.layout, params.dims)?,
        cu_seqlens_q: slice(inputs.cu_seqlens_q)?,
        token_num: params.token_num,
    };
    // `hidden ≥ 1` is validated, so rows have at least one byte.
    for (t, row) in bytes_mut(out)?.chunks_exact_mut(row_bytes).enumerate() {
        let source = if params.is_speculative {
            sources.speculative(t)
        } else {
            sources.per_slot(t)
        };
        match source.and_then(|r| hidden_states.get(r * row_bytes..(r + 1) * row_bytes)) {
            Some(from) => row.copy_from_slice(from),
            None => row.fill(0),
        }
    }
    Ok(())
}

/// Runs a validated `gather_next_token` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    gather_next_token(inputs, out, params)
}
