//! Why a container fits no GPUs of a node: [`Unfit`] (names) and [`Miss`] (positions, cheap for
//! every failing node), and the words both write.

use super::*;

/// Why a container fits no set of GPUs on a node: the first check, in the order the module
/// documentation lists them, that left fewer GPUs than the container needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnfitReason {
    /// The node has no GPU in its inventory.
    NoGpus,
    /// Too few healthy NVIDIA GPUs.
    Unhealthy {
        /// Usable GPUs.
        usable: usize,
    },
    /// Too few GPUs that `hami.io/device-cordon` does not name.
    Cordoned {
        /// GPUs left.
        left: usize,
    },
    /// Too few GPUs of an allowed type.
    Type {
        /// GPUs left.
        left: usize,
        /// `use-gputype`, joined.
        want: String,
        /// `nouse-gputype`, joined.
        refuse: String,
        /// The models the node has, distinct, in inventory order.
        models: Vec<String>,
    },
    /// Too few GPUs with an allowed UUID.
    Uuid {
        /// GPUs left.
        left: usize,
    },
    /// Too few GPUs below their split count.
    Split {
        /// GPUs left.
        left: usize,
    },
    /// Too few GPUs free of an exclusive slice (or idle, for an exclusive request).
    Exclusive {
        /// GPUs left.
        left: usize,
        /// Whether the container itself asks for exclusivity.
        wants_exclusive: bool,
        /// Whether it does so by the `mutex` policy (else by gpucores 100).
        mutex: bool,
    },
    /// Too few GPUs with the requested cores free.
    Cores {
        /// GPUs left.
        left: usize,
        /// Cores asked per GPU.
        want: u32,
        /// The most cores free on one candidate GPU, and its UUID.
        best: Option<(u32, String)>,
    },
    /// Too few GPUs with the requested memory free.
    Memory {
        /// GPUs left.
        left: usize,
        /// MiB asked per GPU (for a percentage, on the largest candidate).
        want_mib: u64,
        /// The percentage asked, when the request is a percentage.
        percent: Option<u32>,
        /// The most MiB free on one candidate GPU, and its UUID.
        best: Option<(u64, String)>,
    },
    /// Enough GPUs fit, but too few on any one NUMA node (`nvidia.com/numa-bind`).
    Numa {
        /// The most that fit on one NUMA node.
        left: usize,
    },
}

/// A container that fits no GPUs of a node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// The container.
    pub container: String,
    /// GPUs it asks for.
    pub gpus: u32,
    /// Why.
    pub reason: UnfitReason,
    /// Whether the pod has more than one vGPU container (then messages name the container).
    pub several: bool,
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.several {
            write!(f, "container {:?}: ", self.container)?;
        }
        let n = self.gpus;
        // "no GPU with X" for one GPU, "2 GPUs with X needed, 1 has it" for several.
        let lead = |f: &mut fmt::Formatter<'_>, what: &str, left: usize| {
            if n <= 1 || left == 0 {
                write!(f, "no GPU {what}")
            } else {
                write!(f, "{n} GPUs {what} needed, only {left}")
            }
        };
        match &self.reason {
            UnfitReason::NoGpus => write!(f, "no GPUs in the node's inventory"),
            UnfitReason::Unhealthy { usable } => {
                if *usable == 0 {
                    write!(f, "no healthy GPU")
                } else {
                    write!(f, "{n} healthy GPUs needed, only {usable}")
                }
            }
            UnfitReason::Type {
                left,
                want,
                refuse,
                models,
            } => {
                let mut what = String::new();
                if !want.is_empty() {
                    what.push_str(&format!("of type {want}"));
                }
                if !refuse.is_empty() {
                    if !what.is_empty() {
                        what.push_str(", ");
                    }
                    what.push_str(&format!("not of type {refuse}"));
                }
                lead(f, &what, *left)?;
                write!(f, " (node has {})", models.join(", "))
            }
            UnfitReason::Cordoned { left } => lead(f, CORDON_WORDS, *left),
            UnfitReason::Uuid { left } => lead(f, "with an allowed UUID", *left),
            UnfitReason::Split { left } => lead(f, "below its split count", *left),
            UnfitReason::Exclusive {
                left,
                wants_exclusive,
                mutex,
            } => lead(f, exclusive_words(*wants_exclusive, *mutex), *left),
            UnfitReason::Cores { left, want, best } => {
                lead(f, &format!("with {want}% cores free"), *left)?;
                match best {
                    Some((c, uuid)) => write!(f, " (most {c}% on {uuid})"),
                    None => Ok(()),
                }
            }
            UnfitReason::Memory {
                left,
                want_mib,
                percent,
                best,
            } => {
                let what = match percent {
                    Some(p) => format!("with {p}% memory ({want_mib} MiB) free"),
                    None => format!("with {want_mib} MiB free"),
                };
                lead(f, &what, *left)?;
                match best {
                    Some((m, uuid)) => write!(f, " (largest {m} MiB on {uuid})"),
                    None => Ok(()),
                }
            }
            UnfitReason::Numa { left } => lead(f, NUMA_WORDS, *left),
        }
    }
}

