//! The typical-pod table of the `fragmentation` and `gap-aware` policies, from a file (`--typical-pods`) instead of
//! the placed pods.
//!
//! The file is a JSON list of pod shapes with relative counts, e.g. a workload where most pods take
//! half a card and some take two whole cards:
//!
//! ```json
//! [{"gpus": 1, "percent": 50, "count": 80}, {"gpus": 2, "percent": 100, "count": 20}]
//! ```
//!
//! `percent` is the share of each GPU a pod takes: the larger of its memory and cores shares.
//! Optional `cpu` and `memory` (Kubernetes quantities, the pod's requests, e.g. `"4"`, `"16Gi"`)
//! give the `gap-aware` policy's host terms what these pods ask of a node besides GPUs; without
//! them the shape asks nothing. The table is built as FGD builds it: the most frequent shapes
//! until they cover 95 % of the count.

use serde::Deserialize;
use std::path::Path;
use thiserror::Error;
use vgpu_core::placement::frag::{typical_pods, ModelMask, PodShape};
use vgpu_core::placement::host::PodKind;
use vgpu_core::placement::live::LiveFrag;
use vgpu_core::quantity::parse_ceil;

/// Coverage of the typical-pod table, percent of the count (FGD's popularity threshold).
pub const TYPICAL_PCT: f64 = 95.0;

/// One shape of the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypicalShape {
    /// GPUs per pod, at least 1.
    pub gpus: u32,
    /// Share of each GPU, percent, 1..=100.
    pub percent: u32,
    /// How many pods of this shape, relative to the others, at least 1.
    pub count: u64,
    /// The pod's CPU request, a Kubernetes quantity.
    #[serde(default)]
    pub cpu: Option<String>,
    /// The pod's memory request, a Kubernetes quantity.
    #[serde(default)]
    pub memory: Option<String>,
}

/// Why a typical-pod file cannot be used.
#[derive(Debug, Error)]
pub enum TypicalError {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It is not a JSON list of shapes.
    #[error("{path}: not a JSON list of {{gpus, percent, count}}: {source}")]
    Json {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A value is out of range.
    #[error("{path}: entry {index}: {field} {value} is out of range {range}")]
    Range {
        /// The file.
        path: String,
        /// Position in the list, from 0.
        index: usize,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The allowed range.
        range: &'static str,
    },
    /// A request is not a Kubernetes quantity.
    #[error("{path}: entry {index}: {field} {value:?}: {source}")]
    Quantity {
        /// The file.
        path: String,
        /// Position in the list, from 0.
        index: usize,
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// Why.
        #[source]
        source: vgpu_core::quantity::QuantityError,
    },
    /// The list is empty.
    #[error("{path}: the list has no pod shape")]
    Empty {
        /// The file.
        path: String,
    },
}

/// A shape's (milli-CPU, MiB) requests (0 when not given).
fn requests(path: &str, index: usize, s: &TypicalShape) -> Result<(u64, u64), TypicalError> {
    let read = |field: &'static str, value: &Option<String>, scale| match value {
        None => Ok(0),
        Some(v) => parse_ceil(v, scale).map_err(|source| TypicalError::Quantity {
            path: path.to_string(),
            index,
            field,
            value: v.clone(),
            source,
        }),
    };
    let cpu = read("cpu", &s.cpu, 3)?;
    let bytes = read("memory", &s.memory, 0)?;
    Ok((cpu, bytes.div_ceil(1 << 20)))
}

/// The table for these shapes (requests already checked, as [`parse`] does).
pub fn table(shapes: &[TypicalShape]) -> LiveFrag {
    let kinds: Vec<(PodKind, u64)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (cpu_milli, memory_mib) = requests("", i, s).unwrap_or_default();
            let shape = PodShape {
                cpu_milli,
                gpu_milli: s.percent * 10,
                num_gpu: s.gpus,
                models: ModelMask::ANY,
            };
            (PodKind { shape, memory_mib }, s.count)
        })
        .collect();
    let shapes = kinds.iter().map(|(k, n)| (k.shape, *n));
    LiveFrag::new(&typical_pods(shapes, TYPICAL_PCT)).with_host(kinds, TYPICAL_PCT)
}

/// Reads and checks a typical-pod file.
pub fn load(path: &Path) -> Result<LiveFrag, TypicalError> {
    let name = path.display().to_string();
    let text = std::fs::read(path).map_err(|source| TypicalError::Read {
        path: name.clone(),
        source,
    })?;
    parse(&name, &text)
}

/// [`load`] from the file's bytes; `path` names it in errors.
pub fn parse(path: &str, text: &[u8]) -> Result<LiveFrag, TypicalError> {
    let shapes: Vec<TypicalShape> =
        serde_json::from_slice(text).map_err(|source| TypicalError::Json {
            path: path.to_string(),
            source,
        })?;
    if shapes.is_empty() {
        return Err(TypicalError::Empty {
            path: path.to_string(),
        });
    }
    for (index, s) in shapes.iter().enumerate() {
        let bad = |field, value: u64, range| TypicalError::Range {
            path: path.to_string(),
            index,
            field,
            value,
            range,
        };
        if s.gpus == 0 || s.gpus > 64 {
            return Err(bad("gpus", u64::from(s.gpus), "1-64"));
        }
        if s.percent == 0 || s.percent > 100 {
            return Err(bad("percent", u64::from(s.percent), "1-100"));
        }
        if s.count == 0 {
            return Err(bad("count", s.count, "1 or more"));
        }
        requests(path, index, s)?;
    }
    Ok(table(&shapes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_shapes_and_names_bad_fields() {
        let t = parse(
            "t.json",
            br#"[{"gpus": 1, "percent": 50, "count": 80}, {"gpus": 2, "percent": 100, "count": 20}]"#,
        )
        .unwrap();
        // Half-card pods: two 50 % GPUs fit two of them, a 40 %-free GPU is fragment.
        assert!(t.fragmentation(&[500, 500]) < t.fragmentation(&[600, 400]));
        let e = parse(
            "t.json",
            br#"[{"gpus": 1, "percent": 50, "count": 1}, {"gpus": 1, "percent": 0, "count": 1}]"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.json: entry 1: percent 0 is out of range 1-100"
        );
        // Requests: optional quantities, named when wrong.
        let t = parse(
            "t.json",
            br#"[{"gpus": 1, "percent": 50, "count": 8, "cpu": "4", "memory": "16Gi"}]"#,
        )
        .unwrap();
        let left = |cpu_milli| {
            Some(vgpu_core::placement::host::HostLeft {
                cpu_milli,
                mem_mib: 1 << 20,
                model: 0,
            })
        };
        // A half-free GPU beside one free core cannot take the 4-core pods the file describes.
        assert!(t.gap_measure(&[500], left(1000)) > t.gap_measure(&[500], left(64_000)));
        let e = parse(
            "t.json",
            br#"[{"gpus": 1, "percent": 50, "count": 8, "cpu": "four"}]"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.json: entry 0: cpu \"four\": \"four\" is not a Kubernetes quantity"
        );
        let e = parse("t.json", br#"[{"gpus": 1, "percent": 5, "cnt": 1}]"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `cnt`"), "{e}");
        assert_eq!(
            parse("t.json", b"[]").unwrap_err().to_string(),
            "t.json: the list has no pod shape"
        );
        assert!(matches!(
            load(Path::new("/nonexistent/typical.json")),
            Err(TypicalError::Read { .. })
        ));
    }
}
