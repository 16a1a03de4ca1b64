//! Every golden case (outputs worked out by hand from the contract) holds on the reference device.
//!
//! The suite holds every backend to a golden case's expected outputs as they are written, so the
//! reference device — the oracle of every other case — never runs them there. Here the reference
//! is put under the suite as a backend, over the golden cases only: the oracle and the hand-computed
//! answers are checked against each other. (The reference's own tests keep only the known answers
//! that no golden case holds.)
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use specula_backend_api::Op;
use specula_conformance::backends::Backend;
use specula_conformance::cases::Size;
use specula_conformance::suite::{Plan, Suite};
use specula_reference::ReferenceDevice;

#[test]
fn every_golden_case_passes_on_the_reference() {
    let reference = Backend::available("reference", Arc::new(ReferenceDevice::new()));
    let suite = Suite::new(vec![reference], Size::Quick).unwrap();
    let plan = Plan {
        ops: Op::ALL.to_vec(),
        properties: false,
        filter: Some("::golden::".to_owned()),
    };
    let report = suite.run_plan(&plan, &mut |_| {});
    assert!(report.passed(), "{}", report.render());
    for op in Op::ALL.into_iter().filter(|&op| op != Op::Memory) {
        let ran = report
            .cells()
            .iter()
            .find(|cell| cell.op == op.name())
            .map_or(0, |cell| cell.counts.ran());
        assert!(ran > 0, "{op}: no golden case ran on the reference");
    }
}
