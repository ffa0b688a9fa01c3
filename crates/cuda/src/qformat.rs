//! The GGUF block formats the GPU multiplies in place ([`QuantType`]) and their device layout
//! ([`split_blocks`]): each block's f16 fields that would break 4-byte alignment (`d`, and `m`
//! of the `_1` types) move to a separate header array in block order, the rest stays in the
//! data array in the file's order. Host-side only (no feature needed), so the layout is tested
//! everywhere; the kernels are `qmatrix.rs`.

use crate::CudaError;

/// GGUF block formats the GPU multiplies in place.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl QuantType {
    pub const ALL: [QuantType; 8] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// The type of a GGML type id; `None` for types without GPU kernels.
    pub fn from_ggml(id: u32) -> Option<QuantType> {
        Some(match id {
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            6 => QuantType::Q5_0,
            7 => QuantType::Q5_1,
            8 => QuantType::Q8_0,
            12 => QuantType::Q4_K,
            13 => QuantType::Q5_K,
            14 => QuantType::Q6_K,
            _ => return None,
        })
    }

    /// The kernels' suffix (`q4_k`).
    pub fn suffix(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q5_1 => "q5_1",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q4_K => "q4_k",
            QuantType::Q5_K => "q5_k",
            QuantType::Q6_K => "q6_k",
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => 256,
            _ => 32,
        }
    }

    /// Bytes per block in the file.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q4_K => 144,
            QuantType::Q5_K => 176,
            QuantType::Q6_K => 210,
        }
    }

    /// f16 fields per block moved to the header array.
    pub(crate) fn hdr_halves(self) -> usize {
        match self {
            QuantType::Q4_1 | QuantType::Q5_1 => 2,
            QuantType::Q4_K | QuantType::Q5_K => 0,
            _ => 1,
        }
    }

    /// Bytes per block left in the data array.
    pub(crate) fn data_bytes(self) -> usize {
        self.block_bytes() - 2 * self.hdr_halves()
    }

    /// Whether the header fields are at the block's end (Q6_K) rather than its start.
    fn hdr_at_end(self) -> bool {
        self == QuantType::Q6_K
    }
}

/// Splits `bytes` (whole GGUF blocks of `qt`) into the device layout: the data array and the
/// header array (see the module doc).
pub fn split_blocks(qt: QuantType, bytes: &[u8]) -> Result<(Vec<u8>, Vec<u16>), CudaError> {
    let bb = qt.block_bytes();
    if !bytes.len().is_multiple_of(bb) {
        return Err(CudaError::Invalid(format!("{} bytes are not whole {qt:?} blocks of {bb}", bytes.len())));
    }
    let blocks = bytes.len() / bb;
    let (hb, db) = (2 * qt.hdr_halves(), qt.data_bytes());
    let mut data = Vec::with_capacity(blocks * db);
    let mut hdr = Vec::with_capacity(blocks * qt.hdr_halves());
    for b in bytes.chunks_exact(bb) {
        let (h, d) = if qt.hdr_at_end() { (&b[db..], &b[..db]) } else { (&b[..hb], &b[hb..]) };
        data.extend_from_slice(d);
        hdr.extend(h.chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])));
    }
    Ok((data, hdr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_moves_headers_and_keeps_the_rest_in_order() {
        // Q8_0: d (2 bytes) then 32 codes; Q6_K: 208 bytes then d.
        let q8: Vec<u8> = (0..68u8).collect();
        let (data, hdr) = split_blocks(QuantType::Q8_0, &q8).unwrap();
        assert_eq!(hdr, vec![u16::from_le_bytes([0, 1]), u16::from_le_bytes([34, 35])]);
        assert_eq!(&data[..32], &q8[2..34]);
        assert_eq!(&data[32..], &q8[36..68]);
        let q6: Vec<u8> = (0..210u32).map(|i| i as u8).collect();
        let (data, hdr) = split_blocks(QuantType::Q6_K, &q6).unwrap();
        assert_eq!(data, q6[..208].to_vec());
        assert_eq!(hdr, vec![u16::from_le_bytes([208, 209])]);
        let (data, hdr) = split_blocks(QuantType::Q4_K, &[7u8; 288]).unwrap();
        assert_eq!((data.len(), hdr.len()), (288, 0));
        assert!(split_blocks(QuantType::Q4_1, &[0u8; 21]).is_err());
    }

    #[test]
    fn device_blocks_stay_aligned() {
        for qt in QuantType::ALL {
            assert_eq!(qt.data_bytes() % 4, 0, "{qt:?}");
            assert_eq!(qt.block_bytes(), qt.data_bytes() + 2 * qt.hdr_halves());
            assert_eq!(QuantType::from_ggml(ggml_id(qt)), Some(qt));
        }
        // 16-byte loads of whole blocks or 32-byte runs within them.
        for qt in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K]
        {
            assert_eq!(qt.data_bytes() % 16, 0, "{qt:?}");
        }
    }

    fn ggml_id(qt: QuantType) -> u32 {
        (0..64).find(|&i| QuantType::from_ggml(i) == Some(qt)).unwrap()
    }
}
