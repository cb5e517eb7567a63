//! Placing a pod's containers on one node's GPUs and scoring the node: [`place`], [`score`],
//! [`Standing`], topology and NUMA.

use super::*;

/// Usage of one GPU while a pod's containers are placed one after another.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Scratch {
    pub(super) used_mib: u64,
    pub(super) used_cores: u32,
    pub(super) slices: u32,
    pub(super) exclusive: bool,
}

impl Scratch {
    /// This GPU's usage once a slice of `r` is added (what placement does to the chosen GPUs).
    #[inline]
    pub(super) fn with(self, g: &GpuHot, r: &VgpuRequest) -> Scratch {
        let exclusive = r.cores >= EXCLUSIVE_CORES;
        Scratch {
            used_mib: self.used_mib.saturating_add(r.mib_per_gpu(g.memory_mib)),
            used_cores: self
                .used_cores
                .saturating_add(if exclusive { g.cores } else { r.cores }),
            slices: self.slices.saturating_add(1),
            exclusive: self.exclusive || exclusive,
        }
    }

    #[inline]
    pub(super) fn of(g: &GpuHot) -> Scratch {
        Scratch {
            used_mib: g.used_mib,
            used_cores: g.used_cores,
            slices: g.slices,
            exclusive: g.exclusive,
        }
    }
}

/// Buffers one placement needs, kept between nodes so that checking a node allocates nothing (a
/// filter reuses one for all its candidates).
#[derive(Debug, Default)]
pub struct PlaceBuf {
    pub(super) hot: Vec<GpuHot>,
    pub(super) scratch: Vec<Scratch>,
    /// (use per mille after placement, GPU index, position)
    pub(super) cand: Vec<(u64, u32, usize)>,
    pub(super) type_memo: Vec<(u32, bool)>,
    pub(super) frag_before: Vec<u32>,
    pub(super) frag_after: Vec<u32>,
    /// Positions of the GPUs placement gave a slice to, each once.
    pub(super) touched: Vec<usize>,
}

/// Places every vGPU container of `pod` on `node`, or says why one does not fit.
///
/// Returns the devices of each container in order, with percentages resolved to MiB on the chosen
/// card. The node's own counts are not changed.
pub fn place(node: &NodeGpus, pod: &PodRequest) -> Result<Vec<ContainerAssignment>, Unfit> {
    place_scored(node, pod).map(|(a, _)| a)
}

/// [`place`], plus the node's score for the pod under the pod's node policy (0..=[`MAX_SCORE`]).
pub fn place_scored(
    node: &NodeGpus,
    pod: &PodRequest,
) -> Result<(Vec<ContainerAssignment>, u32), Unfit> {
    place_scored_with(node, pod, None)
}

/// [`place_scored`] with the fragmentation table the `fragmentation` policies score against
/// (without one they act as `binpack`).
pub fn place_scored_with<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    frag: Option<&live::LiveFrag>,
) -> Result<(Vec<ContainerAssignment>, u32), Unfit> {
    let mut out = Vec::with_capacity(pod.containers.len());
    let mut buf = PlaceBuf::default();
    place_core(node, pod, &mut buf, Some(&mut out), frag)
        .map(|s| (out, s.score))
        .map_err(|m| m.to_unfit(node, pod))
}

/// Whether the pod fits, and the node's score, without building the assignment: what filter and
/// prioritize need for every candidate node (the same decisions as [`place_scored`]).
pub fn score(node: &NodeGpus, pod: &PodRequest) -> Result<u32, Unfit> {
    score_set(node, pod)
}

/// [`score`] over any [`GpuSet`]: the same code, so the same decisions and messages.
pub fn score_set<S: GpuSet + ?Sized>(node: &S, pod: &PodRequest) -> Result<u32, Unfit> {
    let mut buf = PlaceBuf::default();
    score_buf(node, pod, &mut buf, None).map_err(|m| m.to_unfit(node, pod))
}

/// How a node stands for a pod: the score kube-scheduler gets (0..=[`MAX_SCORE`]) and the rank
/// a scheduler choosing the node itself orders by. They differ only under `gap-aware`, whose
/// rank is the measure's step before it is clamped into the score's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Node score, 0..=[`MAX_SCORE`].
    pub score: u32,
    /// The higher the better; the same order as `score` where that tells nodes apart.
    pub rank: i64,
}

impl Standing {
    pub(super) fn of_score(score: u32) -> Standing {
        Standing {
            score,
            rank: i64::from(score),
        }
    }
}

