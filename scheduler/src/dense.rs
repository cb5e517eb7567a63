//! The hot half of the cluster cache, laid out for the filter: one slot per node, found by name
//! through a small table of slot numbers, each naming a range of one dense array of
//! [`GpuHot`] records (64 bytes per GPU).
//!
//! A filter over 5000 nodes spent most of its time waiting on memory: for every name, a hash map
//! bucket holding the whole node entry, the key's own heap string, then the node's GPU vector of
//! large structs. Here the names live in one arena, the table holds only slot numbers, and a node's
//! GPUs are 8 consecutive cache lines, so the lookup touches a few small, dense arrays.
//!
//! It is a copy kept in step with [`crate::cache::Cluster`]: every change to a node's inventory,
//! heartbeat or placed pods rewrites the node's slot ([`Dense::set`]). The names, UUIDs and models
//! stay in the cluster's node entries and are read only for lists, messages and assignments.

use hashbrown::HashTable;
use std::hash::Hasher;
use vgpu_core::placement::GpuHot;

use crate::fxhash::FxHasher;

fn hash(name: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(name.as_bytes());
    h.finish()
}

/// Whether a node can take vGPU pods, as far as its annotations go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// It has an inventory and a heartbeat at this Unix time (whose age is checked per call).
    Heartbeat(u64),
    /// No inventory, an unreadable one, no heartbeat, or no Node object: the cluster explains.
    Unusable,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    name_at: u32,
    name_len: u32,
    gpus_at: u32,
    gpus_len: u32,
    state: State,
    live: bool,
    /// Changes with every [`Dense::set`] of the slot (unique over all slots).
    version: u64,
}

/// One node's hot view.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeView<'a> {
    /// Its state.
    pub state: State,
    /// Its GPUs, in inventory order.
    pub gpus: &'a [GpuHot],
    /// Its slot.
    pub slot: u32,
    /// Changes whenever the node is set again: what a decision about it read is still right
    /// while the version is the same (and nothing outside the node changed).
    pub version: u64,
}

/// Slots of every node the cluster knows.
#[derive(Debug, Default)]
pub(crate) struct Dense {
    table: HashTable<u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    names: String,
    gpus: Vec<GpuHot>,
    /// Bytes of `names` and records of `gpus` no live slot refers to.
    dead_names: usize,
    dead_gpus: usize,
    /// The last version given to a slot.
    versions: u64,
}

impl Dense {
    fn name(&self, s: &Slot) -> &str {
        let at = s.name_at as usize;
        self.names.get(at..at + s.name_len as usize).unwrap_or("")
    }

    fn find(&self, name: &str) -> Option<u32> {
        self.table
            .find(hash(name), |&i| {
                let s = &self.slots[i as usize];
                self.name(s) == name
            })
            .copied()
    }