/// What a container's GPUs must be under `nvidia.com/numa-bind` when too few fit on one node.
pub(super) const NUMA_WORDS: &str = "that fit on one NUMA node (nvidia.com/numa-bind)";

/// What a GPU must be for a pod when cordons leave too few.
pub(super) const CORDON_WORDS: &str = "outside the cordon (node annotation hami.io/device-cordon)";

/// What a GPU must be for a pod when exclusive slices leave too few.
pub(super) fn exclusive_words(wants_exclusive: bool, mutex: bool) -> &'static str {
    match (wants_exclusive, mutex) {
        (true, false) => "idle (gpucores 100 needs a whole card)",
        (true, true) => "idle (the mutex policy needs a GPU nothing else uses)",
        (false, _) => "free of an exclusive pod (gpucores 100 or mutex)",
    }
}

/// Why a container fits no GPUs of a node, as positions into the node's GPUs instead of names:
/// what [`score_buf`] returns, cheap to make for every failing node. [`write_miss`] writes the
/// same words as [`Unfit`]'s `Display`; [`Miss::to_unfit`] gives the [`Unfit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    /// Position of the container in [`PodRequest::containers`].
    pub container: usize,
    /// Why.
    pub why: MissReason,
}

/// [`UnfitReason`] without names (GPUs by position in the node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum MissReason {
    NoGpus,
    Unhealthy {
        usable: usize,
    },
    Cordoned {
        left: usize,
    },
    Type {
        left: usize,
    },
    Uuid {
        left: usize,
    },
    Split {
        left: usize,
    },
    Exclusive {
        left: usize,
        wants_exclusive: bool,
        mutex: bool,
    },
    Cores {
        left: usize,
        want: u32,
        best: Option<(u32, usize)>,
    },
    Memory {
        left: usize,
        want_mib: u64,
        percent: Option<u32>,
        best: Option<(u64, usize)>,
    },
    Numa {
        left: usize,
    },
}

/// Positions of the first GPU of each distinct model, in inventory order.
pub(super) fn distinct_models<S: GpuSet + ?Sized>(node: &S) -> impl Iterator<Item = usize> + '_ {
    (0..node.len()).filter(move |&i| (0..i).all(|j| !node.same_model(j, i)))
}

impl Miss {
    /// The [`Unfit`] this stands for, names resolved on `node`.
    pub fn to_unfit<S: GpuSet + ?Sized>(&self, node: &S, pod: &PodRequest) -> Unfit {
        let c = &pod.containers[self.container];
        let reason = match self.why {
            MissReason::NoGpus => UnfitReason::NoGpus,
            MissReason::Unhealthy { usable } => UnfitReason::Unhealthy { usable },
            MissReason::Cordoned { left } => UnfitReason::Cordoned { left },
            MissReason::Type { left } => UnfitReason::Type {
                left,
                want: pod.filter.use_types.joined(),
                refuse: pod.filter.nouse_types.joined(),
                models: distinct_models(node)
                    .map(|i| node.model(i).to_string())
                    .collect(),
            },
            MissReason::Uuid { left } => UnfitReason::Uuid { left },
            MissReason::Split { left } => UnfitReason::Split { left },
            MissReason::Exclusive {
                left,
                wants_exclusive,
                mutex,
            } => UnfitReason::Exclusive {
                left,
                wants_exclusive,
                mutex,
            },
            MissReason::Cores { left, want, best } => UnfitReason::Cores {
                left,
                want,
                best: best.map(|(c, i)| (c, node.uuid(i).to_string())),
            },
            MissReason::Memory {
                left,
                want_mib,
                percent,
                best,
            } => UnfitReason::Memory {
                left,
                want_mib,
                percent,
                best: best.map(|(m, i)| (m, node.uuid(i).to_string())),
            },
            MissReason::Numa { left } => UnfitReason::Numa { left },
        };
        Unfit {
            container: c.name.clone(),
            gpus: c.request.gpus,
            reason,
            several: pod.containers.len() > 1,
        }
    }
}

