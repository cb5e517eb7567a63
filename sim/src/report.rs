//! Reports: per-run CSV (the published `analysis_allo_discrete.csv` layout), summary table and
//! JSON, published reference means, and an SVG plot drawn by hand.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::policy::Policy;
use crate::run::RunResult;

/// CSV of all runs: `workload,sc_policy,tune,seed,total_gpus,0,1,...,K`, one row per run.
pub fn csv(results: &[RunResult], tune: f64, total_gpus: u64) -> String {
    let width = results.iter().map(|r| r.alloc_pct.len()).max().unwrap_or(0);
    let mut out = String::from("workload,sc_policy,tune,seed,total_gpus");
    for k in 0..width {
        let _ = write!(out, ",{k}");
    }
    out.push('\n');
    for r in results {
        let _ = write!(
            out,
            "{},{},{},{},{}",
            r.trace, r.policy, tune, r.seed, total_gpus
        );
        for v in &r.alloc_pct {
            let _ = write!(out, ",{v:.2}");
        }
        out.push('\n');
    }
    out
}

/// Means over seeds for one (trace, policy).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    /// Trace name.
    pub trace: String,
    /// Policy name.
    pub policy: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Mean allocation % at 100 % arrival.
    pub alloc_pct_at_100: Option<f64>,
    /// Mean allocation % at 130 % arrival.
    pub alloc_pct_at_130: Option<f64>,
    /// Mean number of pods that found no node.
    pub failed_pods: f64,
    /// Mean number of pods that fitted no node of kube-scheduler's first window
    /// (`--percentage-of-nodes-to-score` below 100): each a FailedScheduling and a retry.
    pub retried_pods: f64,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn round2(v: Option<f64>) -> Option<f64> {
    v.map(|x| (x * 100.0).round() / 100.0)
}

/// Summaries in (trace order of first appearance, policy) order.
pub fn summarize(results: &[RunResult]) -> Vec<Summary> {
    let mut traces: Vec<String> = Vec::new();
    let mut groups: BTreeMap<(usize, Policy), Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        let t = match traces.iter().position(|t| *t == r.trace) {
            Some(t) => t,
            None => {
                traces.push(r.trace.clone());
                traces.len() - 1
            }
        };
        groups.entry((t, r.policy)).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|((t, policy), runs)| {
            let at = |k: usize| -> Vec<f64> { runs.iter().filter_map(|r| r.at(k)).collect() };
            let a100 = at(100);
            let a130 = at(130);
            let mut seeds: Vec<u64> = runs.iter().map(|r| r.seed).collect();
            seeds.sort_unstable();
            Summary {
                trace: traces[t].clone(),
                policy: policy.name().to_string(),
                seeds,
                alloc_pct_at_100: round2((a100.len() == runs.len()).then(|| mean(&a100)).flatten()),
                alloc_pct_at_130: round2((a130.len() == runs.len()).then(|| mean(&a130)).flatten()),
                failed_pods: mean(&runs.iter().map(|r| r.failed as f64).collect::<Vec<_>>())
                    .unwrap_or(0.0),
                retried_pods: mean(&runs.iter().map(|r| r.retried as f64).collect::<Vec<_>>())
                    .unwrap_or(0.0),
            }
        })
        .collect()
}

/// Published means at 100 % arrival, by (trace, `sc_policy` label), over all seeds in the file.
#[derive(Clone, Debug, Default)]
pub struct Published {
    means: BTreeMap<(String, String), f64>,
}

impl Published {
    /// Read `analysis_allo_discrete.csv`; lines that do not parse are skipped.
    pub fn load(path: &Path) -> std::io::Result<Published> {
        let text = std::fs::read_to_string(path)?;
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (Some(w), Some(p), Some(c100)) = (col("workload"), col("sc_policy"), col("100")) else {
            return Ok(Published::default());
        };
        let mut sums: BTreeMap<(String, String), (f64, usize)> = BTreeMap::new();
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            let (Some(wl), Some(pl), Some(v)) = (
                f.get(w),
                f.get(p),
                f.get(c100).and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            let e = sums
                .entry((crate::trace::trace_label(wl), pl.to_string()))
                .or_default();
            e.0 += v;
            e.1 += 1;
        }
        Ok(Published {
            means: sums
                .into_iter()
                .map(|(k, (s, n))| (k, s / n as f64))
                .collect(),
        })
    }

    /// Published mean at 100 % for a trace and policy.
    pub fn at_100(&self, trace: &str, policy: Policy) -> Option<f64> {
        let label = policy.published_label()?;
        self.means
            .get(&(trace.to_string(), label.to_string()))
            .copied()
    }
}

