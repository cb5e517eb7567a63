//! VMM allocations: memory that outlives its handle's release while it is mapped or retained.
//!
//! cuda.h, `cuMemRelease`: "The memory allocation will be freed when all outstanding mappings to
//! the memory are unmapped and when all outstanding references to the handle (including it's
//! shareable counterparts) are also released." `cuMemRetainAllocationHandle`: "The returned
//! handle must be released with corresponding number of calls to cuMemRelease." So a program that
//! maps an allocation and releases its handle at once (CUDA's own VMM samples do) still holds the
//! memory until it unmaps it: the hook keeps a charged handle charged until its references (the
//! create and each retain, less each release) and its mappings are all gone. Exported descriptors
//! are the third kind of reference, kept by [`crate::shareable`] once these two say the memory is
//! free. Safe code: the C side reports each call the driver accepted, holding this book's lock
//! across the driver call, so two threads' calls reach the book in the driver's order (an unmap
//! and a new mapping at the same address, a release and a create that reuses its handle value).

use std::collections::{BTreeMap, HashMap};

/// What keeps a charged handle's memory alive.
#[derive(Debug, Default, Clone, Copy)]
struct Holds {
    references: u32,
    mappings: u32,
}

/// The charged VMM handles of this process and where they are mapped.
#[derive(Debug, Default)]
pub struct Handles {
    live: HashMap<u64, Holds>,
    /// Mapped ranges: start -> (size, handle).
    mapped: BTreeMap<u64, (u64, u64)>,
}

impl Handles {
    /// `cuMemCreate` made `handle` (charged): one reference.
    pub fn created(&mut self, handle: u64) {
        self.live.insert(
            handle,
            Holds {
                references: 1,
                mappings: 0,
            },
        );
    }

    /// `cuMemMap` mapped `handle` at `[ptr, ptr + size)`; handles the hook did not charge (host
    /// memory, imports) are not followed. A mapping it replaces (the driver freed that range
    /// without an unmap) no longer holds its handle: the handle, when that freed it, is returned.
    pub fn mapped(&mut self, ptr: u64, size: u64, handle: u64) -> Option<u64> {
        let holds = self.live.get_mut(&handle)?;
        holds.mappings += 1;
        let (_, old) = self.mapped.insert(ptr, (size, handle))?;
        let holds = self.live.get_mut(&old)?;
        holds.mappings = holds.mappings.saturating_sub(1);
        self.free_if_unheld(old).then_some(old)
    }

    /// `cuMemRetainAllocationHandle` handed out `handle` again: one more reference.
    pub fn retained(&mut self, handle: u64) {
        if let Some(holds) = self.live.get_mut(&handle) {
            holds.references += 1;
        }
    }

    /// `cuMemRelease` of `handle`: whether its memory is free now (its last reference gone and
    /// nothing mapped). A handle the hook does not follow is free at its release, as before.
    pub fn released(&mut self, handle: u64) -> bool {
        let Some(holds) = self.live.get_mut(&handle) else {
            return true;
        };
        holds.references = holds.references.saturating_sub(1);
        self.free_if_unheld(handle)
    }

    /// `cuMemUnmap` of `[ptr, ptr + size)`: the handles whose memory is free now.
    pub fn unmapped(&mut self, ptr: u64, size: u64) -> Vec<u64> {
        let end = ptr.saturating_add(size);
        let gone: Vec<(u64, u64)> = self
            .mapped
            .range(ptr..end)
            .map(|(&at, &(_, handle))| (at, handle))
            .collect();
        let mut free = Vec::new();
        for (at, handle) in gone {
            self.mapped.remove(&at);
            if let Some(holds) = self.live.get_mut(&handle) {
                holds.mappings = holds.mappings.saturating_sub(1);
                if self.free_if_unheld(handle) {
                    free.push(handle);
                }
            }
        }
        free
    }

    fn free_if_unheld(&mut self, handle: u64) -> bool {
        let unheld = self
            .live
            .get(&handle)
            .is_some_and(|h| h.references == 0 && h.mappings == 0);
        if unheld {
            self.live.remove(&handle);
        }
        unheld
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmapped_handle_is_free_at_its_release() {
        let mut h = Handles::default();
        h.created(1);
        assert!(h.released(1));
        // Not followed (never charged): free at release, as the driver says.
        assert!(h.released(99));
    }

    #[test]
    fn a_mapped_handle_released_at_once_is_free_when_unmapped() {
        let mut h = Handles::default();
        h.created(1);
        assert_eq!(h.mapped(0x1000, 0x200, 1), None);
        assert!(!h.released(1), "still mapped: the memory lives");
        assert_eq!(h.unmapped(0x1000, 0x200), vec![1]);
        assert!(h.unmapped(0x1000, 0x200).is_empty(), "unmapped once");
    }

    #[test]
    fn every_mapping_and_retained_reference_holds_the_memory() {
        let mut h = Handles::default();
        h.created(1);
        assert_eq!(h.mapped(0x1000, 0x100, 1), None);
        assert_eq!(h.mapped(0x9000, 0x100, 1), None);
        h.retained(1);
        assert!(!h.released(1));
        assert!(h.unmapped(0x1000, 0x100).is_empty(), "mapped at 0x9000 too");
        assert!(h.unmapped(0x9000, 0x100).is_empty(), "a retained reference");
        assert!(h.released(1));
    }

    #[test]
    fn one_unmap_may_cover_several_mappings() {
        let mut h = Handles::default();
        for (handle, at) in [(1, 0x1000), (2, 0x1100)] {
            h.created(handle);
            assert_eq!(h.mapped(at, 0x100, handle), None);
            assert!(!h.released(handle));
        }
        let mut free = h.unmapped(0x1000, 0x200);
        free.sort_unstable();
        assert_eq!(free, vec![1, 2]);
    }

    #[test]
    fn a_mapping_replaced_at_the_same_address_no_longer_holds_its_handle() {
        let mut h = Handles::default();
        h.created(1);
        h.created(2);
        assert_eq!(h.mapped(0x1000, 0x100, 1), None);
        assert!(!h.released(1));
        assert_eq!(h.mapped(0x1000, 0x100, 2), Some(1));
        assert!(!h.released(2), "2 is mapped");
        assert_eq!(h.unmapped(0x1000, 0x100), vec![2]);
    }

    #[test]
    fn handles_the_hook_did_not_charge_are_not_followed() {
        let mut h = Handles::default();
        assert_eq!(h.mapped(0x1000, 0x100, 7), None);
        h.retained(7);
        assert!(h.unmapped(0x1000, 0x100).is_empty());
        assert!(h.released(7));
    }
}