/// Writes the message for `miss` on `node`: the same words as the `Display` of
/// [`Miss::to_unfit`], without building it.
pub fn write_miss<S: GpuSet + ?Sized, W: fmt::Write + ?Sized>(
    f: &mut W,
    node: &S,
    pod: &PodRequest,
    miss: &Miss,
) -> fmt::Result {
    let c = &pod.containers[miss.container];
    if pod.containers.len() > 1 {
        write!(f, "container {:?}: ", c.name)?;
    }
    let n = c.request.gpus;
    fn lead<W: fmt::Write + ?Sized>(
        f: &mut W,
        n: u32,
        left: usize,
        what: fmt::Arguments<'_>,
    ) -> fmt::Result {
        if n <= 1 || left == 0 {
            write!(f, "no GPU {what}")
        } else {
            write!(f, "{n} GPUs {what} needed, only {left}")
        }
    }
    struct Types<'a>(&'a GpuFilter);
    impl fmt::Display for Types<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let list = |f: &mut fmt::Formatter<'_>, l: &NameList| {
                for (k, t) in l.0.iter().enumerate() {
                    if k > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(t)?;
                }
                Ok(())
            };
            if !self.0.use_types.is_empty() {
                f.write_str("of type ")?;
                list(f, &self.0.use_types)?;
            }
            if !self.0.nouse_types.is_empty() {
                if !self.0.use_types.is_empty() {
                    f.write_str(", ")?;
                }
                f.write_str("not of type ")?;
                list(f, &self.0.nouse_types)?;
            }
            Ok(())
        }
    }
    match miss.why {
        MissReason::NoGpus => f.write_str("no GPUs in the node's inventory"),
        MissReason::Unhealthy { usable } => {
            if usable == 0 {
                f.write_str("no healthy GPU")
            } else {
                write!(f, "{n} healthy GPUs needed, only {usable}")
            }
        }
        MissReason::Type { left } => {
            lead(f, n, left, format_args!("{}", Types(&pod.filter)))?;
            f.write_str(" (node has ")?;
            for (k, i) in distinct_models(node).enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(node.model(i))?;
            }
            f.write_str(")")
        }
        MissReason::Cordoned { left } => lead(f, n, left, format_args!("{CORDON_WORDS}")),
        MissReason::Uuid { left } => lead(f, n, left, format_args!("with an allowed UUID")),
        MissReason::Split { left } => lead(f, n, left, format_args!("below its split count")),
        MissReason::Exclusive {
            left,
            wants_exclusive,
            mutex,
        } => lead(
            f,
            n,
            left,
            format_args!("{}", exclusive_words(wants_exclusive, mutex)),
        ),
        MissReason::Cores { left, want, best } => {
            lead(f, n, left, format_args!("with {want}% cores free"))?;
            match best {
                Some((c, i)) => write!(f, " (most {c}% on {})", node.uuid(i)),
                None => Ok(()),
            }
        }
        MissReason::Memory {
            left,
            want_mib,
            percent,
            best,
        } => {
            match percent {
                Some(p) => lead(
                    f,
                    n,
                    left,
                    format_args!("with {p}% memory ({want_mib} MiB) free"),
                )?,
                None => lead(f, n, left, format_args!("with {want_mib} MiB free"))?,
            }
            match best {
                Some((m, i)) => write!(f, " (largest {m} MiB on {})", node.uuid(i)),
                None => Ok(()),
            }
        }
        MissReason::Numa { left } => lead(f, n, left, format_args!("{NUMA_WORDS}")),
    }
}
