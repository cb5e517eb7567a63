//! Loading the Alibaba GPU-sharing trace (`openb_node_list_*.csv`, `openb_pod_list_*.csv`).
//!
//! Columns are found by header name, so the five-column `multigpu*` pod lists (no `gpu_spec`) load
//! like the others. Extra columns (qos, times) are ignored: pods never leave in this method.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vgpu_core::placement::frag::{ModelMask, MILLI};

/// Most GPUs one node may have (the trace has at most 8).
pub const MAX_GPUS: usize = 16;

/// A bad trace file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A required column is missing from the header.
    #[error("{path}: no column `{column}` in the header")]
    MissingColumn {
        /// File.
        path: PathBuf,
        /// Column name.
        column: &'static str,
    },
    /// A field does not parse or is out of range.
    #[error("{path}:{line}: field `{column}`: {message}")]
    Field {
        /// File.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// Column name.
        column: &'static str,
        /// What is wrong.
        message: String,
    },
    /// More distinct GPU models than a model mask holds.
    #[error("more than 64 distinct GPU models")]
    TooManyModels,
    /// No node has a GPU.
    #[error("{path}: no GPU node")]
    NoGpu {
        /// File.
        path: PathBuf,
    },
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    /// Node name.
    pub name: String,
    /// milli-CPU capacity.
    pub cpu_milli: u64,
    /// Memory capacity, MiB.
    pub memory_mib: u64,
    /// Number of GPUs.
    pub gpus: u32,
    /// GPU model name (empty for CPU nodes).
    pub model: String,
}

/// One pod of a pod list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRow {
    /// milli-CPU request.
    pub cpu_milli: u64,
    /// Memory request, MiB.
    pub memory_mib: u64,
    /// Number of GPUs.
    pub num_gpu: u32,
    /// milli-GPU per GPU (1000 for whole GPUs, 0 for CPU-only pods).
    pub gpu_milli: u32,
    /// Allowed GPU models (`gpu_spec`, a `|` list; empty = any).
    pub gpu_spec: Vec<String>,
}

struct Table {
    path: PathBuf,
    header: HashMap<String, usize>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    fn read(path: &Path) -> Result<Table, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut lines = text.lines().enumerate();
        let header = lines
            .next()
            .map(|(_, h)| {
                h.split(',')
                    .enumerate()
                    .map(|(i, c)| (c.trim().to_string(), i))
                    .collect()
            })
            .unwrap_or_default();
        let rows = lines
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| (i + 1, l.split(',').map(|f| f.trim().to_string()).collect()))
            .collect();
        Ok(Table {
            path: path.to_path_buf(),
            header,
            rows,
        })
    }

    fn column(&self, column: &'static str) -> Result<usize, TraceError> {
        self.header
            .get(column)
            .copied()
            .ok_or(TraceError::MissingColumn {
                path: self.path.clone(),
                column,
            })
    }

    fn field<'a>(&self, row: &'a (usize, Vec<String>), col: Option<usize>) -> &'a str {
        col.and_then(|c| row.1.get(c))
            .map(String::as_str)
            .unwrap_or("")
    }

    fn number(
        &self,
        row: &(usize, Vec<String>),
        col: usize,
        column: &'static str,
    ) -> Result<u64, TraceError> {
        let text = self.field(row, Some(col));
        // pandas writes integers of a float column as "8.0".
        let text = text.strip_suffix(".0").unwrap_or(text);
        text.parse::<u64>().map_err(|e| TraceError::Field {
            path: self.path.clone(),
            line: row.0,
            column,
            message: format!("`{text}`: {e}"),
        })
    }

    fn bad(&self, row: &(usize, Vec<String>), column: &'static str, message: String) -> TraceError {
        TraceError::Field {
            path: self.path.clone(),
            line: row.0,
            column,
            message,
        }
    }
}

