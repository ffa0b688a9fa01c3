//! The identity of a full block's contents, chained over everything before it: what the
//! session bank indexes prefixes by.

/// Identity of a full block's contents: chained over the prefix (see [`BlockHash::chain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// `hash(parent, tokens, extra)`: `extra` carries the model and format identity, so blocks
    /// of another model or KV format never match.
    pub fn chain(parent: Option<BlockHash>, tokens: &[u32], extra: u64) -> BlockHash {
        // Two independent 64-bit FNV-1a-style mixes finished with SplitMix64: stable across
        // runs and platforms (unlike std's RandomState), 128 bits against accidental collisions.
        let mut a: u64 = 0xcbf2_9ce4_8422_2325 ^ extra;
        let mut b: u64 = 0x6c62_272e_07bb_0142 ^ extra.rotate_left(29);
        let mut feed = |x: u64| {
            a = (a ^ x).wrapping_mul(0x0000_0100_0000_01b3);
            b = crate::format::rotation::splitmix64(b ^ x);
        };
        match parent {
            Some(BlockHash(p)) => {
                feed(p as u64);
                feed((p >> 64) as u64);
            }
            None => feed(0x5eed),
        }
        feed(tokens.len() as u64);
        for &t in tokens {
            feed(t as u64);
        }
        let a = crate::format::rotation::splitmix64(a);
        BlockHash(((a as u128) << 64) | b as u128)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_hashes_depend_on_parent_tokens_and_identity() {
        let root = BlockHash::chain(None, &[1, 2, 3], 7);
        assert_eq!(root, BlockHash::chain(None, &[1, 2, 3], 7));
        assert_ne!(root, BlockHash::chain(None, &[1, 2, 4], 7));
        assert_ne!(root, BlockHash::chain(None, &[1, 2, 3], 8));
        assert_ne!(BlockHash::chain(Some(root), &[5], 7), BlockHash::chain(None, &[5], 7));
    }
}