/// [`score_set`] reusing `buf`, failing with a [`Miss`] (no names, nothing allocated): the form a
/// filter over thousands of nodes uses. `frag` as in [`place_scored_with`].
pub fn score_buf<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    buf: &mut PlaceBuf,
    frag: Option<&live::LiveFrag>,
) -> Result<u32, Miss> {
    standing_buf(node, pod, buf, frag).map(|s| s.score)
}

/// [`score_buf`] with the node's rank as well ([`Standing`]).
pub fn standing_buf<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    buf: &mut PlaceBuf,
    frag: Option<&live::LiveFrag>,
) -> Result<Standing, Miss> {
    // The table is only read under `fragmentation` or `gap-aware` (the cluster hands it over
    // whenever it knows a GPU pod).
    let frag_used = frag.is_some() && (pod.node_policy.uses_table() || pod.gpu_policy.uses_table());
    if !frag_used && !pod.mutex && !pod.topology && !pod.filter.typed() && !pod.filter.uuids() {
        if let [c] = pod.containers.as_slice() {
            if c.request.gpus == 1 {
                let gpus = hot_records(node, &mut buf.hot);
                if let Some(score) = score_one_gpu(gpus, pod, &c.request) {
                    return Ok(Standing::of_score(score));
                }
            }
        }
    }
    place_core(node, pod, buf, None, frag)
}

/// [`score_buf`] for the request nearly every pod makes (one container, one GPU, no type or UUID
/// lists, no fragmentation policy with a table), in one pass over the hot records: no scratch
/// copy, no candidate list, the node's use summed in the same pass. The same choice and score as
/// [`place_core`] (proptest `never_overcommits` compares the two); `None` when no GPU fits, and
/// [`place_core`] then works out why.
pub(super) fn score_one_gpu(gpus: &[GpuHot], pod: &PodRequest, r: &VgpuRequest) -> Option<u32> {
    let exclusive = r.cores >= EXCLUSIVE_CORES;
    let spread = pod.gpu_policy == Policy::Spread;
    let (mut sum, mut n) = (0u64, 0u64);
    // (use after placement, GPU index, position) of the best GPU so far, first one on ties.
    let mut best: Option<(u64, u32, usize)> = None;
    for (i, g) in gpus.iter().enumerate() {
        if !g.usable {
            continue;
        }
        sum += u64::from(g.use_now);
        n += 1;
        if g.cordoned || g.slices >= g.split || g.exclusive || (exclusive && g.slices > 0) {
            continue;
        }
        let free_cores = g.cores.saturating_sub(g.used_cores);
        let want = r.mib_per_gpu(g.memory_mib);
        if !cores_fit(r, exclusive, free_cores) || g.memory_mib.saturating_sub(g.used_mib) < want {
            continue;
        }
        let after = g.use_permille(g.used_mib.saturating_add(want), g.used_cores);
        let better = match best {
            None => true,
            Some((a, index, _)) if spread => (after, g.index) < (a, index),
            Some((a, index, _)) => after > a || (after == a && g.index < index),
        };
        if better {
            best = Some((after, g.index, i));
        }
    }
    let (_, _, i) = best?;
    let g = &gpus[i];
    let s = Scratch::of(g).with(g, r);
    let sum = sum - u64::from(g.use_now) + g.use_permille(s.used_mib, s.used_cores);
    Some(node_score(sum, n, pod.node_policy))
}

/// The node's hot GPU records: its own slice when it keeps one, else made into `hot`.
pub(super) fn hot_records<'a, S: GpuSet + ?Sized>(
    node: &'a S,
    hot: &'a mut Vec<GpuHot>,
) -> &'a [GpuHot] {
    match node.hot_slice() {
        Some(s) => s,
        None => {
            hot.clear();
            hot.extend((0..node.len()).map(|i| node.hot(i)));
            hot
        }
    }
}

/// Whether a GPU with `free_cores` left takes the request's cores (`exclusive`: the request takes
/// the whole card, whatever its cores). A share of 0 cores still needs some compute left on the
/// card (HAMi skips a card whose cores are all placed).
#[inline]
pub(super) fn cores_fit(r: &VgpuRequest, exclusive: bool, free_cores: u32) -> bool {
    if exclusive {
        true
    } else if r.cores == 0 {
        free_cores > 0
    } else {
        free_cores >= r.cores
    }
}

