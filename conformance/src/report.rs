//! The report of a run: every trial's outcome, aggregated into an op × backend table of passed /
//! failed / skipped (with the reasons), a one-line verdict, and the same as JSON for machines.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use specula_backend_api::Op;

use crate::backends::Backend;
use crate::cases::Size;
use crate::{ConformanceError, Result};

/// Version of the JSON report's layout.
pub const REPORT_VERSION: u32 = 1;

/// The group name of end-to-end property trials (in place of an op name).
pub const PROPERTIES: &str = "properties";

/// How one trial ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "message", rename_all = "snake_case")]
pub enum Outcome {
    /// The outputs matched, the guards held.
    Passed,
    /// What went wrong: backend, op, case, and the mismatch, guard violation or error.
    Failed(String),
    /// The trial did not run, and why (backend unavailable, dtype unsupported).
    Skipped(String),
}

impl Outcome {
    /// The outcome's name: `passed`, `failed` or `skipped`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed(_) => "failed",
            Outcome::Skipped(_) => "skipped",
        }
    }
}

/// Failures listed in full by [`Report::render`]; the rest are counted (the JSON has them all).
const LISTED_FAILURES: usize = 25;

/// The result of one trial.
#[derive(Clone, Debug, Serialize)]
pub struct TrialResult {
    /// `<backend>::<op>::<case>`.
    pub name: String,
    /// The backend.
    pub backend: String,
    /// The op name, or `properties`.
    pub group: String,
    /// The case or property name.
    pub case: String,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Wall time.
    pub seconds: f64,
}

/// A backend as the report describes it.
#[derive(Clone, Debug, Serialize)]
pub struct BackendSummary {
    /// Its name.
    pub name: String,
    /// The device's name and driver, when available.
    pub device: Option<String>,
    /// Why it is unavailable, when it is.
    pub unavailable: Option<String>,
}

/// Trial counts of one cell of the table (or of the whole run).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Trials that passed.
    pub passed: usize,
    /// Trials that failed.
    pub failed: usize,
    /// Trials skipped.
    pub skipped: usize,
    /// The distinct reasons of the skips.
    pub skip_reasons: BTreeSet<String>,
}

impl Counts {
    fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Passed => self.passed += 1,
            Outcome::Failed(_) => self.failed += 1,
            Outcome::Skipped(reason) => {
                self.skipped += 1;
                self.skip_reasons.insert(reason.clone());
            }
        }
    }

    /// Trials that ran (passed or failed).
    pub fn ran(&self) -> usize {
        self.passed + self.failed
    }
}

/// One cell of the op × backend table.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// The op name, or `properties`.
    pub op: String,
    /// The backend.
    pub backend: String,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct Report {
    /// `quick` or `full`.
    pub size: &'static str,
    /// The device every backend is compared with (name and driver).
    pub oracle: String,
    /// The backends, in table order.
    pub backends: Vec<BackendSummary>,
    /// Every trial's result, in the order they ended.
    pub results: Vec<TrialResult>,
    /// Wall time of the whole run.
    pub seconds: f64,
}

/// The width of a left-aligned column holding `texts`: the length of the longest.
pub fn column_width<'a>(texts: impl IntoIterator<Item = &'a str>) -> usize {
    texts.into_iter().map(str::len).max().unwrap_or(0)
}

/// The name of a case size in reports (`quick`, `full`).
pub fn size_name(size: Size) -> &'static str {
    match size {
        Size::Quick => "quick",
        Size::Full => "full",
    }
}

impl Report {
    /// An empty report over `backends`, compared with `oracle` (a one-line description).
    pub fn new(backends: &[Backend], size: Size, oracle: &str) -> Self {
        Report {
            size: size_name(size),
            oracle: oracle.to_owned(),
            backends: backends
                .iter()
                .map(|b| BackendSummary {
                    name: b.name.clone(),
                    device: b.device().map(|_| b.describe()),
                    unavailable: b.skip_reason().map(str::to_owned),
                })
                .collect(),
            results: Vec::new(),
            seconds: 0.0,
        }
    }

    /// Adds a trial's result.
    pub fn push(&mut self, result: TrialResult) {
        self.results.push(result);
    }

