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
//! `percent` is the share of each GPU a pod takes: the larger of its memory and cores shares. The
//! table is built as FGD builds it: the most frequent shapes until they cover 95 % of the count.

use serde::Deserialize;
use std::path::Path;
use thiserror::Error;
use vgpu_core::placement::frag::{typical_pods, LiveFrag, ModelMask, PodShape};

/// Coverage of the typical-pod table, percent of the count (FGD's popularity threshold).
pub const TYPICAL_PCT: f64 = 95.0;

/// One shape of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypicalShape {
    /// GPUs per pod, at least 1.
    pub gpus: u32,
    /// Share of each GPU, percent, 1..=100.
    pub percent: u32,
    /// How many pods of this shape, relative to the others, at least 1.
    pub count: u64,
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
    /// The list is empty.
    #[error("{path}: the list has no pod shape")]
    Empty {
        /// The file.
        path: String,
    },
}

/// The table for these shapes.
pub fn table(shapes: &[TypicalShape]) -> LiveFrag {
    LiveFrag::new(&typical_pods(
        shapes.iter().map(|s| {
            (
                PodShape {
                    cpu_milli: 0,
                    gpu_milli: s.percent * 10,
                    num_gpu: s.gpus,
                    models: ModelMask::ANY,
                },
                s.count,
            )
        }),
        TYPICAL_PCT,
    ))
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