/// The node score from the use per mille summed over its `n` usable GPUs after placement: the
/// mean use under binpack, what is left of it under spread, on the `0..=MAX_SCORE` scale.
#[inline]
pub(super) fn node_score(sum: u64, n: u64, node_policy: Policy) -> u32 {
    let used = sum.checked_div(n).unwrap_or(0);
    let permille = match node_policy {
        Policy::Spread => 1000 - used.min(1000),
        _ => used,
    };
    ((permille * u64::from(MAX_SCORE) + 500) / 1000) as u32
}

/// Topology and NUMA for one container: moves the GPUs it gets to the front of `cand` (every
/// candidate, sorted in the GPU policy's order), keeping their order; or says why none fit.
pub(super) fn arrange<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    need: usize,
    cand: &mut [(u64, u32, usize)],
) -> Result<(), MissReason> {
    if need == 1 {
        if pod.topology {
            // HAMi's `computeWorstSingleCard`: the GPU with the fewest NVLinks to the others,
            // leaving linked sets whole for containers of several GPUs (ties: the policy's order).
            let links = |i: usize| -> u32 {
                (0..node.len())
                    .filter(|&j| j != i)
                    .map(|j| node.links(i, j))
                    .sum()
            };
            if let Some(k) = (0..cand.len()).min_by_key(|&k| (links(cand[k].2), k)) {
                cand[..=k].rotate_right(1);
            }
        }
        return Ok(());
    }
    // Candidates (positions in `cand`) by NUMA node, in the order of each node's best candidate.
    let mut groups: Vec<Vec<usize>> = vec![(0..cand.len()).collect()];
    if pod.numa || pod.numa_bind {
        let mut by_node: Vec<(Option<u32>, Vec<usize>)> = Vec::new();
        for (k, c) in cand.iter().enumerate() {
            let n = node.numa(c.2);
            match by_node.iter_mut().find(|g| g.0 == n) {
                Some(g) => g.1.push(k),
                None => by_node.push((n, vec![k])),
            }
        }
        let most = by_node.iter().map(|g| g.1.len()).max().unwrap_or(0);
        let fitting: Vec<Vec<usize>> = by_node
            .into_iter()
            .filter(|g| g.1.len() >= need)
            .map(|g| g.1)
            .collect();
        if !fitting.is_empty() {
            groups = fitting;
        } else if pod.numa_bind {
            return Err(MissReason::Numa { left: most });
        }
    }
    let set_links = |ks: &[usize]| -> u32 {
        let mut sum = 0;
        for (x, &a) in ks.iter().enumerate() {
            for &b in &ks[x + 1..] {
                sum += node.links(cand[a].2, cand[b].2);
            }
        }
        sum
    };
    // In each group the first `need` in order, or under `topology-aware` the set joined by the
    // most NVLinks (HAMi's `computeBestCombination`; ties: the earliest in order); across groups
    // the most links, then the group with the best candidate.
    let mut best: Option<(u32, Vec<usize>)> = None;
    for g in &groups {
        let pick = if pod.topology {
            most_linked(g, need, &set_links)
        } else {
            g[..need].to_vec()
        };
        let score = if pod.topology { set_links(&pick) } else { 0 };
        if best.as_ref().is_none_or(|b| score > b.0) {
            best = Some((score, pick));
        }
    }
    if let Some((_, pick)) = best {
        let mut order: Vec<(u64, u32, usize)> = pick.iter().map(|&k| cand[k]).collect();
        order.extend(
            (0..cand.len())
                .filter(|k| !pick.contains(k))
                .map(|k| cand[k]),
        );
        cand.copy_from_slice(&order);
    }
    Ok(())
}

/// The `need` members of `group` (in order) with the most links by `score`: every subset while
/// there are at most [`TOPOLOGY_EXACT_MAX`] candidates, else greedily from the first (each next
/// member the one most linked to those taken).
pub(super) fn most_linked(
    group: &[usize],
    need: usize,
    score: &dyn Fn(&[usize]) -> u32,
) -> Vec<usize> {
    if group.len() <= TOPOLOGY_EXACT_MAX {
        let n = group.len();
        let mut idx: Vec<usize> = (0..need).collect();
        let mut best: Option<(u32, Vec<usize>)> = None;
        loop {
            let set: Vec<usize> = idx.iter().map(|&i| group[i]).collect();
            let s = score(&set);
            if best.as_ref().is_none_or(|b| s > b.0) {
                best = Some((s, set));
            }
            // The next subset in lexicographic order.
            let Some(p) = (0..need).rev().find(|&p| idx[p] < n - need + p) else {
                break;
            };
            idx[p] += 1;
            for q in p + 1..need {
                idx[q] = idx[q - 1] + 1;
            }
        }
        return best.map(|b| b.1).unwrap_or_default();
    }
    let mut taken = vec![group[0]];
    while taken.len() < need {
        let next = group
            .iter()
            .filter(|k| !taken.contains(k))
            .max_by_key(|&&k| {
                let mut with = taken.clone();
                with.push(k);
                // Earlier in order wins ties: max_by_key keeps the last maximum, so rank by
                // (links, -position).
                (score(&with), std::cmp::Reverse(k))
            })
            .copied();
        match next {
            Some(k) => taken.push(k),
            None => break,
        }
    }
    taken
}

