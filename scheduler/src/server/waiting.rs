//! The vGPU pods the filter turned away lately, so that room goes to the oldest that fits first.
//!
//! kube-scheduler retries waiting pods in the order they last entered its queue, which it
//! refreshes on every failed attempt (`backend/queue/scheduling_queue.go`,
//! `AddUnschedulableIfNotPresent`: "Refresh the timestamp since the pod is re-added"; PrioritySort
//! is the only in-tree queue sort), so when room appears any waiting pod may get it: on the real
//! cluster, of fifty pods waiting for a GPU's ten slots the second round took pods 20-29 before
//! 10-19. Before a pod is placed, the filter holds room for the oldest pods it turned away that fit
//! now, each over the nodes kube-scheduler last offered it (what its own filters passed); a younger
//! pod takes what is left. A pod that fits nowhere holds nothing, so it never keeps a younger one
//! out of room it could not use.

use std::collections::HashMap;
use vgpu_core::placement::PodRequest;

/// How long a pod turned away counts as waiting without being turned away again (kube-scheduler
/// retries it on every Node and Pod event, and at least every 5 min).
pub const WAITING_FOR: u64 = 60;
/// The most older pods a filter holds room for: bounds the filter's extra work.
pub const MOST_AHEAD: usize = 16;
/// The most pods remembered, the oldest kept: only the oldest are ever held for, and each keeps
/// the names of the nodes it was offered (hundreds at scale).
pub const MOST: usize = 256;

/// A pod the filter turned away.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// Creation, Unix seconds, then `namespace/name`: the order pods go in.
    pub order: (i64, String),
    /// What it asks.
    pub request: PodRequest,
    /// The nodes kube-scheduler last offered it.
    pub nodes: Vec<String>,
    /// When it was last turned away, Unix seconds.
    pub at: u64,
}

/// The pods turned away, by uid.
#[derive(Debug, Default)]
pub struct WaitingPods {
    pods: HashMap<String, Waiting>,
}

impl WaitingPods {
    /// `uid` was turned away (at `pod.at`); when [`MOST`] are remembered, the youngest gives way
    /// to an older one.
    pub fn turned_away(&mut self, uid: &str, pod: Waiting) {
        self.pods
            .retain(|_, w| pod.at.saturating_sub(w.at) <= WAITING_FOR);
        if self.pods.len() >= MOST && !self.pods.contains_key(uid) {
            let youngest = self
                .pods
                .iter()
                .max_by(|a, b| a.1.order.cmp(&b.1.order))
                .map(|(u, w)| (u.clone(), w.order.clone()));
            match youngest {
                Some((u, order)) if pod.order < order => {
                    self.pods.remove(&u);
                }
                _ => return,
            }
        }
        self.pods.insert(uid.to_string(), pod);
    }

    /// `uid` was placed, bound or deleted.
    pub fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// The waiting pods older than `order`, oldest first, at most [`MOST_AHEAD`], with their uids.
    pub fn ahead_of(&self, order: &(i64, String), now: u64) -> Vec<(String, Waiting)> {
        let mut ahead: Vec<(String, Waiting)> = self
            .pods
            .iter()
            .filter(|(_, w)| w.order < *order && now.saturating_sub(w.at) <= WAITING_FOR)
            .map(|(uid, w)| (uid.clone(), w.clone()))
            .collect();
        ahead.sort_by(|a, b| a.1.order.cmp(&b.1.order));
        ahead.truncate(MOST_AHEAD);
        ahead
    }

    /// Whether any pod waits.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(created: i64, name: &str, at: u64) -> Waiting {
        Waiting {
            order: (created, format!("ns/{name}")),
            request: PodRequest::simple(Vec::new()),
            nodes: vec!["n".into()],
            at,
        }
    }

    #[test]
    fn older_pods_first_within_the_window() {
        let mut w = WaitingPods::default();
        w.turned_away("c", waiting(10, "c", 100));
        w.turned_away("a", waiting(10, "a", 100));
        w.turned_away("old", waiting(1, "old", 50));
        w.turned_away("young", waiting(20, "young", 100));
        let me = (15, "ns/me".to_string());
        let ahead: Vec<String> = w.ahead_of(&me, 100).into_iter().map(|(u, _)| u).collect();
        assert_eq!(ahead, ["old", "a", "c"], "by creation, then name");
        let ahead: Vec<String> = w.ahead_of(&me, 111).into_iter().map(|(u, _)| u).collect();
        assert_eq!(
            ahead,
            ["a", "c"],
            "not turned away for over a minute: not waiting"
        );
        w.forget("a");
        let ahead: Vec<String> = w.ahead_of(&me, 100).into_iter().map(|(u, _)| u).collect();
        assert_eq!(ahead, ["old", "c"]);
    }

    #[test]
    fn when_full_the_youngest_gives_way() {
        let mut w = WaitingPods::default();
        for i in 0..MOST {
            w.turned_away(
                &format!("p{i}"),
                waiting(10 + i as i64, &format!("p{i:04}"), 100),
            );
        }
        w.turned_away("younger", waiting(10_000, "younger", 100));
        w.turned_away("oldest", waiting(1, "oldest", 100));
        let all = (i64::MAX, String::new());
        let ahead: Vec<String> = w.ahead_of(&all, 100).into_iter().map(|(u, _)| u).collect();
        assert_eq!(ahead[0], "oldest");
        assert_eq!(w.pods.len(), MOST);
        assert!(!w.pods.contains_key("younger"));
        assert!(
            !w.pods.contains_key(&format!("p{}", MOST - 1)),
            "the youngest gave way"
        );
    }
}
