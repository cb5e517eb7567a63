//! Whether the cache can be trusted, for `/readyz`: each watch (nodes, vGPU pods) must have
//! delivered a complete LIST since its last failure.
//!
//! A watch that fails after its cache was complete makes it *unsynced* until a fresh LIST
//! completes (watch.rs restarts the watcher for that), as client-go's reflector re-lists after a
//! failed watch: kube-runtime re-watches from its last version without saying when that worked,
//! so only a new complete LIST says nothing was missed. Decisions go on from the cache meanwhile
//! (kube-scheduler calls the extender whatever its readiness; a missed pod deletion only makes the
//! cache conservative), but the orchestrator and the operator see the watch is failing and why.

use std::sync::Mutex;

/// One of the scheduler's watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// Node metadata: the inventory and heartbeat annotations.
    Nodes,
    /// Pods with the webhook's label: their assignment annotations.
    Pods,
}

impl Feed {
    fn index(self) -> usize {
        match self {
            Feed::Nodes => 0,
            Feed::Pods => 1,
        }
    }

    /// Both feeds, in the order `/readyz` names them.
    pub const ALL: [Feed; 2] = [Feed::Nodes, Feed::Pods];

    /// Its value of the `feed` label of `vgpu_scheduler_cache_synced`.
    pub fn label(self) -> &'static str {
        match self {
            Feed::Nodes => "nodes",
            Feed::Pods => "pods",
        }
    }

    /// The name `/readyz` and the logs give it.
    pub fn name(self) -> &'static str {
        match self {
            Feed::Nodes => "nodes",
            Feed::Pods => "vGPU pods",
        }
    }
}

#[derive(Default, Clone)]
struct FeedState {
    synced: bool,
    /// The last error since the last complete LIST.
    error: Option<String>,
}

/// The two watches' states.
#[derive(Default)]
pub struct Readiness {
    feeds: Mutex<[FeedState; 2]>,
}

impl Readiness {
    fn with<R>(&self, f: impl FnOnce(&mut [FeedState; 2]) -> R) -> R {
        f(&mut self.feeds.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A complete LIST of `feed` reached the cache.
    pub fn listed(&self, feed: Feed) {
        self.with(|f| {
            f[feed.index()] = FeedState {
                synced: true,
                error: None,
            }
        });
    }

    /// `feed` failed with `error`; `unsynced`: events may have been missed, so the cache is not
    /// whole until the next complete LIST (false while a LIST is still being retried, before
    /// which the cache was not whole anyway).
    pub fn failed(&self, feed: Feed, error: String, unsynced: bool) {
        self.with(|f| {
            let s = &mut f[feed.index()];
            if unsynced {
                s.synced = false;
            }
            s.error = Some(error);
        });
    }

    /// Whether both watches have a complete LIST since their last failure.
    pub fn ready(&self) -> bool {
        self.with(|f| f.iter().all(|s| s.synced))
    }

    /// Whether `feed` has a complete LIST since its last failure.
    pub fn synced(&self, feed: Feed) -> bool {
        self.with(|f| f[feed.index()].synced)
    }

    /// `Ok` when ready, else what `/readyz` answers: each watch that is not synced and why, e.g.
    /// `vGPU pods: watch failed, re-listing (last error: ...)`.
    pub fn check(&self) -> Result<(), String> {
        let feeds = self.with(|f| f.clone());
        let why: Vec<String> = Feed::ALL
            .into_iter()
            .zip(feeds)
            .filter(|(_, s)| !s.synced)
            .map(|(feed, s)| match s.error {
                Some(e) => format!(
                    "{}: not listed since a failure (last error: {e})",
                    feed.name()
                ),
                None => format!("{}: waiting for the first list", feed.name()),
            })
            .collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(format!("cache not synced: {}", why.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_both_feeds_have_a_complete_list() {
        let r = Readiness::default();
        assert!(!r.ready());
        assert_eq!(
            r.check().unwrap_err(),
            "cache not synced: nodes: waiting for the first list; vGPU pods: waiting for the first list"
        );
        r.listed(Feed::Nodes);
        r.failed(Feed::Pods, "HTTP 500".into(), false);
        assert_eq!(
            r.check().unwrap_err(),
            "cache not synced: vGPU pods: not listed since a failure (last error: HTTP 500)"
        );
        assert!(r.synced(Feed::Nodes) && !r.synced(Feed::Pods));
        r.listed(Feed::Pods);
        assert!(r.ready());
        assert!(r.synced(Feed::Pods));
        assert_eq!(r.check(), Ok(()));

        // A failure before the cache was whole again (a LIST retried) does not unsync a feed
        // that is synced; one after it does, until the next complete LIST.
        r.failed(Feed::Nodes, "timeout".into(), false);
        assert!(r.ready());
        r.failed(Feed::Nodes, "connection reset".into(), true);
        assert_eq!(
            r.check().unwrap_err(),
            "cache not synced: nodes: not listed since a failure (last error: connection reset)"
        );
        r.listed(Feed::Nodes);
        assert!(r.ready());
    }
}
