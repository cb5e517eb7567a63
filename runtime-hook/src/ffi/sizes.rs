//! What an allocation costs, from the C descriptors a caller passes: array, mipmapped-array and
//! pitched sizes, and the layouts of the descriptors themselves (cuda.h). Safe code.
#![deny(unsafe_code)]

use super::*;

/// `CUDA_ARRAY_DESCRIPTOR` (cuda.h).
#[repr(C)]
pub struct ArrayDescriptor {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) format: c_uint,
    pub(super) channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (cuda.h).
#[repr(C)]
pub struct Array3dDescriptor {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) depth: usize,
    pub(super) format: c_uint,
    pub(super) channels: c_uint,
    pub(super) flags: c_uint,
}

/// `CUlaunchConfig` (cuda.h, CUDA 12.0): grid and block dimensions first.
#[repr(C)]
pub struct LaunchConfig {
    pub(super) grid: [c_uint; 3],
    pub(super) block: [c_uint; 3],
    pub(super) shared: c_uint,
    pub(super) stream: *mut c_void,
    pub(super) attrs: *mut c_void,
    pub(super) num_attrs: c_uint,
}

/// `CUmemAllocationProp` prefix (cuda.h): type, requested handle types, location {type, id}.
#[repr(C)]
pub(super) struct MemAllocationProp {
    pub(super) kind: c_uint,
    pub(super) handle_types: c_uint,
    pub(super) location_type: c_uint,
    pub(super) location_id: c_int,
}

/// Bytes of one element channel of a `CUarray_format`: 8-, 16- and 32-bit integer formats, half and
/// float (cuda.h `CU_AD_FORMAT_*`); formats added later (block-compressed, NV12, ...) are charged as
/// 32-bit, the widest channel, so an array is never under-charged for them.
pub(super) fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

pub(super) fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(format_bytes(format))
        .saturating_mul(u64::from(channels.max(1)))
}

/// `CUDA_ARRAY3D_LAYERED` and `CUDA_ARRAY3D_CUBEMAP` (cuda.h): the depth counts layers (or the 6
/// faces), which mipmap levels do not shrink.
pub(super) const ARRAY3D_LAYERED: c_uint = 0x01;
pub(super) const ARRAY3D_CUBEMAP: c_uint = 0x04;

/// Bytes of a mipmapped array: the sum over its levels, level `l` with width, height and depth
/// halved `l` times (at least 1 each; a layered or cubemap array keeps its depth). A level count
/// of 0 is charged as 1 (the driver refuses it).
pub(super) fn mipmapped_bytes(d: &Array3dDescriptor, levels: c_uint) -> u64 {
    let keep_depth = d.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
    let per_element = format_bytes(d.format).saturating_mul(u64::from(d.channels.max(1)));
    (0..levels.max(1))
        .map(|l| {
            let shrink = |x: usize| (x.max(1) as u64 >> l.min(63)).max(1);
            let depth = if keep_depth {
                d.depth.max(1) as u64
            } else {
                shrink(d.depth)
            };
            shrink(d.width)
                .saturating_mul(shrink(d.height))
                .saturating_mul(depth)
                .saturating_mul(per_element)
        })
        .fold(0u64, u64::saturating_add)
}

/// Row pitch the hook reserves for before `cuMemAllocPitch` returns the real one: the width rounded
/// up to 512 bytes, the largest texture pitch alignment of current GPUs. The reservation is
/// corrected to the driver's pitch afterwards.
pub(super) const PITCH_ALIGN: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_follow_the_descriptor() {
        // CU_AD_FORMAT_FLOAT x 4 channels = 16 bytes per element; height/depth 0 means 1.
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4), 16 << 20);
        assert_eq!(array_bytes(10, 0, 0, 0x01, 1), 10);
        assert_eq!(array_bytes(10, 2, 3, 0x10, 2), 240);
        // Unknown formats are charged as 32-bit channels.
        assert_eq!(array_bytes(1, 1, 1, 0xb0, 1), 4);
        assert_eq!(array_bytes(usize::MAX, usize::MAX, 1, 0x20, 4), u64::MAX);
        // Mipmaps: 1024^2 float4 with all 11 levels is 16 MiB x (1 + 1/4 + ...) = 22369616 bytes;
        // a layered array keeps its 6 layers at every level; 0 levels is charged as 1.
        let d = |w, h, depth, flags| Array3dDescriptor {
            width: w,
            height: h,
            depth,
            format: 0x20,
            channels: 4,
            flags,
        };
        assert_eq!(mipmapped_bytes(&d(1024, 1024, 0, 0), 11), 22_369_616);
        assert_eq!(mipmapped_bytes(&d(4, 4, 6, 0x01), 3), (16 + 4 + 1) * 6 * 16);
        assert_eq!(mipmapped_bytes(&d(4, 4, 4, 0), 3), (64 + 8 + 1) * 16);
        assert_eq!(mipmapped_bytes(&d(8, 0, 0, 0), 0), 8 * 16);
    }
}
