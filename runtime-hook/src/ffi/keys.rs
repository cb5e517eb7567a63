//! The live-allocation table's keys: which kind of handle a driver value names, and a fast hasher
//! for them. Safe code.
#![deny(unsafe_code)]

use super::*;

/// What an allocation's key names: the driver's pointers, VMM handles and arrays are different
/// namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Ptr,
    Handle,
    Array,
}

/// Hasher of the live-allocation table's keys (a kind and a driver pointer or handle): one
/// multiply-fold per word instead of SipHash. The keys come from the driver, not from input a
/// hostile party chooses, so flooding resistance buys nothing here; the fold keeps the low bits,
/// which pick the bucket, well mixed even for aligned pointers.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct KeyHasher(u64);

impl KeyHasher {
    #[inline]
    pub(super) fn mix(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
    #[inline]
    fn write_isize(&mut self, n: isize) {
        self.mix(n as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type KeyMap =
    HashMap<(Kind, u64), (usize, u64), std::hash::BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 MiB-aligned pointers (the driver's large-allocation granularity) spread over the low bits
    /// that pick a hash bucket, and the kinds keep equal keys apart.
    #[test]
    fn allocation_keys_hash_apart() {
        use std::hash::BuildHasher;
        let b = std::hash::BuildHasherDefault::<KeyHasher>::default();
        let buckets: std::collections::HashSet<u64> = (0..1024u64)
            .map(|i| b.hash_one((Kind::Ptr, 0x7f00_0000_0000 + (i << 21))) & 1023)
            .collect();
        assert!(buckets.len() > 550, "{}", buckets.len());
        assert_ne!(
            b.hash_one((Kind::Ptr, 1u64)),
            b.hash_one((Kind::Array, 1u64))
        );
        let mut m = KeyMap::default();
        m.insert((Kind::Handle, 7), (0, 10));
        assert_eq!(m.remove(&(Kind::Handle, 7)), Some((0, 10)));
    }
}
