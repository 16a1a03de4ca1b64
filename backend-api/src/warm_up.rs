//! What a warm-up builds ([`Device::warm_up_for`](crate::Device::warm_up_for)).

use crate::{Capabilities, DType, Op};

/// The kernels a warm-up builds: those of some ops, for score rows of some float dtypes.
///
/// Kernels that do not depend on the dtype of the score rows (the integer batch ops, the
/// non-REJECTION slot walk of `verify_draft_tokens`, and `gather_next_token`, which copies hidden
/// states of any dtype) are built for every op listed whatever the dtypes. REJECTION's kernels are built for the listed dtypes as target rows, with draft rows of
/// any supported float dtype. A runner that knows its logits dtype and its decoding mode builds
/// only what its steps launch (`specula_sampler::Decoder::warm_up_for`); [`WarmUp::all`] builds
/// everything the device may ever launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmUp {
    ops: Vec<Op>,
    dtypes: Vec<DType>,
}

impl WarmUp {
    /// Every op of the table, every float dtype.
    pub fn all() -> Self {
        WarmUp::new(Op::ALL, DType::FLOATS)
    }

    /// The kernels of `ops` for score rows of `dtypes`. Repeats are dropped; a dtype that is not
    /// a float (`i32`, `u8`, …) names no score rows and is ignored.
    pub fn new(ops: impl IntoIterator<Item = Op>, dtypes: impl IntoIterator<Item = DType>) -> Self {
        let ops: Vec<Op> = ops.into_iter().collect();
        let dtypes: Vec<DType> = dtypes.into_iter().filter(|d| d.is_float()).collect();
        WarmUp {
            ops: Op::ALL.into_iter().filter(|op| ops.contains(op)).collect(),
            dtypes: DType::FLOATS
                .into_iter()
                .filter(|d| dtypes.contains(d))
                .collect(),
        }
    }

    /// The ops whose kernels are built, in table order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The float dtypes of the score rows, in [`DType::FLOATS`] order.
    pub fn dtypes(&self) -> &[DType] {
        &self.dtypes
    }

    /// Whether the kernels of `op` are built.
    pub fn builds(&self, op: Op) -> bool {
        self.ops.contains(&op)
    }

    /// Whether kernels over score rows of `dtype` are built (any non-float dtype: yes, it names
    /// an integer kernel).
    pub fn builds_dtype(&self, dtype: DType) -> bool {
        !dtype.is_float() || self.dtypes.contains(&dtype)
    }

    /// The plan narrowed to what a device with `caps` runs ([`Capabilities::runs`]) and
    /// supports ([`Capabilities::float_dtypes`]).
    pub fn for_device(&self, caps: &Capabilities) -> WarmUp {
        WarmUp {
            ops: self
                .ops
                .iter()
                .copied()
                .filter(|&op| caps.runs(op))
                .collect(),
            dtypes: self
                .dtypes
                .iter()
                .copied()
                .filter(|d| caps.float_dtypes.contains(d))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_orders_and_dedups_and_ignores_integer_dtypes() {
        let plan = WarmUp::new(
            [Op::UpdateState, Op::Argmax, Op::Argmax],
            [DType::BF16, DType::I32, DType::F32],
        );
        assert_eq!(plan.ops(), &[Op::Argmax, Op::UpdateState]);
        assert_eq!(plan.dtypes(), &[DType::F32, DType::BF16]);
        assert!(plan.builds(Op::Argmax) && !plan.builds(Op::Softmax));
        assert!(plan.builds_dtype(DType::I32) && plan.builds_dtype(DType::F32));
        assert!(!plan.builds_dtype(DType::F16));
    }

    #[test]
    fn all_is_every_op_and_float() {
        let all = WarmUp::all();
        assert_eq!(all.ops(), &Op::ALL);
        assert_eq!(all.dtypes(), &DType::FLOATS);
    }
}