pub(super) fn place_core<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    buf: &mut PlaceBuf,
    mut record: Option<&mut Vec<ContainerAssignment>>,
    frag: Option<&live::LiveFrag>,
) -> Result<Standing, Miss> {
    let PlaceBuf {
        hot,
        scratch,
        cand,
        type_memo,
        frag_before,
        frag_after,
        touched,
    } = buf;
    let gpus = hot_records(node, hot);
    scratch.clear();
    scratch.extend(gpus.iter().map(Scratch::of));
    touched.clear();
    // What the node has left besides GPUs and what the pod asks (the `gap-aware` host terms).
    let host = node.host_left().map(|left| (left, pod.host));
    let typed = pod.filter.typed();
    let uuids = pod.filter.uuids();
    for (ci, c) in pod.containers.iter().enumerate() {
        let r = &c.request;
        let need = r.gpus as usize;
        let miss = |why| Miss { container: ci, why };
        if gpus.is_empty() {
            return Err(miss(MissReason::NoGpus));
        }
        cand.clear();
        type_memo.clear();
        // Counts after each check, for the failure message.
        let (mut n_usable, mut n_open, mut n_type, mut n_uuid, mut n_split) =
            (0usize, 0usize, 0usize, 0usize, 0usize);
        let (mut n_excl, mut n_cores) = (0usize, 0usize);
        let mut best_cores: Option<(u32, usize)> = None;
        let mut best_mem: Option<(u64, usize)> = None;
        let mut max_want_mib = 0u64;
        let exclusive = r.cores >= EXCLUSIVE_CORES;
        let alone = exclusive || pod.mutex;
        for (i, (g, s)) in gpus.iter().zip(scratch.iter()).enumerate() {
            if !g.usable {
                continue;
            }
            n_usable += 1;
            // GPUs of one node mostly share a model: test the type lists once per distinct model.
            let type_ok = !typed
                || match type_memo.iter().find(|(key, _)| *key == g.model_key) {
                    Some(&(_, ok)) => ok,
                    None => {
                        let ok = node.type_ok(i, &pod.filter);
                        type_memo.push((g.model_key, ok));
                        ok
                    }
                };
            if !type_ok {
                continue;
            }
            n_type += 1;
            if uuids && !pod.filter.uuid_ok(node.uuid(i)) {
                continue;
            }
            n_uuid += 1;
            if g.cordoned {
                continue;
            }
            n_open += 1;
            if s.slices >= g.split {
                continue;
            }
            n_split += 1;
            if s.exclusive || (alone && s.slices > 0) {
                continue;
            }
            n_excl += 1;
            let free_cores = g.cores.saturating_sub(s.used_cores);
            let cores_ok = cores_fit(r, exclusive, free_cores);
            if best_cores.is_none_or(|(b, _)| free_cores > b) {
                best_cores = Some((free_cores, i));
            }
            if !cores_ok {
                continue;
            }
            n_cores += 1;
            let want = r.mib_per_gpu(g.memory_mib);
            max_want_mib = max_want_mib.max(want);
            let free = g.memory_mib.saturating_sub(s.used_mib);
            if best_mem.is_none_or(|(b, _)| free > b) {
                best_mem = Some((free, i));
            }
            if free < want {
                continue;
            }
            let after = g.use_permille(s.used_mib.saturating_add(want), s.used_cores);
            cand.push((after, g.index, i));
        }
        if cand.len() < need {
            let why = if n_usable < need {
                MissReason::Unhealthy { usable: n_usable }
            } else if n_type < need {
                MissReason::Type { left: n_type }
            } else if n_uuid < need {
                MissReason::Uuid { left: n_uuid }
            } else if n_open < need {
                MissReason::Cordoned { left: n_open }
            } else if n_split < need {
                MissReason::Split { left: n_split }
            } else if n_excl < need {
                MissReason::Exclusive {
                    left: n_excl,
                    wants_exclusive: alone,
                    mutex: pod.mutex,
                }
            } else if n_cores < need {
                MissReason::Cores {
                    left: n_cores,
                    want: r.cores.max(1),
                    best: best_cores,
                }
            } else {
                MissReason::Memory {
                    left: cand.len(),
                    want_mib: max_want_mib,
                    percent: match r.memory {
                        crate::request::Memory::Percent(p) => Some(p),
                        crate::request::Memory::Mib(_) => None,
                    },
                    best: best_mem,
                }
            };
            return Err(miss(why));
        }
        let gpu_policy = match (pod.gpu_policy, frag) {
            (Policy::Fragmentation, Some(t)) if need == 1 => {
                // Fragmentation gradient: the GPU whose use leaves the node least fragmented
                // (ties: the fullest, then the lowest index).
                t.rank_share(gpus, scratch, r, cand, frag_before);
                Policy::Binpack
            }
            (Policy::GapAware, Some(t)) if need == 1 => {
                // The GPU whose use leaves the node's measure the best step lower (ties: the
                // lowest index, as the simulator).
                t.rank_share_gaps(gpus, scratch, r, host, cand, (frag_before, frag_after));
                Policy::Binpack
            }
            (Policy::Spread, _) => Policy::Spread,
            _ => Policy::Binpack,
        };
        // The first `need` candidates in order, by selection: the order of a full sort (keys are
        // unique: GPU indexes differ) for a few comparisons per GPU, where sorting every
        // candidate of every node cost a tenth of a multi-GPU filter (`perf`, filter bench).
        let better = |a: &(u64, u32, usize), b: &(u64, u32, usize)| match gpu_policy {
            // Emptiest after placement first; ties by index.
            Policy::Spread => (a.0, a.1) < (b.0, b.1),
            // Fullest after placement first; ties by index.
            _ => a.0 > b.0 || (a.0 == b.0 && a.1 < b.1),
        };
        let arranged = pod.topology || (need > 1 && (pod.numa || pod.numa_bind));
        let sort_to = if arranged { cand.len() } else { need };
        for k in 0..sort_to {
            let mut best = k;
            for j in k + 1..cand.len() {
                if better(&cand[j], &cand[best]) {
                    best = j;
                }
            }
            cand.swap(k, best);
        }
        if arranged {
            arrange(node, pod, need, cand).map_err(miss)?;
        }
        let mut devices = Vec::with_capacity(if record.is_some() { need } else { 0 });
        for &(_, _, i) in cand.iter().take(need) {
            let g = &gpus[i];
            let mib = r.mib_per_gpu(g.memory_mib);
            scratch[i] = scratch[i].with(g, r);
            scratch[i].exclusive |= pod.mutex;
            if !touched.contains(&i) {
                touched.push(i);
            }
            if record.is_some() {
                devices.push(DeviceSlice {
                    uuid: node.uuid(i).to_string(),
                    memory_mib: mib,
                    cores: r.cores,
                    exclusive: pod.mutex,
                });
            }
        }
        if let Some(out) = record.as_deref_mut() {
            out.push(ContainerAssignment {
                name: c.name.clone(),
                devices,
            });
        }
    }
    match (pod.node_policy, frag) {
        (Policy::Fragmentation, Some(t)) => {
            let score = t.node_score(gpus, scratch, frag_before, frag_after);
            return Ok(Standing::of_score(score));
        }
        (Policy::GapAware, Some(t)) => {
            let step = t.gap_node_step(gpus, scratch, host, frag_before, frag_after);
            return Ok(Standing {
                score: live::LiveFrag::gap_score_of_step(step),
                rank: step,
            });
        }
        _ => {}
    }
    // Node use after placement: mean over usable GPUs. An untouched GPU's use is its record's
    // `use_now` (its scratch is its record); only the touched ones are recomputed. Chosen GPUs are
    // always usable.
    let (mut sum, mut n) = (0u64, 0u64);
    for g in gpus.iter().filter(|g| g.usable) {
        sum += u64::from(g.use_now);
        n += 1;
    }
    for &i in touched.iter() {
        let (g, s) = (&gpus[i], &scratch[i]);
        sum = sum - u64::from(g.use_now) + g.use_permille(s.used_mib, s.used_cores);
    }
    Ok(Standing::of_score(node_score(sum, n, pod.node_policy)))
}
