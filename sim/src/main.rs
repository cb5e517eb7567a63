//! `vgpu-sim` command line.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

use vgpu_sim::policy::parse_policies;
use vgpu_sim::report::{self, Published};
use vgpu_sim::trace::{load_nodes, load_pods, pod_list_path, trace_label};
use vgpu_sim::{parse_seeds, run_all_with, Cluster, Trace};

/// Replay the Alibaba GPU-sharing trace against placement policies (method of the FGD paper,
/// ATC'23) and report the GPU allocation ratio against arrived GPU request.
#[derive(Debug, Parser)]
#[command(name = "vgpu-sim", version)]
struct Args {
    /// Folder holding the trace CSVs (openb_node_list_gpu_node.csv, openb_pod_list_*.csv).
    #[arg(long, env = "VGPU_SIM_TRACE_DIR")]
    trace_dir: PathBuf,

    /// Node list, a file name inside --trace-dir or a path.
    #[arg(long, default_value = "openb_node_list_gpu_node.csv")]
    nodes: String,

    /// Pod lists: names like `default`, `gpushare100` (openb_pod_list_<name>.csv in --trace-dir) or
    /// paths; comma-separated or repeated.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    trace: Vec<String>,

    /// Policies, comma-separated, or `all`: random, dotprod, bestfit, gpu-packing,
    /// gpu-clustering, fgd, ours, fgd-live, ours-live.
    #[arg(long, default_value = "all")]
    policy: String,

    /// One seed (ignored when --seeds is given).
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Seed list, e.g. `42-51` or `1,2,5-9`.
    #[arg(long)]
    seeds: Option<String>,

    /// Workload tuning: total GPU request as a multiple of cluster GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    tune: f64,

    /// Write the per-run CSV here (`-` for standard output).
    #[arg(long)]
    csv: Option<PathBuf>,

    /// Write one JSON object per (trace, policy) with means over seeds.
    #[arg(long)]
    summary_json: Option<PathBuf>,

    /// Write an SVG plot of allocation vs. arrival; with several traces, `<stem>-<trace>.svg`.
    #[arg(long)]
    svg: Option<PathBuf>,

    /// Published results (analysis_allo_discrete.csv) to show next to ours in the table.
    #[arg(long, env = "VGPU_SIM_EXPECTED")]
    expected: Option<PathBuf>,

    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,

    /// Which of the best-scored nodes a pod goes to: `name` (the smallest name, as the published
    /// simulator and the extender with --choose-node) or `random` (as kube-scheduler).
    #[arg(long, value_enum, default_value = "name")]
    ties: TiesArg,

    /// kube-scheduler's percentageOfNodesToScore: below 100 each pod sees only the nodes
    /// kube-scheduler samples (0: its adaptive default, about 41 % of the trace's 1213 nodes).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100))]
    percentage_of_nodes_to_score: u32,

    /// Rescore every node for every pod (benchmark baseline for the score cache).
    #[arg(long, hide = true)]
    no_score_cache: bool,
}

/// `--ties` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum TiesArg {
    Name,
    Random,
}

fn svg_path(base: &Path, trace: &str, several: bool) -> PathBuf {
    if !several {
        return base.to_path_buf();
    }
    let stem = base
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plot".into());
    base.with_file_name(format!("{stem}-{trace}.svg"))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if !(args.tune > 0.0 && args.tune <= 10.0) {
        bail!("--tune must be in (0, 10], got {}", args.tune);
    }
    let policies = parse_policies(&args.policy)?;
    if policies.is_empty() {
        bail!("--policy names no policy");
    }
    let seeds = match &args.seeds {
        Some(s) => parse_seeds(s).map_err(|e| anyhow::anyhow!("--seeds: {e}"))?,
        None => vec![args.seed],
    };
    let nodes_path = pod_list_path(&args.trace_dir, &args.nodes);
    let nodes_path = if nodes_path.exists() {
        nodes_path
    } else {
        args.trace_dir.join(&args.nodes)
    };
    let rows = load_nodes(&nodes_path)?;
    let mut cluster = Cluster::new(&rows)?;
    let mut traces = Vec::new();
    for name in &args.trace {
        let path = pod_list_path(&args.trace_dir, name);
        let pods = load_pods(&path).with_context(|| format!("--trace {name}"))?;
        traces.push(Trace::new(&trace_label(name), &pods, &mut cluster)?);
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!(
        "vgpu-sim: {} nodes, {} GPUs; {} trace(s) x {} policies x {} seeds on {} threads",
        cluster.nodes.len(),
        cluster.gpu_count(),
        traces.len(),
        policies.len(),
        seeds.len(),
        threads
    );
    let start = Instant::now();
    let results = run_all_with(
        &cluster,
        &traces,
        &policies,
        &seeds,
        args.tune,
        threads,
        vgpu_sim::RunOptions {
            score_cache: !args.no_score_cache,
            ties: match args.ties {
                TiesArg::Name => vgpu_sim::Ties::Name,
                TiesArg::Random => vgpu_sim::Ties::Random,
            },
            percentage_of_nodes_to_score: args.percentage_of_nodes_to_score,
        },
    );
    let elapsed = start.elapsed();

    if let Some(path) = &args.csv {
        let text = report::csv(&results, args.tune, cluster.gpu_count());
        if path.as_os_str() == "-" {
            print!("{text}");
        } else {
            std::fs::write(path, text).with_context(|| format!("--csv {}", path.display()))?;
        }
    }
    let summaries = report::summarize(&results);
    let published = match &args.expected {
        Some(p) => Some(Published::load(p).with_context(|| format!("--expected {}", p.display()))?),
        None => None,
    };
    let table = report::table(&summaries, published.as_ref());
    if args.csv.as_deref().is_some_and(|p| p.as_os_str() == "-") {
        eprint!("{table}");
    } else {
        print!("{table}");
    }
    if let Some(path) = &args.summary_json {
        let text = serde_json::to_string_pretty(&summaries)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("--summary-json {}", path.display()))?;
    }
    if let Some(base) = &args.svg {
        for t in &traces {
            let path = svg_path(base, &t.name, traces.len() > 1);
            std::fs::write(&path, report::svg(&t.name, &results))
                .with_context(|| format!("--svg {}", path.display()))?;
        }
    }
    eprintln!(
        "vgpu-sim: {} runs in {:.2} s",
        results.len(),
        elapsed.as_secs_f64()
    );
    Ok(())
}
