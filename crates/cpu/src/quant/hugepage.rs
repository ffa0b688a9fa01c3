//! [`HugePageBuf`]: a byte buffer in anonymous memory that asks the kernel for transparent
//! huge pages (2 MiB on x86-64), for weights that every decode step streams end to end.
//!
//! Why: a decode step reads every weight byte once (≈ 96 MB for SmolLM2-135M Q4_1), and with
//! 4 KiB pages that is ≈ 24,000 TLB misses per step, each a page walk (two-dimensional under
//! virtualization), and the hardware prefetchers stop at every 4 KiB boundary. A memory-mapped
//! GGUF file lives in the page cache, which mostly uses 4 KiB pages. A copy in huge pages
//! removes both costs. Where the kernel grants no huge pages the buffer still works, as
//! ordinary memory.

use memmap2::{Advice, MmapOptions, MmapRaw};

/// Size of a transparent huge page on x86-64 (also the alignment asked for).
pub const HUGE_PAGE: usize = 2 << 20;

/// A zero-initialized, 2 MiB-aligned byte buffer advised for transparent huge pages.
pub struct HugePageBuf {
    map: MmapRaw,
    /// Offset of the aligned start inside `map`.
    start: usize,
    len: usize,
}

impl std::fmt::Debug for HugePageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugePageBuf").field("len", &self.len).finish()
    }
}

impl HugePageBuf {
    /// `len` zero bytes, 2 MiB-aligned. Huge pages are advised before any page is touched, so
    /// the first write to each 2 MiB range can fault in a huge page.
    pub fn zeroed(len: usize) -> std::io::Result<HugePageBuf> {
        let map = MmapRaw::from(MmapOptions::new().len(len + HUGE_PAGE).map_anon()?);
        // Not every kernel supports the advice; the buffer is fine without it.
        #[cfg(target_os = "linux")]
        let _ = map.advise(Advice::HugePage);
        #[cfg(not(target_os = "linux"))]
        let _ = Advice::Normal;
        let base = map.as_mut_ptr() as usize;
        let start = base.next_multiple_of(HUGE_PAGE) - base;
        Ok(HugePageBuf { map, start, len })
    }

    /// The first byte, for writers that fill disjoint ranges from several threads while others
    /// read ranges already filled (see [`HugePageBuf::as_slice`]'s contract).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        // SAFETY: `start <= HUGE_PAGE` lies inside the mapping.
        unsafe { self.map.as_mut_ptr().add(self.start) }
    }

    /// A copy of `data`.
    pub fn copy_of(data: &[u8]) -> std::io::Result<HugePageBuf> {
        let mut buf = HugePageBuf::zeroed(data.len())?;
        buf.as_mut_slice().copy_from_slice(data);
        Ok(buf)
    }

    /// The bytes. Callers that write through [`HugePageBuf::as_mut_ptr`] while the buffer is
    /// shared only read ranges whose writes have finished (and are ordered before the read).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping holds `start + len` bytes and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.as_mut_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` excludes every other access.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        let mut b = HugePageBuf::zeroed(3 * HUGE_PAGE + 5).unwrap();
        assert_eq!(b.len(), 3 * HUGE_PAGE + 5);
        assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(b.as_slice().iter().all(|&v| v == 0));
        b.as_mut_slice()[HUGE_PAGE + 1] = 7;
        let c = HugePageBuf::copy_of(b.as_slice()).unwrap();
        assert_eq!(c.as_slice(), b.as_slice());
        assert!(HugePageBuf::zeroed(0).unwrap().is_empty());
    }
}