/// Read a node list (`sn,cpu_milli,memory_mib,gpu,model`). CPU-only nodes are kept.
pub fn load_nodes(path: &Path) -> Result<Vec<NodeRow>, TraceError> {
    let t = Table::read(path)?;
    let (sn, cpu, mem, gpu) = (
        t.column("sn")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("gpu")?,
    );
    let model = t.header.get("model").copied();
    let mut out = Vec::with_capacity(t.rows.len());
    for row in &t.rows {
        let gpus = t.number(row, gpu, "gpu")?;
        if gpus as usize > MAX_GPUS {
            return Err(t.bad(
                row,
                "gpu",
                format!("{gpus} GPUs, at most {MAX_GPUS} supported"),
            ));
        }
        let m = t.field(row, model);
        let m = if m == "nan" { "" } else { m };
        if gpus > 0 && m.is_empty() {
            return Err(t.bad(row, "model", "a GPU node needs a model".into()));
        }
        out.push(NodeRow {
            name: t.field(row, Some(sn)).to_string(),
            cpu_milli: t.number(row, cpu, "cpu_milli")?,
            memory_mib: t.number(row, mem, "memory_mib")?,
            gpus: gpus as u32,
            model: m.to_string(),
        });
    }
    if out.iter().all(|n| n.gpus == 0) {
        return Err(TraceError::NoGpu {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// Read a pod list (`cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]`).
pub fn load_pods(path: &Path) -> Result<Vec<PodRow>, TraceError> {
    let t = Table::read(path)?;
    let (cpu, mem, num, milli) = (
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("num_gpu")?,
        t.column("gpu_milli")?,
    );
    let spec = t.header.get("gpu_spec").copied();
    let mut out = Vec::with_capacity(t.rows.len());
    for row in &t.rows {
        let num_gpu = t.number(row, num, "num_gpu")?;
        let mut gpu_milli = t.number(row, milli, "gpu_milli")?;
        if num_gpu as usize > MAX_GPUS {
            return Err(t.bad(
                row,
                "num_gpu",
                format!("{num_gpu} GPUs, at most {MAX_GPUS} supported"),
            ));
        }
        if gpu_milli > u64::from(MILLI) {
            return Err(t.bad(
                row,
                "gpu_milli",
                format!("{gpu_milli} is more than one GPU ({MILLI})"),
            ));
        }
        if num_gpu == 0 {
            gpu_milli = 0;
        } else if gpu_milli == 0 {
            return Err(t.bad(row, "gpu_milli", format!("0 with num_gpu {num_gpu}")));
        } else if num_gpu > 1 && gpu_milli != u64::from(MILLI) {
            return Err(t.bad(
                row,
                "gpu_milli",
                format!(
                    "{gpu_milli} per GPU on a {num_gpu}-GPU pod: only a single GPU can be shared"
                ),
            ));
        }
        let s = t.field(row, spec);
        let gpu_spec = if s.is_empty() || s == "nan" {
            Vec::new()
        } else {
            s.split('|')
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect()
        };
        out.push(PodRow {
            cpu_milli: t.number(row, cpu, "cpu_milli")?,
            memory_mib: t.number(row, mem, "memory_mib")?,
            num_gpu: num_gpu as u32,
            gpu_milli: gpu_milli as u32,
            gpu_spec,
        });
    }
    Ok(out)
}

/// Path of a pod list: `name` as given when it names a file (contains a `/` or ends in `.csv`),
/// else `<dir>/openb_pod_list_<name>.csv`.
pub fn pod_list_path(dir: &Path, name: &str) -> PathBuf {
    if name.contains('/') || name.ends_with(".csv") {
        PathBuf::from(name)
    } else {
        dir.join(format!("openb_pod_list_{name}.csv"))
    }
}

/// Short name of a pod list for reports: `openb_pod_list_gpushare100.csv` -> `gpushare100`.
pub fn trace_label(name: &str) -> String {
    let file = Path::new(name)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.to_string());
    let stem = file.strip_suffix(".csv").unwrap_or(&file);
    stem.strip_prefix("openb_pod_list_")
        .unwrap_or(stem)
        .to_string()
}

/// GPU model names numbered for [`ModelMask`].
#[derive(Clone, Debug, Default)]
pub struct Models {
    names: Vec<String>,
}

impl Models {
    /// Index of a model, adding it if new.
    pub fn intern(&mut self, name: &str) -> Result<u32, TraceError> {
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(name)) {
            return Ok(i as u32);
        }
        if self.names.len() >= 64 {
            return Err(TraceError::TooManyModels);
        }
        self.names.push(name.to_string());
        Ok(self.names.len() as u32 - 1)
    }

    /// Mask of a `gpu_spec` list (empty = any).
    pub fn mask(&mut self, spec: &[String]) -> Result<ModelMask, TraceError> {
        let mut ids = Vec::with_capacity(spec.len());
        for s in spec {
            ids.push(self.intern(s)?);
        }
        ModelMask::of(ids).ok_or(TraceError::TooManyModels)
    }

    /// Model names by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_paths() {
        assert_eq!(trace_label("default"), "default");
        assert_eq!(
            trace_label("x/openb_pod_list_gpushare100.csv"),
            "gpushare100"
        );
        assert_eq!(trace_label("mine.csv"), "mine");
        assert_eq!(
            pod_list_path(Path::new("d"), "cpu250"),
            Path::new("d/openb_pod_list_cpu250.csv")
        );
        assert_eq!(
            pod_list_path(Path::new("d"), "a/b.csv"),
            Path::new("a/b.csv")
        );
    }

    #[test]
    fn pods_parse_and_reject_bad_fields() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.csv");
        std::fs::write(&p, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1000,2,1,500,T4|P100\nb,2000,4,0,0,\nc,3000,8,2,1000,nan\n").unwrap();
        let pods = load_pods(&p).unwrap();
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[0].gpu_spec, vec!["T4".to_string(), "P100".to_string()]);
        assert_eq!(pods[1].num_gpu, 0);
        assert!(pods[2].gpu_spec.is_empty());

        std::fs::write(
            &p,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,2,2,500\n",
        )
        .unwrap();
        let e = load_pods(&p).unwrap_err().to_string();
        assert!(e.contains(":2: field `gpu_milli`"), "{e}");
        std::fs::write(&p, "name,cpu_milli,num_gpu,gpu_milli\n").unwrap();
        let e = load_pods(&p).unwrap_err().to_string();
        assert!(e.contains("no column `memory_mib`"), "{e}");
        std::fs::write(
            &p,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,x,2,1,500\n",
        )
        .unwrap();
        let e = load_pods(&p).unwrap_err().to_string();
        assert!(e.contains("field `cpu_milli`: `x`"), "{e}");
    }

    #[test]
    fn nodes_parse() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("n.csv");
        std::fs::write(
            &p,
            "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,1024,2,T4\nn1,8000,64,0,\n",
        )
        .unwrap();
        let nodes = load_nodes(&p).unwrap();
        assert_eq!(nodes[0].gpus, 2);
        assert_eq!(nodes[1].model, "");
        std::fs::write(&p, "sn,cpu_milli,memory_mib,gpu,model\nn1,8000,64,0,\n").unwrap();
        assert!(matches!(load_nodes(&p), Err(TraceError::NoGpu { .. })));
    }

    #[test]
    fn models_intern_case_insensitively() {
        let mut m = Models::default();
        assert_eq!(m.intern("T4").unwrap(), 0);
        assert_eq!(m.intern("t4").unwrap(), 0);
        let mask = m.mask(&["P100".into(), "T4".into()]).unwrap();
        assert!(mask.allows(0) && mask.allows(1) && !mask.allows(2));
    }
}