/// Plain-text summary table.
pub fn table(summaries: &[Summary], published: Option<&Published>) -> String {
    let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
    let mut out = format!(
        "{:<14} {:<15} {:>5} {:>9} {:>9} {:>11} {:>9} {:>9}\n",
        "trace", "policy", "seeds", "alloc@100", "alloc@130", "published@100", "failed", "retried"
    );
    for s in summaries {
        let publ = published.and_then(|p| {
            s.policy
                .parse()
                .ok()
                .and_then(|pol| p.at_100(&s.trace, pol))
        });
        let _ = writeln!(
            out,
            "{:<14} {:<15} {:>5} {:>9} {:>9} {:>13} {:>9.1} {:>9.1}",
            s.trace,
            s.policy,
            s.seeds.len(),
            fmt(s.alloc_pct_at_100),
            fmt(s.alloc_pct_at_130),
            fmt(publ),
            s.failed_pods,
            s.retried_pods
        );
    }
    out
}

/// One colour per policy, in [`crate::Policy::ALL`] order.
const COLORS: [&str; 9] = [
    "#7f7f7f", "#9467bd", "#2ca02c", "#8c564b", "#e377c2", "#1f77b4", "#d62728", "#17becf",
    "#ff7f0e",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// SVG of mean allocation vs. arrival for every policy of one trace: the whole range on the left,
/// the top corner (arrival >= 60 %, allocation >= 60 %) enlarged on the right.
pub fn svg(trace: &str, results: &[RunResult]) -> String {
    let mut series: BTreeMap<Policy, Vec<Vec<f64>>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.trace == trace) {
        series
            .entry(r.policy)
            .or_default()
            .push(r.alloc_pct.clone());
    }
    let means: Vec<(Policy, Vec<f64>)> = series
        .into_iter()
        .map(|(p, runs)| {
            let len = runs.iter().map(Vec::len).min().unwrap_or(0);
            let m = (0..len)
                .map(|k| runs.iter().map(|r| r[k]).sum::<f64>() / runs.len() as f64)
                .collect();
            (p, m)
        })
        .collect();
    let xmax = means
        .iter()
        .map(|(_, m)| m.len())
        .max()
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1) as f64;
    let (w, h) = (1000.0, 480.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">GPU allocation vs. arrived GPU request: {} (mean over seeds)</text>"#,
        w / 2.0,
        escape(trace)
    );
    let panels = [
        (60.0, 0.0, xmax, 0.0, 100.0, 20.0),
        (560.0, 60.0, xmax, 60.0, 100.0, 10.0),
    ];
    for (left, x0, x1, y0, y1, ystep) in panels {
        let (top, pw, ph) = (45.0, 380.0, 360.0);
        let sx = |x: f64| left + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| top + ph - (y.clamp(y0, y1) - y0) / (y1 - y0) * ph;
        let _ = writeln!(
            out,
            r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let mut y = y0;
        while y <= y1 + 1e-9 {
            let _ = writeln!(
                out,
                r##"<line x1="{left}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{y:.0}</text>"##,
                left + pw,
                left - 5.0,
                sy(y) + 4.0,
                py = sy(y)
            );
            y += ystep;
        }
        let mut x = x0;
        while x <= x1 + 1e-9 {
            let _ = writeln!(
                out,
                r##"<line x1="{px:.1}" x2="{px:.1}" y1="{top}" y2="{}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle">{x:.0}</text>"##,
                top + ph,
                top + ph + 16.0,
                px = sx(x)
            );
            x += if x1 - x0 > 80.0 { 20.0 } else { 10.0 };
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">arrived GPU request (% of capacity)</text>"#,
            left + pw / 2.0,
            top + ph + 34.0
        );
        let _ = writeln!(
            out,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">allocated GPU (%)</text>"#,
            left - 38.0,
            top + ph / 2.0
        );
        for (idx, (p, m)) in means.iter().enumerate() {
            let pts: Vec<String> = m
                .iter()
                .enumerate()
                .filter(|(k, _)| *k as f64 >= x0)
                .map(|(k, v)| format!("{:.1},{:.1}", sx(k as f64), sy(*v)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}"><title>{}</title></polyline>"#,
                COLORS[idx % COLORS.len()],
                pts.join(" "),
                p
            );
        }
    }
    for (idx, (p, m)) in means.iter().enumerate() {
        let y = 70.0 + idx as f64 * 18.0;
        let at100 = m
            .get(100)
            .map_or_else(String::new, |v| format!(" ({v:.2} @100)"));
        let _ = writeln!(
            out,
            r#"<line x1="580" x2="600" y1="{y}" y2="{y}" stroke="{}" stroke-width="3"/><text x="606" y="{}">{}{}</text>"#,
            COLORS[idx % COLORS.len()],
            y + 4.0,
            p,
            at100
        );
    }
    out.push_str("</svg>\n");
    out
}
