//! The checks every attention call passes before any kernel runs: shapes, head groups, the
//! layer's planes against its format, and every block the call will read.

use kvcache::{LayerView, NULL_BLOCK};

use super::error::AttentionError;
use super::group::QueryBounds;
use super::params::AttentionParams;

/// Checks every shape and every block a call will read; after this, kernels index freely.
pub(crate) fn validate(layer: &LayerView, p: &AttentionParams, out: &[f32]) -> Result<(), AttentionError> {
    let (hkv, d) = (layer.num_kv_heads, layer.head_dim);
    if hkv == 0 || p.num_heads == 0 || !p.num_heads.is_multiple_of(hkv) {
        return Err(AttentionError::HeadGroup { num_heads: p.num_heads, num_kv_heads: hkv });
    }
    if p.q_len == 0 {
        return Err(AttentionError::Shape { what: "q_len", expected: 1, got: 0 });
    }
    let n = p.num_seqs * p.q_len * p.num_heads * d;
    for (what, got) in [("queries", p.queries.len()), ("out", out.len())] {
        if got != n {
            return Err(AttentionError::Shape { what, expected: n, got });
        }
    }
    for (what, got) in [("block_tables", p.block_tables.len()), ("context_lens", p.context_lens.len())] {
        if got != p.num_seqs {
            return Err(AttentionError::Shape { what, expected: p.num_seqs, got });
        }
    }
    if p.sliding_window == Some(0) {
        return Err(AttentionError::ZeroWindow);
    }
    check_layer(layer)?;
    let bs = layer.block_size;
    let num_blocks = layer.keys.codes.len() / (bs * hkv * layer.keys.code_bytes);
    for seq in 0..p.num_seqs {
        let ctx = p.context_lens[seq];
        if ctx < p.q_len {
            return Err(AttentionError::ContextTooShort { seq, context_len: ctx, q_len: p.q_len });
        }
        let table = p.block_tables[seq];
        let needed = ctx.div_ceil(bs);
        if table.len() < needed {
            return Err(AttentionError::BlockTableShort { seq, needed, len: table.len() });
        }
        let range = QueryBounds::of(p, seq).read_range();
        for (logical, &block) in table.iter().enumerate().take(needed).skip(range.start / bs) {
            if block == NULL_BLOCK || block as usize >= num_blocks {
                return Err(AttentionError::BadBlock { seq, logical, block, num_blocks });
            }
        }
    }
    Ok(())
}

/// The planes agree with the layer's geometry and format.
fn check_layer(layer: &LayerView) -> Result<(), AttentionError> {
    let (hkv, d, bs) = (layer.num_kv_heads, layer.head_dim, layer.block_size);
    if d == 0 || bs == 0 || hkv == 0 {
        return Err(AttentionError::Layer(format!("head_dim {d}, block_size {bs}, kv heads {hkv}")));
    }
    for (side, plane, codec) in
        [("K", &layer.keys, layer.format.key_codec()), ("V", &layer.values, layer.format.value_codec())]
    {
        if plane.codec != codec
            || plane.code_bytes != codec.code_bytes(d)
            || plane.n_scales != codec.scales(d)
            || plane.num_kv_heads != hkv
        {
            return Err(AttentionError::Layer(format!("{side} plane does not match format {}", layer.format.name())));
        }
        let slots = plane.codes.len() / (hkv * plane.code_bytes);
        if plane.codes.len() % (bs * hkv * plane.code_bytes) != 0 || plane.scales.len() != slots * hkv * plane.n_scales
        {
            return Err(AttentionError::Layer(format!("{side} plane sizes are not whole blocks")));
        }
    }
    if layer.keys.codes.len() / layer.keys.code_bytes != layer.values.codes.len() / layer.values.code_bytes {
        return Err(AttentionError::Layer("K and V planes hold different slot counts".into()));
    }
    match (layer.format.is_rotated(), layer.rotation) {
        (true, Some(r)) if r.head_dim() == d => Ok(()),
        (false, None) => Ok(()),
        _ => {
            Err(AttentionError::Layer(format!("rotation does not match format {} / head_dim {d}", layer.format.name())))
        }
    }
}
