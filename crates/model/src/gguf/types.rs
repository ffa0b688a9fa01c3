//! `GgmlType`: the tensor element types a GGUF file may declare, with ggml's numeric ids,
//! block sizes (elements per block) and type sizes (bytes per block).
//!
//! The table mirrors ggml's `type_traits` (ggml.c). Ids that ggml retired (4, 5, 31–33,
//! 36–38) and ids past the end are unknown: parsing them is an error naming the id.

use super::GgufError;

/// A ggml tensor element type, as stored in a GGUF tensor info (`u32` id).
///
/// Quantized types store `block_size()` elements in `type_size()` bytes; plain types have a
/// block size of 1.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// `(type, ggml id, name, block_size, type_size)` — the single source of truth for the enum.
const TABLE: [(GgmlType, u32, &str, usize, usize); 32] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18), // f16 d + 16 B of nibbles
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20), // f16 d, f16 m + 16 B
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22), // f16 d + 4 B high bits + 16 B
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24), // f16 d, f16 m + 4 B + 16 B
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34), // f16 d + 32 i8
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36), // f16 d, f16 s + 32 i8
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292), // f32 d + 256 i8 + 16 i16 sums
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17), // e8m0 scale + 16 B of fp4 pairs
];

impl GgmlType {
    /// Every known type, in ggml id order.
    pub const ALL: [GgmlType; 32] = {
        let mut all = [GgmlType::F32; 32];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // The enum discriminant is the row index: TABLE lists variants in declaration order.
        let row = &TABLE[self as usize];
        debug_assert_eq!(row.0, self);
        row
    }

    /// The type for a ggml id; unknown or retired ids are `GgufError::UnknownType(id)`.
    pub fn from_id(id: u32) -> Result<GgmlType, GgufError> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0).ok_or(GgufError::UnknownType(id))
    }

    /// ggml's numeric id (what a GGUF tensor info stores).
    pub fn id(&self) -> u32 {
        self.row().1
    }

    /// Elements per block (1 for plain types, 32 or 256 for quantized ones).
    pub fn block_size(&self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(&self) -> usize {
        self.row().4
    }

    /// ggml's name for the type, e.g. `"Q4_1"`, `"Q6_K"`.
    pub fn name(&self) -> &'static str {
        self.row().2
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole
    /// number of blocks or the size overflows `u64`.
    pub fn bytes_for(&self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_match_declaration_order_and_ids_round_trip() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.0 as usize, i, "{} out of order", row.2);
            assert_eq!(GgmlType::from_id(row.1).unwrap(), row.0);
            assert_eq!(GgmlType::ALL[i], row.0);
        }
    }

    #[test]
    fn known_sizes() {
        assert_eq!(GgmlType::Q4_1.type_size(), 20);
        assert_eq!(GgmlType::Q6K.block_size(), 256);
        assert_eq!(GgmlType::Q6K.type_size(), 210);
        assert_eq!(GgmlType::from_id(30).unwrap(), GgmlType::BF16);
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }

    #[test]
    fn retired_and_unknown_ids_are_errors() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, u32::MAX] {
            assert!(matches!(GgmlType::from_id(id), Err(GgufError::UnknownType(x)) if x == id));
        }
    }
}
