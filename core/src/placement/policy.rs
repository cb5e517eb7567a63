//! The placement policies: node and GPU ordering (`binpack`, `spread`, `fragmentation`,
//! `gap-aware`), HAMi's GPU policy words (`mutex`, `topology-aware`, `numa`) and their errors.

use super::*;

/// How to order nodes, or GPUs within a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Most used first: keeps whole cards and nodes free for large requests.
    #[default]
    Binpack,
    /// Least used first: spreads load and interference.
    Spread,
    /// Fragmentation-aware (FGD, "Beware of Fragmentation", ATC'23): as a node policy, nodes
    /// whose fragmentation against the typical pods grows least score highest; as a GPU policy, a
    /// one-GPU pod takes the GPU that leaves its node least fragmented. Needs a typical-pod table
    /// ([`live::LiveFrag`]); without one it acts as `binpack`.
    Fragmentation,
    /// `fragmentation` plus what each GPU's gap is still worth ([`gaps`]): the node measure adds
    /// the unusable part of every GPU's free share at LP prices of the typical share sizes, so a
    /// pod goes where it spoils no gap the typical pods could still fill (a 47 % pod next to a
    /// lone 47 %, a 16 % pod into an 81 %'s hole). The simulator's `ours-live`. Needs the
    /// typical-pod table; without one it acts as `binpack`.
    GapAware,
}

impl Policy {
    /// The policy's name as annotations and flags spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Fragmentation => "fragmentation",
            Policy::GapAware => "gap-aware",
        }
    }

    /// Whether the policy scores against the typical-pod table.
    pub fn uses_table(self) -> bool {
        matches!(self, Policy::Fragmentation | Policy::GapAware)
    }

    /// Every policy name, for messages.
    pub const NAMES: &'static str = "binpack, spread, fragmentation, gap-aware";

    /// Reads a policy name (case-insensitive, surrounding spaces ignored).
    pub fn parse(s: &str) -> Option<Policy> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("binpack") {
            Some(Policy::Binpack)
        } else if s.eq_ignore_ascii_case("spread") {
            Some(Policy::Spread)
        } else if s.eq_ignore_ascii_case("fragmentation") {
            Some(Policy::Fragmentation)
        } else if s.eq_ignore_ascii_case("gap-aware") {
            Some(Policy::GapAware)
        } else {
            None
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::parse(s).ok_or_else(|| format!("{s:?} is not one of {}", Policy::NAMES))
    }
}

/// An annotation holding a policy name we do not know.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("annotation {annotation}: {word:?} is not one of {known}")]
pub struct PolicyError {
    /// The annotation key.
    pub annotation: &'static str,
    /// The word we do not know (the whole value for the node policy).
    pub word: String,
    /// The words the annotation takes.
    pub known: &'static str,
}

/// What `hami.io/gpu-scheduler-policy` says: a comma list as HAMi v2.10 reads it
/// (`pkg/scheduler/policy/gpu_policy.go` `gpuSortKeyChain`, `pkg/util/util.go` `PolicyContains`):
/// the first ordering policy orders the GPUs (HAMi breaks its ties with the later ones, we by
/// GPU index), `mutex` asks for GPUs nothing else uses, `topology-aware` for NVLink-joined GPUs,
/// `numa` for one NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPolicy {
    /// The ordering policy, if the list names one.
    pub order: Option<Policy>,
    /// Whether the list has `mutex`.
    pub mutex: bool,
    /// Whether the list has `topology-aware`.
    pub topology: bool,
    /// Whether the list has `numa`.
    pub numa: bool,
}

impl GpuPolicy {
    /// Every word the GPU policy takes, for messages.
    pub const NAMES: &'static str =
        "binpack, spread, fragmentation, gap-aware, mutex, topology-aware, numa";

    /// Reads a comma list (words case-insensitive, spaces and empty entries ignored); the
    /// unknown word on error.
    pub fn parse(s: &str) -> Result<GpuPolicy, String> {
        let mut p = GpuPolicy {
            order: None,
            mutex: false,
            topology: false,
            numa: false,
        };
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word.eq_ignore_ascii_case(MUTEX) {
                p.mutex = true;
            } else if word.eq_ignore_ascii_case(TOPOLOGY_AWARE) {
                p.topology = true;
            } else if word.eq_ignore_ascii_case(NUMA) {
                p.numa = true;
            } else {
                let order = Policy::parse(word).ok_or_else(|| word.to_string())?;
                p.order.get_or_insert(order);
            }
        }
        Ok(p)
    }
}
