//! The two writers of the filter and prioritize answers: the typed `ExtenderFilterResult` (for
//! calls that carry whole Node objects) and JSON written straight out (for the names-only calls
//! the chart's kube-scheduler makes). The decision is [`super::AppState`]'s, told through
//! [`Verdicts`]; only the writing differs.

use crate::extender::{
    node_name, push_json_str, push_u32, ArgsView, ExtenderArgs, ExtenderFilterResult, Name,
    NodeList, PodView,
};

/// Where a filter's verdicts go, in candidate order.
pub(super) trait Verdicts<'n> {
    /// `node` fits the pod.
    fn pass(&mut self, node: &'n str);
    /// `node` does not fit now, for `why`.
    fn fail(&mut self, node: &'n str, why: &str);
    /// `node` cannot fit whatever changes on it (the request itself is wrong), for `why`.
    fn unresolvable(&mut self, node: &'n str, why: &str);
}

/// The verdicts gathered into an [`ExtenderFilterResult`].
#[derive(Default)]
pub(super) struct TypedVerdicts<'n> {
    passed: Vec<&'n str>,
    result: ExtenderFilterResult,
}

impl<'n> Verdicts<'n> for TypedVerdicts<'n> {
    fn pass(&mut self, node: &'n str) {
        self.passed.push(node);
    }
    fn fail(&mut self, node: &'n str, why: &str) {
        self.result.failed_nodes.insert(node.into(), why.into());
    }
    fn unresolvable(&mut self, node: &'n str, why: &str) {
        let failed = &mut self.result.failed_and_unresolvable_nodes;
        failed.insert(node.into(), why.into());
    }
}

impl TypedVerdicts<'_> {
    /// The answer in the form the call came in: the passing Node objects when it sent objects,
    /// the passing names when it sent names (or neither).
    pub(super) fn into_result(self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let TypedVerdicts { passed, mut result } = self;
        if let Some(list) = &args.nodes {
            // `passed` is in list order.
            let mut i = 0;
            let mut items = Vec::with_capacity(passed.len());
            for item in &list.items {
                if i < passed.len() && node_name(item) == Some(passed[i]) {
                    items.push(item.clone());
                    i += 1;
                }
            }
            result.nodes = Some(NodeList {
                items,
                ..list.clone_empty()
            });
        }
        if args.nodenames.is_some() || args.nodes.is_none() {
            result.nodenames = Some(passed.iter().map(|n| n.to_string()).collect());
        }
        result
    }
}

/// The verdicts written as the JSON of `ExtenderFilterResult` as they come.
pub(super) struct JsonVerdicts {
    out: Vec<u8>,
    passed: usize,
    failed: Vec<u8>,
    unresolvable: Vec<u8>,
}

impl JsonVerdicts {
    pub(super) fn new(candidates: usize) -> JsonVerdicts {
        let mut out = Vec::with_capacity(32 + candidates * 16);
        out.extend_from_slice(b"{\"NodeNames\":[");
        JsonVerdicts {
            out,
            passed: 0,
            failed: Vec::new(),
            unresolvable: Vec::new(),
        }
    }

    /// The whole answer.
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        for (key, map) in [
            ("FailedNodes", self.failed),
            ("FailedAndUnresolvableNodes", self.unresolvable),
        ] {
            if !map.is_empty() {
                self.out.extend_from_slice(b",\"");
                self.out.extend_from_slice(key.as_bytes());
                self.out.extend_from_slice(b"\":");
                self.out.extend_from_slice(&map);
                self.out.push(b'}');
            }
        }
        self.out.push(b'}');
        self.out
    }
}

/// Appends `"node":"why"` to a JSON object being written (its `}` comes at the end).
fn push_entry(map: &mut Vec<u8>, node: &str, why: &str) {
    map.push(if map.is_empty() { b'{' } else { b',' });
    push_json_str(map, node);
    map.push(b':');
    push_json_str(map, why);
}

impl<'n> Verdicts<'n> for JsonVerdicts {
    fn pass(&mut self, node: &'n str) {
        if self.passed > 0 {
            self.out.push(b',');
        }
        self.passed += 1;
        push_json_str(&mut self.out, node);
    }
    fn fail(&mut self, node: &'n str, why: &str) {
        push_entry(&mut self.failed, node, why);
    }
    fn unresolvable(&mut self, node: &'n str, why: &str) {
        push_entry(&mut self.unresolvable, node, why);
    }
}

/// The start of a `HostPriorityList` in JSON, with room for `candidates`.
pub(super) fn json_priorities(candidates: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + candidates * 32);
    out.push(b'[');
    out
}

/// Appends one `HostPriority` to a list [`json_priorities`] began.
pub(super) fn push_priority(out: &mut Vec<u8>, node: &str, score: u32) {
    if out.len() > 1 {
        out.push(b',');
    }
    out.extend_from_slice(b"{\"Host\":");
    push_json_str(out, node);
    out.extend_from_slice(b",\"Score\":");
    push_u32(out, score);
    out.push(b'}');
}

/// The pod and the candidate names of a names-only call, borrowed from the body; `None` for a
/// body the lean read does not serve (whole Node objects, no pod, or not extender JSON), which
/// the typed path answers or refuses.
pub(super) fn lean_args(body: &[u8]) -> Option<(PodView<'_>, Vec<Name<'_>>)> {
    match serde_json::from_slice(body) {
        Ok(ArgsView {
            pod: Some(pod),
            nodes: None,
            nodenames,
        }) => Some((pod, nodenames.unwrap_or_default())),
        _ => None,
    }
}