    /// Counts over every trial.
    pub fn totals(&self) -> Counts {
        let mut counts = Counts::default();
        for r in &self.results {
            counts.add(&r.outcome);
        }
        counts
    }

    /// The failed trials.
    pub fn failures(&self) -> impl Iterator<Item = &TrialResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
    }

    /// The groups of the table in order: the ops in contract order, then `properties`, then any
    /// other group by name.
    pub fn groups(&self) -> Vec<String> {
        let rank = |group: &str| {
            Op::ALL
                .iter()
                .position(|op| op.name() == group)
                .unwrap_or(if group == PROPERTIES {
                    Op::ALL.len()
                } else {
                    Op::ALL.len() + 1
                })
        };
        let mut groups: Vec<String> = self
            .results
            .iter()
            .map(|r| r.group.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        groups.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
        groups
    }

    /// The op × backend table, row by row.
    pub fn cells(&self) -> Vec<Cell> {
        let mut map: BTreeMap<(&str, &str), Counts> = BTreeMap::new();
        for r in &self.results {
            map.entry((r.group.as_str(), r.backend.as_str()))
                .or_default()
                .add(&r.outcome);
        }
        let mut cells = Vec::new();
        for group in self.groups() {
            for backend in &self.backends {
                cells.push(Cell {
                    op: group.clone(),
                    backend: backend.name.clone(),
                    counts: map
                        .get(&(group.as_str(), backend.name.as_str()))
                        .cloned()
                        .unwrap_or_default(),
                });
            }
        }
        cells
    }

    /// Whether the run passed: no failure, and at least one trial ran.
    pub fn passed(&self) -> bool {
        let totals = self.totals();
        totals.failed == 0 && totals.passed > 0
    }

    /// The one-line verdict.
    pub fn verdict(&self) -> String {
        let totals = self.totals();
        let names = |pick: &dyn Fn(&Counts) -> bool| -> String {
            let mut per_backend: BTreeMap<&str, Counts> = BTreeMap::new();
            for r in &self.results {
                per_backend
                    .entry(r.backend.as_str())
                    .or_default()
                    .add(&r.outcome);
            }
            self.backends
                .iter()
                .filter(|b| per_backend.get(b.name.as_str()).is_some_and(pick))
                .map(|b| b.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let skipped = match totals.skipped {
            0 => String::new(),
            n => {
                let unavailable: Vec<&str> = self
                    .backends
                    .iter()
                    .filter(|b| b.unavailable.is_some())
                    .map(|b| b.name.as_str())
                    .collect();
                match unavailable.is_empty() {
                    true => format!("; {n} skipped"),
                    false => format!("; {n} skipped ({} unavailable)", unavailable.join(", ")),
                }
            }
        };
        let tail = format!("[{} cases, {:.1} s]", self.size, self.seconds);
        if totals.failed > 0 {
            format!(
                "FAIL: {} of {} trials failed (on {}){skipped} {tail}",
                totals.failed,
                totals.ran(),
                names(&|c| c.failed > 0)
            )
        } else if totals.passed == 0 {
            format!("FAIL: no trial ran{skipped} {tail}")
        } else {
            format!(
                "PASS: {} trials passed on {}{skipped} {tail}",
                totals.passed,
                names(&|c| c.passed > 0)
            )
        }
    }

    /// The human report: backends, failures, the op × backend table with footnoted skip reasons,
    /// and the verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let width = column_width(self.backends.iter().map(|b| b.name.as_str()));
        let _ = writeln!(out, "oracle: {}", self.oracle);
        out.push_str("backends:\n");
        for b in &self.backends {
            let what = match (&b.device, &b.unavailable) {
                (Some(device), _) => device.clone(),
                (None, Some(reason)) => format!("unavailable: {reason}"),
                (None, None) => String::new(),
            };
            let _ = writeln!(out, "  {:width$}  {what}", b.name);
        }
        let failures: Vec<&TrialResult> = self.failures().collect();
        if !failures.is_empty() {
            let _ = writeln!(out, "\nfailures ({}):", failures.len());
            for f in failures.iter().take(LISTED_FAILURES) {
                if let Outcome::Failed(message) = &f.outcome {
                    let _ = writeln!(out, "  {}\n      {message}", f.name);
                }
            }
            if failures.len() > LISTED_FAILURES {
                let _ = writeln!(
                    out,
                    "  ... and {} more (all of them are in the --json report)",
                    failures.len() - LISTED_FAILURES
                );
            }
        }
        out.push('\n');
        out.push_str(&self.render_table());
        out.push('\n');
        out.push_str(&self.verdict());
        out.push('\n');
        out
    }

    /// The op × backend table, with numbered skip reasons below it.
    pub fn render_table(&self) -> String {
        let mut reasons: Vec<String> = Vec::new();
        let mut footnote = |reason: &str| -> usize {
            match reasons.iter().position(|r| r == reason) {
                Some(i) => i + 1,
                None => {
                    reasons.push(reason.to_owned());
                    reasons.len()
                }
            }
        };
        let cell_text = |counts: &Counts, footnote: &mut dyn FnMut(&str) -> usize| {
            let mut parts = Vec::new();
            if counts.passed > 0 {
                parts.push(format!("{} passed", counts.passed));
            }
            if counts.failed > 0 {
                parts.push(format!("{} FAILED", counts.failed));
            }
            if counts.skipped > 0 {
                let notes: Vec<String> = counts
                    .skip_reasons
                    .iter()
                    .map(|r| footnote(r).to_string())
                    .collect();
                parts.push(format!("{} skipped [{}]", counts.skipped, notes.join(",")));
            }
            match parts.is_empty() {
                true => "-".to_owned(),
                false => parts.join(", "),
            }
        };
        let mut header = vec!["op".to_owned()];
        header.extend(self.backends.iter().map(|b| b.name.clone()));
        let mut rows = vec![header];
        let cells = self.cells();
        let columns = self.backends.len().max(1);
        for chunk in cells.chunks(columns) {
            let mut row = vec![chunk.first().map(|c| c.op.clone()).unwrap_or_default()];
            row.extend(chunk.iter().map(|c| cell_text(&c.counts, &mut footnote)));
            rows.push(row);
        }
        if !cells.is_empty() {
            let mut total = vec!["total".to_owned()];
            for b in &self.backends {
                let mut counts = Counts::default();
                for r in self.results.iter().filter(|r| r.backend == b.name) {
                    counts.add(&r.outcome);
                }
                total.push(cell_text(&counts, &mut footnote));
            }
            rows.push(total);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|i| column_width(rows.iter().map(|r| r.get(i).map_or("", String::as_str))))
            .collect();
        let mut out = String::new();
        for (n, row) in rows.iter().enumerate() {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(text, &w)| format!("{text:w$}"))
                .collect();
            let _ = writeln!(out, "{}", line.join(" | ").trim_end());
            let last_body_row = n + 2 == rows.len() && !cells.is_empty();
            if n == 0 || last_body_row {
                let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
                let _ = writeln!(out, "{}", rule.join("-+-"));
            }
        }
        if cells.is_empty() {
            out.push_str("(no trial was selected)\n");
        }
        for (i, reason) in reasons.iter().enumerate() {
            let _ = writeln!(out, "[{}] {reason}", i + 1);
        }
        out
    }

    /// The report as JSON: format, size, verdict, totals, backends, the table and every trial.
    pub fn to_json(&self) -> Result<String> {
        #[derive(Serialize)]
        struct Json<'a> {
            format: &'static str,
            version: u32,
            size: &'static str,
            oracle: &'a str,
            seconds: f64,
            passed: bool,
            verdict: String,
            totals: Counts,
            backends: &'a [BackendSummary],
            table: Vec<Cell>,
            trials: &'a [TrialResult],
        }
        let json = Json {
            format: "specula-report",
            version: REPORT_VERSION,
            size: self.size,
            oracle: &self.oracle,
            seconds: self.seconds,
            passed: self.passed(),
            verdict: self.verdict(),
            totals: self.totals(),
            backends: &self.backends,
            table: self.cells(),
            trials: &self.results,
        };
        serde_json::to_string_pretty(&json)
            .map_err(|e| ConformanceError::Format(format!("cannot serialise the report: {e}")))
    }

    /// Writes [`Report::to_json`] to `path`.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let json = self.to_json()?;
        std::fs::write(path, json + "\n").map_err(|source| ConformanceError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}
