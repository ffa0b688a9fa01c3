//! A zero-initialized, 64-byte-aligned byte buffer. Large pools are allocated with
//! `alloc_zeroed`, so pages the process never touches cost no resident memory.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

pub const ALIGN: usize = 64;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// The buffer is plain bytes owned uniquely.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf { ptr: NonNull::<u64>::dangling().cast(), len: 0 };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows a Layout");
        // SAFETY: layout has nonzero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed) bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees uniqueness.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout = Layout::from_size_align(self.len, ALIGN).expect("layout was valid at allocation");
            // SAFETY: allocated with this layout in `zeroed`.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}
