//! `Decoder::warm_up_for` on xpu-sim (PoCL): it builds fewer programs than the full warm-up, and
//! after it the steps of its configuration — every strategy but REJECTION, with the n-gram
//! proposer, log-probabilities and logits processing on — build no program. Listed as ignored
//! with the reason when there is no OpenCL device (failing when `SPECULA_REQUIRE` names xpu-sim).

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use common::{Arrival, Extras, Forward, Rng, ToyModel, VOCAB, request, run_with};
use specula_backend_api::named_tests;
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{DType, Device, Strategy};
use specula_backend_xpu_sim::XpuSimDevice;
use specula_sampler::{Decoder, NgramConfig, SamplerConfig};

type TestResult = Result<(), String>;

fn main() -> ExitCode {
    let needs = Needs::of_open("xpu-sim", &XpuSimDevice::new(0));
    let tests: Vec<(&str, TestFn)> = named_tests![
        warm_up_for_builds_less_than_the_full_warm_up,
        after_warm_up_for_the_steps_of_the_configuration_build_nothing,
    ];
    testing::run(&needs, tests)
}

fn open() -> Result<Arc<XpuSimDevice>, String> {
    XpuSimDevice::new(0)
        .map(Arc::new)
        .map_err(|e| format!("open: {e}"))
}

fn config(strategy: Strategy) -> SamplerConfig {
    SamplerConfig {
        logprobs: Some(3),
        ..SamplerConfig::new(strategy, 3, VOCAB, 64, vec![0]).with_ngram(4, NgramConfig::default())
    }
}

fn warm_up_for_builds_less_than_the_full_warm_up() -> TestResult {
    let (full, some) = (open()?, open()?);
    full.warm_up().map_err(|e| format!("warm_up: {e}"))?;
    let decoder = Decoder::new(some.clone(), config(Strategy::TargetMatch))
        .map_err(|e| format!("decoder: {e}"))?;
    decoder
        .warm_up_for(DType::F32)
        .map_err(|e| format!("warm_up_for: {e}"))?;
    let (all, planned) = (full.programs_built(), some.programs_built());
    if planned == 0 || planned >= all {
        return Err(format!(
            "warm_up_for built {planned} programs, the full warm-up {all}"
        ));
    }
    Ok(())
}

/// Requests with penalties and a logit bias, so that every step processes its logits.
fn arrivals(rng: &mut Rng, model: &ToyModel) -> Vec<Arrival> {
    (0..4)
        .map(|i| {
            let base = request(rng, model, 10);
            let params = base
                .params()
                .with_repetition_penalty(1.3)
                .with_frequency_presence(0.4, 0.2);
            Arrival {
                step: i,
                request: base.with_params(params).with_logit_bias(vec![(3, 1.5)]),
            }
        })
        .collect()
}

fn after_warm_up_for_the_steps_of_the_configuration_build_nothing() -> TestResult {
    let model = ToyModel { vocab: VOCAB };
    for strategy in [Strategy::Greedy, Strategy::TargetMatch, Strategy::TopP] {
        let xpu = open()?;
        let config = config(strategy);
        let device: Arc<dyn Device> = xpu.clone();
        Decoder::new(device.clone(), config.clone())
            .and_then(|d| d.warm_up_for(DType::F32))
            .map_err(|e| format!("{strategy}: warm_up_for: {e}"))?;
        let built = xpu.programs_built();
        let mut rng = Rng(0x3A12 + strategy as u64);
        let arrivals = arrivals(&mut rng, &model);
        let extras = Extras::default();
        let result = run_with(&device, &config, &model, &arrivals, Forward::Prefix, extras);
        if result.tokens.iter().all(Vec::is_empty) {
            return Err(format!("{strategy}: nothing was decoded"));
        }
        let after = xpu.programs_built();
        if after != built {
            return Err(format!(
                "{strategy}: the steps built {} programs after warm_up_for",
                after - built
            ));
        }
    }
    Ok(())
}
