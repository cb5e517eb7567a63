//! Why a container fits no GPUs of a node: [`Miss`] (positions, cheap for every failing node),
//! the one writer of its words ([`write_miss`]), and [`Unfit`] (the miss with its words).

use super::*;

/// A container that fits no GPUs of a node: the [`Miss`], and its words with the node's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// Which container, and why.
    pub miss: Miss,
    /// [`write_miss`]'s words, resolved on the node when the miss was found.
    message: String,
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a container's GPUs must be under `nvidia.com/numa-bind` when too few fit on one node.
const NUMA_WORDS: &str = "that fit on one NUMA node (nvidia.com/numa-bind)";

/// What a GPU must be for a pod when cordons leave too few.
const CORDON_WORDS: &str = "outside the cordon (node annotation hami.io/device-cordon)";

/// What a GPU must be for a pod when exclusive slices leave too few.
fn exclusive_words(wants_exclusive: bool, mutex: bool) -> &'static str {
    match (wants_exclusive, mutex) {
        (true, false) => "idle (gpucores 100 needs a whole card)",
        (true, true) => "idle (the mutex policy needs a GPU nothing else uses)",
        (false, _) => "free of an exclusive pod (gpucores 100 or mutex)",
    }
}

/// Why a container fits no GPUs of a node, as positions into the node's GPUs instead of names:
/// what [`score_buf`] returns, cheap to make for every failing node. [`write_miss`] writes its
/// words; [`Miss::to_unfit`] keeps them beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    /// Position of the container in [`PodRequest::containers`].
    pub container: usize,
    /// Why.
    pub why: MissReason,
}

/// Why a container fits no set of GPUs on a node: the first check, in the order the module
/// documentation lists them, that left fewer GPUs than the container needs. GPUs are named by
/// position in the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReason {
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
    /// Too few GPUs of an allowed type (`use-gputype`, `nouse-gputype`).
    Type {
        /// GPUs left.
        left: usize,
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
        /// The most cores free on one candidate GPU, and its position.
        best: Option<(u32, usize)>,
    },
    /// Too few GPUs with the requested memory free.
    Memory {
        /// GPUs left.
        left: usize,
        /// MiB asked per GPU (for a percentage, on the largest candidate).
        want_mib: u64,
        /// The percentage asked, when the request is a percentage.
        percent: Option<u32>,
        /// The most MiB free on one candidate GPU, and its position.
        best: Option<(u64, usize)>,
    },
    /// Enough GPUs fit, but too few on any one NUMA node (`nvidia.com/numa-bind`).
    Numa {
        /// The most that fit on one NUMA node.
        left: usize,
    },
}

/// Positions of the first GPU of each distinct model, in inventory order.
fn distinct_models<S: GpuSet + ?Sized>(node: &S) -> impl Iterator<Item = usize> + '_ {
    (0..node.len()).filter(move |&i| (0..i).all(|j| !node.same_model(j, i)))
}

impl Miss {
    /// This miss with its words, names resolved on `node`.
    pub fn to_unfit<S: GpuSet + ?Sized>(&self, node: &S, pod: &PodRequest) -> Unfit {
        let mut message = String::new();
        // Writing into a String does not fail.
        let _ = write_miss(&mut message, node, pod, self);
        Unfit {
            miss: *self,
            message,
        }
    }
}

/// Writes the message for `miss` on `node`: "no GPU with X" when the container asks for one GPU,
/// "2 GPUs with X needed, only 1" for several, and what the node offers where that helps.
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
