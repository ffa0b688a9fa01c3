//! Layer groups of a hybrid cache: layers with the same attention type (full, or a sliding
//! window of W tokens) share one block table per sequence.
//!
//! The caller (the engine, from the model's per-layer windows) hands the cache a
//! [`LayerGroups`] value; the cache never looks at a model. All groups hold the same number of
//! layers `planes`, and the pool stores `planes` page planes: block `b` of plane `j` holds
//! layer `j` of whichever group owns block `b` (vLLM v1's hybrid allocator; see
//! `docs/architecture.md`, "Hybrid cache"). Gemma 3 270M (18 layers, every sixth global) is
//! one full group of 3 layers and five sliding groups of 3 layers each.
//!
//! A model with one attention type is one [`GroupKind::Full`] group of every layer, with
//! `planes = num_layers`: exactly the cache without groups. (A whole-sequence window such as
//! Mistral's stays the sequence policy's `sliding_window`, as before.)

use crate::error::ConfigError;

/// The attention type of a group's layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Attention over every position; the group's table grows with the sequence.
    Full,
    /// Attention over the last `window` tokens; the group holds at most
    /// `⌈window / block_size⌉ + 1` blocks between steps and frees the rest as it slides.
    Sliding { window: usize },
}

impl GroupKind {
    pub fn window(self) -> Option<usize> {
        match self {
            GroupKind::Full => None,
            GroupKind::Sliding { window } => Some(window),
        }
    }
}

/// Layers partitioned into groups of equal size, and where each layer's pages live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGroups {
    /// `[groups]` kind of each group.
    kinds: Vec<GroupKind>,
    /// `[groups][planes]` the layers of each group, ascending.
    layers: Vec<Vec<usize>>,
    /// `[num_layers]` (group, plane) of each layer.
    place: Vec<(u32, u32)>,
}

impl LayerGroups {
    /// One full group of every layer: the cache without groups.
    pub fn single(num_layers: usize) -> LayerGroups {
        LayerGroups {
            kinds: vec![GroupKind::Full],
            layers: vec![(0..num_layers).collect()],
            place: (0..num_layers).map(|l| (0, l as u32)).collect(),
        }
    }

    /// Groups from each layer's window (`None`: full attention). Layers of one kind are cut,
    /// in order, into groups of `gcd` of the kinds' layer counts, so every group has the same
    /// size. Every layer of one kind: a single group (of kind full, whatever the window: a
    /// uniform window stays the sequence policy's business).
    pub fn from_layer_windows(windows: &[Option<usize>]) -> Result<LayerGroups, ConfigError> {
        if windows.is_empty() {
            return Err(ConfigError::Geometry("layer groups need at least one layer".into()));
        }
        if let Some(l) = windows.iter().position(|w| *w == Some(0)) {
            return Err(ConfigError::Geometry(format!("layer {l} has a sliding window of 0 tokens")));
        }
        let mut kinds: Vec<GroupKind> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (l, w) in windows.iter().enumerate() {
            let kind = w.map_or(GroupKind::Full, |window| GroupKind::Sliding { window });
            match kinds.iter().position(|k| *k == kind) {
                Some(i) => members[i].push(l),
                None => {
                    kinds.push(kind);
                    members.push(vec![l]);
                }
            }
        }
        if kinds.len() == 1 {
            return Ok(LayerGroups::single(windows.len()));
        }
        let size = members.iter().map(Vec::len).fold(0, gcd);
        let mut groups = Vec::new();
        for (kind, layers) in kinds.into_iter().zip(members) {
            groups.extend(layers.chunks(size).map(|c| (kind, c.to_vec())));
        }
        LayerGroups::from_groups(windows.len(), groups)
    }

    /// Groups given explicitly: `(kind, layers)` pairs that partition `0..num_layers` into
    /// groups of one size.
    pub fn from_groups(num_layers: usize, groups: Vec<(GroupKind, Vec<usize>)>) -> Result<LayerGroups, ConfigError> {
        let bad = |why: String| Err(ConfigError::Geometry(format!("layer groups: {why}")));
        let Some(size) = groups.first().map(|g| g.1.len()) else {
            return bad("no group".into());
        };
        let mut place = vec![None; num_layers];
        let (mut kinds, mut layers) = (Vec::new(), Vec::new());
        for (g, (kind, mut ls)) in groups.into_iter().enumerate() {
            if ls.len() != size || size == 0 {
                return bad(format!("group {g} has {} layers, group 0 has {size}: groups must be one size", ls.len()));
            }
            if kind == (GroupKind::Sliding { window: 0 }) {
                return bad(format!("group {g} has a window of 0 tokens"));
            }
            ls.sort_unstable();
            for (plane, &l) in ls.iter().enumerate() {
                match place.get_mut(l) {
                    Some(slot @ None) => *slot = Some((g as u32, plane as u32)),
                    Some(Some(_)) => return bad(format!("layer {l} is in two groups")),
                    None => return bad(format!("layer {l} is out of range ({num_layers} layers)")),
                }
            }
            kinds.push(kind);
            layers.push(ls);
        }
        let Some(place) = place.into_iter().collect::<Option<Vec<_>>>() else {
            return bad("some layer is in no group".into());
        };
        Ok(LayerGroups { kinds, layers, place })
    }

