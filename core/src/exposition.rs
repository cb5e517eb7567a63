//! Metrics exposition formats. The services encode their metrics as OpenMetrics (what
//! prometheus-client writes); Prometheus negotiates that format, but other scrapers, `curl` and
//! `promtool check metrics` read the classic text format 0.0.4. [`to_prometheus_text`] converts
//! one into the other, so each `/metrics` can answer both by the request's `Accept` header.

/// Content type of the classic Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of OpenMetrics text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The `(content type, body)` to answer a scrape with: the OpenMetrics text as is when `accept`
/// asks for it, else converted to the text format 0.0.4. Every service's `/metrics` calls this.
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if wants_openmetrics(accept) {
        (OPENMETRICS_TEXT, openmetrics)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&openmetrics))
    }
}

/// OpenMetrics text to Prometheus text format 0.0.4. The differences that matter: a counter's
/// metadata (`# HELP`, `# TYPE`) names the family *with* its `_total` suffix, there are no `# UNIT`
/// lines, no exemplars and no `# EOF` terminator.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, kind)| *kind == "counter")
        .map(|(name, _)| name)
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                out.push_str(prefix);
                out.push_str(name);
                out.push_str(suffix);
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None if line.starts_with('#') => out.push_str(line),
            // A sample; drop an exemplar (` # {...} value`), which 0.0.4 cannot carry.
            None => out.push_str(strip_exemplar(line)),
        }
        out.push('\n');
    }
    out
}

fn strip_exemplar(sample: &str) -> &str {
    // Label values may contain " # " and braces, so find the end of the label set by scanning
    // quotes, and look for an exemplar only after it.
    let after_labels = label_set_end(sample).unwrap_or(0);
    match sample[after_labels..].find(" # ") {
        Some(i) => &sample[..after_labels + i],
        None => sample,
    }
}

/// Byte index just after the sample's `{...}` label set, if it has one.
fn label_set_end(sample: &str) -> Option<usize> {
    let open = sample.find(['{', ' '])?;
    if sample.as_bytes()[open] != b'{' {
        return None;
    }
    let (mut in_quotes, mut escaped) = (false, false);
    for (i, c) in sample[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(open + i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_total_metadata_and_openmetrics_only_lines_go() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{code=\"200\"} 3 # {trace=\"x\"} 1\n# HELP a_latency_seconds Latency.\n# TYPE a_latency_seconds histogram\n# UNIT a_latency_seconds seconds\na_latency_seconds_bucket{le=\"+Inf\"} 1\n# HELP a_up Up.\n# TYPE a_up gauge\na_up{path=\"/x # y\"} 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{code=\"200\"} 3\n# HELP a_latency_seconds Latency.\n# TYPE a_latency_seconds histogram\na_latency_seconds_bucket{le=\"+Inf\"} 1\n# HELP a_up Up.\n# TYPE a_up gauge\na_up{path=\"/x # y\"} 1\n"
        );
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
        let om = "# TYPE a counter\na_total 1\n# EOF\n".to_string();
        assert_eq!(
            negotiate(Some("application/openmetrics-text"), om.clone()),
            (OPENMETRICS_TEXT, om.clone())
        );
        assert_eq!(
            negotiate(None, om.clone()),
            (PROMETHEUS_TEXT, to_prometheus_text(&om))
        );
    }
}
