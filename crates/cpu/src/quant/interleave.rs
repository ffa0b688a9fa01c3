//! Q4_K matrices stored with their rows interleaved in groups of [`GROUP`] (the
//! [`RowLayout::Q4kX16`] layout), so the AVX-512 kernels load each 32-bit word of sixteen rows
//! with one vector load instead of transposing sixteen rows in registers.
//!
//! A group of 16 consecutive rows keeps its bytes (`16 × row_bytes`) in place, reordered: for
//! each super-block `b` of the rows, its 36 words (the `d`/`dmin` word, three words of packed
//! scales, 32 words of codes), word-major — word `w` of row `i` at [`word_offset`]`(b, w, i)`
//! `= ((b · 36 + w) · 16 + i) · 4` of the group. The values and every kernel's arithmetic are unchanged, so a product over the
//! interleaved matrix equals the one over plain rows bit for bit.

use super::blocks::QK_K;
use super::types::{QuantError, RowLayout, WeightType};

/// Rows per interleaved group.
pub const GROUP: usize = 16;
/// 32-bit words of one Q4_K super-block of one row (144 bytes).
const WORDS: usize = 36;
const BLOCK: usize = 4 * WORDS;

/// Where word `w` (`< 36`) of super-block `b` of row `i` (`< 16`) lies in its group, in
/// bytes: the layout's one definition (the kernels load word `w` of the 16 rows at
/// `word_offset(b, w, 0)`).
pub(crate) const fn word_offset(b: usize, w: usize, i: usize) -> usize {
    ((b * WORDS + w) * GROUP + i) * 4
}

/// Whether a `rows × cols` matrix of `ty` can be stored as [`RowLayout::Q4kX16`].
pub fn interleavable(ty: WeightType, rows: usize, cols: usize) -> bool {
    ty == WeightType::Q4K && rows > 0 && rows.is_multiple_of(GROUP) && cols > 0 && cols.is_multiple_of(QK_K)
}

fn check(ty: WeightType, rows: usize, cols: usize, len: usize) -> Result<usize, QuantError> {
    if !interleavable(ty, rows, cols) {
        return Err(QuantError::Layout { layout: RowLayout::Q4kX16, ty, rows, cols });
    }
    let group_bytes = GROUP * (cols / QK_K) * BLOCK;
    let expected = rows / GROUP * group_bytes;
    if len != expected {
        return Err(QuantError::Length { what: "interleaved weight bytes", expected, actual: len });
    }
    Ok(group_bytes)
}

/// Rewrites plain rows `data` (`rows × cols` of `ty`) in place as [`RowLayout::Q4kX16`]; on an
/// error `data` is left as it was.
pub fn interleave(data: &mut [u8], ty: WeightType, rows: usize, cols: usize) -> Result<(), QuantError> {
    let group_bytes = check(ty, rows, cols, data.len())?;
    let rb = group_bytes / GROUP;
    let mut plain = vec![0u8; group_bytes];
    for group in data.chunks_exact_mut(group_bytes) {
        plain.copy_from_slice(group);
        for (i, row) in plain.chunks_exact(rb).enumerate() {
            for (k, word) in row.chunks_exact(4).enumerate() {
                let at = word_offset(k / WORDS, k % WORDS, i);
                group[at..at + 4].copy_from_slice(word);
            }
        }
    }
    Ok(())
}

/// Row `i` (`< 16`) of one interleaved group (`16 × row_bytes` bytes of `cols` values) into
/// `out` (`row_bytes`), as plain Q4_K blocks: the inverse of [`interleave`] for one row.
pub fn group_row(group: &[u8], cols: usize, i: usize, out: &mut [u8]) {
    let nb = cols / QK_K;
    debug_assert!(i < GROUP && group.len() == GROUP * nb * BLOCK && out.len() == nb * BLOCK);
    for (k, word) in out.chunks_exact_mut(4).enumerate() {
        let at = word_offset(k / WORDS, k % WORDS, i);
        word.copy_from_slice(&group[at..at + 4]);
    }
}
