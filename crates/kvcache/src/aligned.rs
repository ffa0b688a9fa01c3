//! A zero-initialized, 64-byte-aligned byte buffer for page storage.
//!
//! Small buffers come from `alloc_zeroed`. Buffers of [`HUGE_PAGE_MIN`] bytes or more are
//! anonymous mappings, 2 MiB-aligned and advised for transparent huge pages: attention reads a
//! context's pages scattered over the pool, and with 4 KiB pages nearly every block read is a
//! TLB miss (a page walk, two-dimensional under virtualization). Where the kernel grants no
//! huge pages the mapping works as ordinary memory. Either way, pages the process never
//! touches cost no resident memory.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

use memmap2::{MmapMut, MmapOptions};

pub const ALIGN: usize = 64;
/// Size (and alignment) of a transparent huge page on x86-64.
pub const HUGE_PAGE: usize = 2 << 20;
/// Buffers this large are mapped and advised for huge pages.
pub const HUGE_PAGE_MIN: usize = 4 << 20;

enum Storage {
    Empty,
    /// From `alloc_zeroed` with `Layout(len, ALIGN)`.
    Heap(NonNull<u8>),
    /// An anonymous mapping of `len + HUGE_PAGE` bytes; the buffer starts at `start`.
    Mapped {
        map: MmapMut,
        start: usize,
    },
}

pub struct AlignedBuf {
    storage: Storage,
    len: usize,
}

// The buffer is plain bytes owned uniquely.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf { storage: Storage::Empty, len: 0 };
        }
        if len >= HUGE_PAGE_MIN {
            if let Some(storage) = Self::mapped(len) {
                return AlignedBuf { storage, len };
            }
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows a Layout");
        // SAFETY: layout has nonzero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { storage: Storage::Heap(ptr), len }
    }

    /// A 2 MiB-aligned window of an anonymous (zero-filled) mapping, advised for huge pages;
    /// `None` if the mapping fails (the caller falls back to the heap).
    fn mapped(len: usize) -> Option<Storage> {
        let map = MmapOptions::new().len(len.checked_add(HUGE_PAGE)?).map_anon().ok()?;
        // Not every kernel supports the advice; the mapping is fine without it.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = map.as_ptr() as usize;
        let start = base.next_multiple_of(HUGE_PAGE) - base;
        debug_assert!(start + len <= map.len());
        Some(Storage::Mapped { map, start })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is a huge-page-advised mapping (large buffers).
    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            // An 8-aligned empty slice: callers cast it to f32/f16 slices.
            // SAFETY: a dangling, aligned pointer is valid for 0 bytes.
            Storage::Empty => unsafe { std::slice::from_raw_parts(NonNull::<u64>::dangling().as_ptr().cast(), 0) },
            // SAFETY: ptr is valid for len initialized (zeroed) bytes for the life of self.
            Storage::Heap(ptr) => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), self.len) },
            Storage::Mapped { map, start } => &map[*start..*start + self.len],
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        match &mut self.storage {
            // SAFETY: as for `as_slice`.
            Storage::Empty => unsafe { std::slice::from_raw_parts_mut(NonNull::<u64>::dangling().as_ptr().cast(), 0) },
            // SAFETY: as above, and &mut self guarantees uniqueness.
            Storage::Heap(ptr) => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) },
            Storage::Mapped { map, start } => &mut map[*start..*start + len],
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Storage::Heap(ptr) = self.storage {
            let layout = Layout::from_size_align(self.len, ALIGN).expect("layout was valid at allocation");
            // SAFETY: allocated with this layout in `zeroed`.
            unsafe { dealloc(ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_are_zeroed_aligned_and_writable() {
        for len in [2usize, 4096, HUGE_PAGE_MIN - 1, HUGE_PAGE_MIN, HUGE_PAGE_MIN + 12_345] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.is_mapped(), len >= HUGE_PAGE_MIN, "{len}");
            assert!(b.as_slice().iter().all(|&x| x == 0), "{len}");
            let align = if b.is_mapped() { HUGE_PAGE } else { ALIGN };
            assert_eq!(b.as_slice().as_ptr() as usize % align, 0, "{len}");
            let s = b.as_mut_slice();
            s[0] = 7;
            s[len - 1] = 9;
            assert_eq!((b.as_slice()[0], b.as_slice()[len - 1]), (7, 9));
        }
        let mut e = AlignedBuf::zeroed(0);
        assert!(e.as_slice().is_empty() && e.as_mut_slice().is_empty());
        assert_eq!(e.as_slice().as_ptr() as usize % 8, 0, "empty slices still cast to f32");
    }
}