    /// The hot view of a node, if the cluster knows it.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<NodeView<'_>> {
        self.get_at(name, &mut None)
    }

    /// [`Dense::get`], trying slot `hint` first: when it holds `name` the table is not searched;
    /// otherwise `hint` is set to the node's slot. A filter over the same names as the last one
    /// (kube-scheduler sends its node list in a stable order) then compares each name once
    /// instead of hashing and probing.
    pub fn get_at(&self, name: &str, hint: &mut Option<u32>) -> Option<NodeView<'_>> {
        let hit = hint.filter(|&i| {
            self.slots
                .get(i as usize)
                .is_some_and(|s| s.live && self.name(s) == name)
        });
        let idx = match hit {
            Some(i) => i,
            None => {
                *hint = self.find(name);
                (*hint)?
            }
        };
        let s = &self.slots[idx as usize];
        let at = s.gpus_at as usize;
        Some(NodeView {
            state: s.state,
            gpus: self.gpus.get(at..at + s.gpus_len as usize).unwrap_or(&[]),
            slot: idx,
            version: s.version,
        })
    }

    /// Sets a node's state and GPUs, adding its slot when new.
    pub fn set(&mut self, name: &str, state: State, gpus: impl ExactSizeIterator<Item = GpuHot>) {
        let idx = match self.find(name) {
            Some(i) => i,
            None => self.insert(name),
        };
        let len = gpus.len();
        let slot = self.slots[idx as usize];
        let at = if len == slot.gpus_len as usize {
            slot.gpus_at as usize
        } else {
            // The GPU count changed (rare: a new inventory): a new range at the end.
            self.dead_gpus += slot.gpus_len as usize;
            let at = self.gpus.len();
            self.gpus.resize(at + len, GpuHot::default());
            at
        };
        for (dst, g) in self.gpus[at..at + len].iter_mut().zip(gpus) {
            *dst = g;
        }
        self.versions += 1;
        let s = &mut self.slots[idx as usize];
        s.gpus_at = at as u32;
        s.gpus_len = len as u32;
        s.state = state;
        s.version = self.versions;
        self.compact_if_wasteful();
    }

    fn insert(&mut self, name: &str) -> u32 {
        let slot = Slot {
            name_at: self.names.len() as u32,
            name_len: name.len() as u32,
            gpus_at: 0,
            gpus_len: 0,
            state: State::Unusable,
            live: true,
            version: 0,
        };
        self.names.push_str(name);
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let slots = &self.slots;
        let names = &self.names;
        self.table.insert_unique(hash(name), idx, |&i| {
            let s = &slots[i as usize];
            hash(
                names
                    .get(s.name_at as usize..(s.name_at + s.name_len) as usize)
                    .unwrap_or(""),
            )
        });
        idx
    }

    /// Forgets a node.
    pub fn remove(&mut self, name: &str) {
        let h = hash(name);
        let slots = &self.slots;
        let names = &self.names;
        let Ok(entry) = self.table.find_entry(h, |&i| {
            let s = &slots[i as usize];
            names.get(s.name_at as usize..(s.name_at + s.name_len) as usize) == Some(name)
        }) else {
            return;
        };
        let (idx, _) = entry.remove();
        let s = &mut self.slots[idx as usize];
        s.live = false;
        self.dead_names += s.name_len as usize;
        self.dead_gpus += s.gpus_len as usize;
        s.gpus_len = 0;
        self.free.push(idx);
        self.compact_if_wasteful();
    }

    /// Rewrites the arrays without dead ranges once they are more than half dead.
    fn compact_if_wasteful(&mut self) {
        let waste_names = self.dead_names > 4096 && self.dead_names * 2 > self.names.len();
        let waste_gpus = self.dead_gpus > 1024 && self.dead_gpus * 2 > self.gpus.len();
        if !waste_names && !waste_gpus {
            return;
        }
        let mut names = String::with_capacity(self.names.len() - self.dead_names);
        let mut gpus = Vec::with_capacity(self.gpus.len() - self.dead_gpus);
        for s in self.slots.iter_mut().filter(|s| s.live) {
            let at = s.name_at as usize;
            let name = self.names.get(at..at + s.name_len as usize).unwrap_or("");
            s.name_at = names.len() as u32;
            names.push_str(name);
            let at = s.gpus_at as usize;
            s.gpus_at = gpus.len() as u32;
            gpus.extend_from_slice(&self.gpus[at..at + s.gpus_len as usize]);
        }
        self.names = names;
        self.gpus = gpus;
        self.dead_names = 0;
        self.dead_gpus = 0;
    }

    /// Number of live slots.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vgpu_core::inventory::DeviceInfo;
    use vgpu_core::placement::Gpu;

    fn hot(mib: u64) -> GpuHot {
        Gpu::from_device(&DeviceInfo {
            uuid: "GPU-x".into(),
            index: 0,
            model: "T4".into(),
            memory_mib: mib,
            cores: 100,
            split: 10,
            numa: None,
            healthy: true,
            vendor: String::new(),
            nvlinks: Default::default(),
        })
        .hot()
    }

    #[test]
    fn slots_follow_sets_removals_and_compaction() {
        let mut d = Dense::default();
        for n in 0..3000u64 {
            d.set(
                &format!("node-{n}"),
                State::Heartbeat(n),
                [hot(n + 1)].into_iter(),
            );
        }
        // Growing a node moves it; shrinking the dead space compacts.
        d.set("node-7", State::Unusable, [hot(1), hot(2)].into_iter());
        for n in (0..3000u64).filter(|n| n % 3 != 0) {
            d.remove(&format!("node-{n}"));
        }
        assert_eq!(d.len(), 1000);
        assert!(d.get("node-7").is_none());
        for n in (0..3000u64).step_by(3) {
            let v = d.get(&format!("node-{n}")).unwrap();
            assert_eq!(v.state, State::Heartbeat(n));
            assert_eq!(v.gpus, &[hot(n + 1)]);
        }
        // Freed slots are reused and found.
        d.set("new", State::Heartbeat(1), [hot(5), hot(6)].into_iter());
        assert_eq!(d.get("new").unwrap().gpus, &[hot(5), hot(6)]);
        assert_eq!(d.get("node-3").unwrap().gpus, &[hot(4)]);
        assert!(d.get("nope").is_none());
        // Hints: a right one is used, a wrong or stale one corrected.
        let mut hint = None;
        assert_eq!(d.get_at("node-3", &mut hint).unwrap().gpus, &[hot(4)]);
        let at = hint;
        assert_eq!(d.get_at("node-3", &mut hint).unwrap().gpus, &[hot(4)]);
        assert_eq!(hint, at);
        assert_eq!(d.get_at("new", &mut hint).unwrap().gpus, &[hot(5), hot(6)]);
        assert_ne!(hint, at);
        d.remove("new");
        assert!(d.get_at("new", &mut hint).is_none());
        assert_eq!(hint, None);
        let mut bad = Some(u32::MAX);
        assert!(d.get_at("node-6", &mut bad).is_some());
    }
}
