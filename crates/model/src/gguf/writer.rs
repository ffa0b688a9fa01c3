//! `GgufWriter`: builds a GGUF v3 file in memory — for tests and tools (tiny synthetic
//! models, fuzz seeds, fixtures). It writes exactly the layout `reader.rs` parses.
//!
//! Tensor data is laid out in insertion order, each tensor at the next multiple of the
//! alignment (`general.alignment` if set to a valid value, else 32), and the file is padded
//! so that the data section starts aligned. Keys are written in insertion order; setting a
//! key twice replaces its value in place.

use super::metadata::{MetaArray, MetaValue};
use super::{GgmlType, GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC};

/// One tensor waiting to be written.
#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>, // GGUF order: dims[0] fastest-varying
    ggml_type: GgmlType,
    data: Vec<u8>, // exactly the size `dims` and `ggml_type` imply
}

/// Builds a GGUF file in memory. For tests and tools; see the module docs.
///
/// ```
/// use pagekv_model::gguf::{GgmlType, GgufFile, GgufWriter};
/// let mut w = GgufWriter::new();
/// w.set("general.architecture", "llama");
/// w.add_f32_tensor("norm.weight", &[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
/// let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
/// assert_eq!(file.tensor("norm.weight").unwrap().ggml_type, GgmlType::F32);
/// ```
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetaValue)>, // insertion order
    tensors: Vec<PendingTensor>,        // insertion order = data order
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty v3 file.
    pub fn new() -> GgufWriter {
        GgufWriter { version: 3, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Sets the version number written in the header (v2 and v3 share the layout; other
    /// values make files the reader must reject).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets metadata `key` to `value`, replacing an earlier value of the same key.
    pub fn set(&mut self, key: &str, value: impl Into<MetaValue>) -> &mut Self {
        let value = value.into();
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Adds a tensor with raw data. `data.len()` must equal the size implied by `dims`
    /// and `ggml_type`, `dims[0]` a multiple of the block size, at most 4 dims, and the
    /// name must be new.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let bad = |reason: String| GgufError::BadTensor { name: name.to_owned(), reason };
        if dims.len() > super::MAX_DIMS as usize {
            return Err(bad(format!("{} dims, at most {}", dims.len(), super::MAX_DIMS)));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("duplicate tensor name".to_owned()));
        }
        let block = ggml_type.block_size() as u64;
        if dims.first().copied().unwrap_or(1) % block != 0 {
            return Err(bad(format!("first dim is not a multiple of the block size {block}")));
        }
        let expected = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).and_then(|n| ggml_type.bytes_for(n));
        if expected != Some(data.len() as u64) {
            return Err(bad(format!(
                "{} data bytes given, dims {dims:?} of {} need {expected:?}",
                data.len(),
                ggml_type.name()
            )));
        }
        self.tensors.push(PendingTensor { name: name.to_owned(), dims: dims.to_vec(), ggml_type, data });
        Ok(self)
    }

    /// Adds an F32 tensor from values (`values.len()` = product of `dims`).
    pub fn add_f32_tensor(&mut self, name: &str, dims: &[u64], values: &[f32]) -> Result<&mut Self, GgufError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, data)
    }

    /// The alignment the layout uses: a valid `general.alignment`, else 32.
    fn alignment(&self) -> u64 {
        let set = self.metadata.iter().find(|(k, _)| k == "general.alignment");
        let value = match set.map(|(_, v)| v) {
            Some(MetaValue::U8(a)) => u64::from(*a),
            Some(MetaValue::U16(a)) => u64::from(*a),
            Some(MetaValue::U32(a)) => u64::from(*a),
            Some(MetaValue::U64(a)) => *a,
            _ => DEFAULT_ALIGNMENT,
        };
        if value.is_power_of_two() && value <= u64::from(u32::MAX) {
            value
        } else {
            DEFAULT_ALIGNMENT
        }
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        put_u32(&mut out, self.version);
        put_u64(&mut out, self.tensors.len() as u64);
        put_u64(&mut out, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            put_u32(&mut out, value.type_id());
            put_value(&mut out, value);
        }
        // Offsets relative to the data section, each aligned.
        let mut offsets = Vec::with_capacity(self.tensors.len()); // [n_tensors]
        let mut next = 0usize;
        for t in &self.tensors {
            offsets.push(next);
            next = (next + t.data.len()).next_multiple_of(alignment);
        }
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            put_u32(&mut out, t.ggml_type.id());
            put_u64(&mut out, offset as u64);
        }
        if self.tensors.is_empty() {
            return out;
        }
        let data_start = out.len().next_multiple_of(alignment);
        out.resize(data_start, 0);
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + offset, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// The value's bytes, without its type id.
fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => put_array(out, a),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// Element type, count, elements.
fn put_array(out: &mut Vec<u8>, array: &MetaArray) {
    put_u32(out, array.elem_type_id());
    put_u64(out, array.len() as u64);
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match array {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => le!(v),
        MetaArray::U16(v) => le!(v),
        MetaArray::I16(v) => le!(v),
        MetaArray::U32(v) => le!(v),
        MetaArray::I32(v) => le!(v),
        MetaArray::F32(v) => le!(v),
        MetaArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetaArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        MetaArray::U64(v) => le!(v),
        MetaArray::I64(v) => le!(v),
        MetaArray::F64(v) => le!(v),
    }
}
