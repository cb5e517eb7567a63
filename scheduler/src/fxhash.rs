//! The hash of the node maps: node names are short keys from the cluster's own Node objects.

use std::hash::Hasher;

/// The Fx hash (rustc's): a multiply-rotate over 8-byte words, several times faster than SipHash
/// on short keys like node names. Not DoS-resistant, which is fine for keys that come from the
/// cluster's own Node objects.
#[derive(Debug, Clone, Copy, Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