    pub fn num_groups(&self) -> usize {
        self.kinds.len()
    }

    pub fn num_layers(&self) -> usize {
        self.place.len()
    }

    /// Layers per group: the page planes of the pool (a block spans this many layers).
    pub fn planes(&self) -> usize {
        self.layers[0].len()
    }

    pub fn kind(&self, group: usize) -> GroupKind {
        self.kinds[group]
    }

    pub fn kinds(&self) -> &[GroupKind] {
        &self.kinds
    }

    /// The layers of `group`, ascending.
    pub fn layers(&self, group: usize) -> &[usize] {
        &self.layers[group]
    }

    /// `(group, plane)` of `layer`: its block table and the page plane holding it.
    pub fn locate(&self, layer: usize) -> (usize, usize) {
        let (g, p) = self.place[layer];
        (g as usize, p as usize)
    }

    /// One full group: the cache behaves exactly as without groups.
    pub fn is_single(&self) -> bool {
        self.kinds.len() == 1
    }

    /// Blocks a group holds at most between steps under `window` (`None`: no bound).
    pub fn sliding_cap(window: usize, block_size: usize) -> usize {
        window.div_ceil(block_size) + 1
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's pattern: every sixth layer global.
    fn gemma(layers: usize) -> Vec<Option<usize>> {
        (0..layers).map(|l| if l % 6 == 5 { None } else { Some(512) }).collect()
    }

    #[test]
    fn gemma3_270m_is_one_full_and_five_sliding_groups_of_three() {
        let g = LayerGroups::from_layer_windows(&gemma(18)).unwrap();
        assert_eq!((g.num_groups(), g.planes(), g.num_layers()), (6, 3, 18));
        assert_eq!(g.kind(0), GroupKind::Sliding { window: 512 });
        assert_eq!(g.layers(0), &[0, 1, 2]);
        assert_eq!(g.layers(1), &[3, 4, 6]);
        let full: Vec<usize> = (0..6).filter(|&i| g.kind(i) == GroupKind::Full).collect();
        assert_eq!(full, vec![5]);
        assert_eq!(g.layers(5), &[5, 11, 17]);
        assert_eq!(g.locate(11), (5, 1));
        assert_eq!(g.locate(6), (1, 2));
        // Every layer has one place, and places are distinct.
        let mut seen = std::collections::HashSet::new();
        for l in 0..18 {
            assert!(seen.insert(g.locate(l)));
        }
    }

    #[test]
    fn gemma3_1b_groups_by_the_gcd() {
        // 26 layers: 4 global, 22 local -> groups of 2.
        let g = LayerGroups::from_layer_windows(&gemma(26)).unwrap();
        assert_eq!((g.num_groups(), g.planes()), (13, 2));
        assert_eq!(g.kinds().iter().filter(|k| **k == GroupKind::Full).count(), 2);
    }

    #[test]
    fn one_attention_type_is_one_full_group() {
        assert_eq!(LayerGroups::from_layer_windows(&[None; 4]).unwrap(), LayerGroups::single(4));
        let uniform = LayerGroups::from_layer_windows(&[Some(4096); 4]).unwrap();
        assert!(uniform.is_single());
        assert_eq!(uniform.kind(0), GroupKind::Full);
        assert_eq!(uniform.planes(), 4);
        assert_eq!(uniform.locate(3), (0, 3));
    }

    #[test]
    fn explicit_groups_must_partition_the_layers_in_one_size() {
        let s = GroupKind::Sliding { window: 8 };
        let ok = LayerGroups::from_groups(4, vec![(GroupKind::Full, vec![3, 0]), (s, vec![1, 2])]).unwrap();
        assert_eq!(ok.layers(0), &[0, 3]);
        assert_eq!(ok.locate(3), (0, 1));
        let err = |groups| LayerGroups::from_groups(4, groups).unwrap_err().to_string();
        assert!(err(vec![(GroupKind::Full, vec![0, 1, 2]), (s, vec![3])]).contains("one size"));
        assert!(err(vec![(GroupKind::Full, vec![0, 1]), (s, vec![1, 2])]).contains("two groups"));
        assert!(err(vec![(GroupKind::Full, vec![0, 1]), (s, vec![2, 7])]).contains("out of range"));
        assert!(LayerGroups::from_groups(5, vec![(GroupKind::Full, vec![0, 1]), (s, vec![2, 3])]).is_err());
        assert!(LayerGroups::from_layer_windows(&[Some(0), None]).is_err());
    }
}
