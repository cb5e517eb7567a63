//! Exported allocations: memory that outlives its release.
//!
//! cuda.h, `cuMemExportToShareableHandle`: "Once all shareable handles are closed and the
//! allocation is released, the allocated memory referenced will be released back to the OS." So a
//! `cuMemRelease` of an allocation exported as a file descriptor frees nothing while a descriptor
//! is still open: the hook keeps such an allocation charged after its release, and credits it once
//! every descriptor it exported is closed (or now names another file). A descriptor passed to
//! another process and closed here ends the charge here; the importer's side is not charged (an
//! import is the exporter's memory). Safe code: whether a descriptor is open is asked through
//! `open`, which the C side answers with `fstat`.

use std::collections::HashMap;

/// A descriptor as exported: its number and the inode it named.
pub type Descriptor = (i32, u64);

/// The exported allocations of this process.
#[derive(Debug, Default)]
pub struct Shareable {
    /// Allocation handle -> the descriptors exported for it.
    exported: HashMap<u64, Vec<Descriptor>>,
    /// Released allocations still alive: (limit index, bytes, descriptors).
    lingering: Vec<(usize, u64, Vec<Descriptor>)>,
}

impl Shareable {
    /// `handle` was exported as descriptor `fd` naming inode `inode`.
    pub fn exported(&mut self, handle: u64, fd: i32, inode: u64) {
        self.exported.entry(handle).or_default().push((fd, inode));
    }

    /// `handle`, charged `bytes` on limit index `dev`, was released: whether it stays charged
    /// (a descriptor exported for it is still open).
    pub fn released(
        &mut self,
        handle: u64,
        dev: usize,
        bytes: u64,
        open: impl Fn(i32, u64) -> bool,
    ) -> bool {
        let Some(fds) = self.exported.remove(&handle) else {
            return false;
        };
        if fds.iter().any(|&(fd, ino)| open(fd, ino)) {
            self.lingering.push((dev, bytes, fds));
            true
        } else {
            false
        }
    }

    /// The released allocations whose descriptors are all closed now, as (limit index, bytes) to
    /// credit.
    pub fn closed(&mut self, open: impl Fn(i32, u64) -> bool) -> Vec<(usize, u64)> {
        let mut done = Vec::new();
        self.lingering.retain(|(dev, bytes, fds)| {
            let alive = fds.iter().any(|&(fd, ino)| open(fd, ino));
            if !alive {
                done.push((*dev, *bytes));
            }
            alive
        });
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn an_exported_allocation_stays_charged_until_its_descriptors_close() {
        let open = RefCell::new(vec![(7, 70), (8, 80)]);
        let is_open = |fd: i32, ino: u64| open.borrow().contains(&(fd, ino));
        let mut s = Shareable::default();
        // Never exported: released at once.
        assert!(!s.released(1, 0, 100, is_open));
        s.exported(2, 7, 70);
        s.exported(2, 8, 80);
        assert!(s.released(2, 0, 200, is_open));
        assert!(!s.lingering.is_empty());
        // One descriptor closed: still alive through the other.
        open.borrow_mut().retain(|d| d.0 != 7);
        assert_eq!(s.closed(is_open), vec![]);
        // The other now names another file (the number was reused): the memory is gone.
        open.borrow_mut().push((8, 81));
        open.borrow_mut().retain(|d| *d != (8, 80));
        assert_eq!(s.closed(is_open), vec![(0, 200)]);
        assert!(s.lingering.is_empty());
        // Exported, closed before the release: released at once.
        s.exported(3, 9, 90);
        assert!(!s.released(3, 1, 300, is_open));
    }
}
