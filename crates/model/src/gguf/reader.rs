//! The GGUF parser and `GgufFile`. Read top to bottom, `parse` is the format's layout:
//!
//! ```text
//! magic "GGUF" | version u32 (2 or 3) | n_tensors u64 | n_kv u64
//! n_kv ×      { key: string, value_type u32, value }
//! n_tensors × { name: string, n_dims u32, dims u64[n_dims], ggml_type u32, offset u64 }
//! padding to `general.alignment` (default 32)
//! tensor data: each tensor at data_start + offset (offset a multiple of the alignment)
//!
//! string = len u64 + UTF-8 bytes;  array value = elem_type u32 + count u64 + elements
//! ```
//!
//! All integers are little-endian. Every length is checked against a cap and against the
//! bytes left *before* anything is allocated for it, so a hostile file costs at most a
//! small multiple of its own size in memory. Tensor data is not touched at open: only its
//! range is checked, and `tensor_data` hands out slices of the mapping.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::metadata::{value_type, value_type_name, MetaArray, MetaValue, Metadata};
use super::{
    GgmlType, GgufError, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_STRING_LEN, MAX_TENSORS,
};

/// The 4 bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Fewest bytes a metadata entry can take: key length u64 + value type u32 + 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes a tensor info can take: name length u64 + n_dims u32 + type u32 + offset u64.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor's description. `offset` and `n_bytes` were checked against the file at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// GGUF order: `dims[0]` is the fastest-varying axis (the columns of a matrix).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute file offset of the first data byte.
    pub offset: u64,
    /// Data size: element count / block size × type size.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`; 1 for a scalar with no dims).
    pub fn n_elements(&self) -> u64 {
        // Checked at open not to overflow.
        self.dims.iter().product()
    }
}

/// The bytes behind a `GgufFile`: a read-only mapping (with the open file, for reading tensor
/// data without touching the mapping), or an owned buffer for tests/fuzzing.
enum Bytes {
    Mapped(Mmap, File),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m, _) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed metadata and tensor infos, tensor data left in the mapping.
pub struct GgufFile {
    bytes: Bytes,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,        // in file order
    by_name: HashMap<String, usize>, // tensor name → index in `tensors`
    alignment: u64,
    data_start: u64, // absolute offset of the tensor data section
}

// A loaded model is shared between threads (engine, server) behind an `Arc`.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<GgufFile>();
};

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("len", &self.bytes.as_slice().len())
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses its header, metadata and tensor infos.
    ///
    /// The mapping assumes nobody truncates or rewrites the file while it is open (the
    /// usual contract of mmap-based model loaders).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this value; the file is a model
        // the caller asked for, not expected to change underneath us (see the doc above).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        GgufFile::parse(Bytes::Mapped(mmap, file))
    }

    /// Parses an in-memory file with the same parser as `open` (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<GgufFile, GgufError> {
        let parsed = parse(bytes.as_slice())?;
        Ok(GgufFile {
            bytes,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name: parsed.by_name,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset where the tensor data section starts.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// File size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// True for a zero-length buffer (never the case for a parsed file).
    pub fn is_empty(&self) -> bool {
        self.bytes.as_slice().is_empty()
    }

    /// Copies `dst.len()` bytes of tensor `info`'s data, from byte `at` of it, into `dst`.
    /// A mapped file is read with `pread`, so the mapping's pages are never faulted in: the
    /// copy is the only resident memory the data costs (the page cache is not the process's).
    pub fn read_tensor_data(&self, info: &TensorInfo, at: u64, dst: &mut [u8]) -> std::io::Result<()> {
        let end = at.checked_add(dst.len() as u64).filter(|&e| e <= info.n_bytes);
        if end.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("tensor '{}': {} bytes from {at} exceed its {} bytes", info.name, dst.len(), info.n_bytes),
            ));
        }
        #[cfg(unix)]
        if let Bytes::Mapped(_, file) = &self.bytes {
            use std::os::unix::fs::FileExt;
            return file.read_exact_at(dst, info.offset + at);
        }
        let at = at as usize;
        dst.copy_from_slice(&self.tensor_data(info)[at..at + dst.len()]);
        Ok(())
    }

    /// Drops the mapping's resident pages that lie wholly inside tensor `info`'s data (a hint:
    /// the data stays readable, from the page cache, on the next touch). A loader that copied
    /// the tensor elsewhere calls this so the process does not hold the bytes twice.
    pub fn release_tensor_pages(&self, info: &TensorInfo) {
        #[cfg(unix)]
        if let Bytes::Mapped(map, _) = &self.bytes {
            const PAGE: u64 = 4096;
            let (start, end) = (info.offset.next_multiple_of(PAGE), (info.offset + info.n_bytes) / PAGE * PAGE);
            if end > start {
                // SAFETY: a read-only, file-backed mapping: dropping its pages loses nothing
                // (they are read back from the file), and no reference into them is
                // invalidated (the bytes do not change).
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start as usize,
                        (end - start) as usize,
                    )
                };
            }
        }
    }

    /// The raw bytes of a tensor: `n_bytes` bytes at `offset`.
    ///
    /// Infos returned by this file were range-checked at open, so this cannot fail for
    /// them. Panics if `info` was built by hand with a range outside the file.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let range = usize::try_from(info.offset)
            .ok()
            .zip(usize::try_from(info.n_bytes).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        match range.and_then(|r| self.bytes.as_slice().get(r)) {
            Some(data) => data,
            None => panic!(
                "tensor '{}': range {}+{} is outside this {}-byte GGUF file",
                info.name,
                info.offset,
                info.n_bytes,
                self.len()
            ),
        }
    }
}

/// What `parse` found; the bytes stay with the caller.
struct Parsed {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

/// Walks the file in order; see the module docs for the layout.
fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut r = Cursor { bytes, pos: 0 };

    let magic = r.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic.to_vec() });
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata key count")?;
    // Both counts are bounded by the smallest possible entry before anything is reserved.
    r.check_count("tensor count", n_tensors, MAX_TENSORS, MIN_TENSOR_INFO_BYTES)?;
    r.check_count("metadata key count", n_kv, u64::MAX, MIN_KV_BYTES)?;

    let mut metadata = Metadata::new();
    metadata.reserve(n_kv as usize);
    for i in 0..n_kv {
        let key_offset = r.pos;
        let key = r.string(&format!("key of metadata entry {i}"))?;
        let what = format!("value of key '{key}'");
        let value = r.value(&what, 0)?;
        if !metadata.insert(key, value) {
            return Err(GgufError::BadValue {
                what: format!("metadata entry {i}"),
                offset: key_offset,
                reason: "duplicate key".to_owned(),
            });
        }
    }
    let alignment = alignment_of(&metadata)?;

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        tensors.push(r.tensor_info(i)?);
    }

    // The data section starts at the next multiple of the alignment. A file without
    // tensor data may stop before it; any tensor (even 0 bytes) must lie inside the file.
    let data_start = align_up(r.pos, alignment).ok_or_else(|| GgufError::TooLarge {
        what: "tensor data start".to_owned(),
        len: r.pos,
        cap: u64::MAX - alignment,
    })?;
    let file_len = bytes.len() as u64;
    let mut by_name = HashMap::with_capacity(tensors.len());
    for (i, t) in tensors.iter_mut().enumerate() {
        if by_name.insert(t.name.clone(), i).is_some() {
            return Err(bad_tensor(&t.name, "duplicate tensor name".to_owned()));
        }
        // `t.offset` is still relative to the data section here.
        if t.offset % alignment != 0 {
            return Err(bad_tensor(
                &t.name,
                format!("data offset {} is not a multiple of the alignment {alignment}", t.offset),
            ));
        }
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.offset = start,
            _ => {
                return Err(bad_tensor(
                    &t.name,
                    format!(
                        "data ({} bytes at data offset {} + {}) runs past the end of the \
                         {file_len}-byte file",
                        t.n_bytes, data_start, t.offset
                    ),
                ))
            }
        }
    }

    Ok(Parsed { version, metadata, tensors, by_name, alignment, data_start })
}

/// `general.alignment` if present (any integer type whose value fits), else 32; must be a
/// nonzero power of two no larger than `u32::MAX`.
fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let key = "general.alignment";
    let Some(value) = metadata.get(key) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match metadata.get_u64(key) {
        Ok(a) if a.is_power_of_two() && a <= u64::from(u32::MAX) => Ok(a),
        Ok(_) | Err(GgufError::OutOfRange { .. }) => Err(GgufError::BadAlignment(value.to_string())),
        Err(e) => Err(e),
    }
}

fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment.is_power_of_two());
    Some(pos.checked_add(alignment - 1)? & !(alignment - 1))
}

fn bad_tensor(name: &str, reason: String) -> GgufError {
    GgufError::BadTensor { name: name.to_owned(), reason }
}

/// A read position over the file. Every read checks the bytes left first.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: u64, // always <= bytes.len()
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        debug_assert!(self.pos <= self.bytes.len() as u64);
        self.bytes.len() as u64 - self.pos
    }

    /// The next `n` bytes, or `Truncated` naming `what` and where it starts.
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { what: what.to_owned(), offset: self.pos });
        }
        // Both fit in usize: they are within `bytes`.
        let start = self.pos as usize;
        let out = &self.bytes[start..start + n as usize];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks a declared element count against `cap` and against the bytes left, given
    /// that every element takes at least `min_elem_bytes`. After this, reserving `count`
    /// elements is bounded by the file size.
    fn check_count(&self, what: &str, count: u64, cap: u64, min_elem_bytes: u64) -> Result<(), GgufError> {
        if count > cap {
            return Err(GgufError::TooLarge { what: format!("{what} at offset {}", self.pos), len: count, cap });
        }
        let room = self.remaining() / min_elem_bytes.max(1);
        if count > room {
            return Err(GgufError::TooLarge {
                what: format!(
                    "{what} at offset {} ({} bytes left, at least {min_elem_bytes} per element)",
                    self.pos,
                    self.remaining()
                ),
                len: count,
                cap: room,
            });
        }
        Ok(())
    }

    /// A GGUF string: u64 length (capped at `MAX_STRING_LEN`) + UTF-8 bytes.
    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let start = self.pos;
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::TooLarge { what: format!("{what} at offset {start}"), len, cap: MAX_STRING_LEN });
        }
        let raw = self
            .take(len, what)
            .map_err(|_| GgufError::Truncated { what: format!("{what} ({len} bytes)"), offset: start })?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 { what: what.to_owned(), offset: start }),
        }
    }

    fn value_type(&mut self, what: &str) -> Result<u32, GgufError> {
        let offset = self.pos;
        let id = self.u32(what)?;
        if id > value_type::F64 {
            return Err(GgufError::UnknownValueType { what: what.to_owned(), id, offset });
        }
        Ok(id)
    }

    /// A metadata value: type id, then the value. `depth` counts enclosing arrays.
    fn value(&mut self, what: &str, depth: u32) -> Result<MetaValue, GgufError> {
        let ty = self.value_type(what)?;
        self.value_of_type(ty, what, depth)
    }

    fn value_of_type(&mut self, ty: u32, what: &str, depth: u32) -> Result<MetaValue, GgufError> {
        use value_type as t;
        Ok(match ty {
            t::U8 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            t::I8 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            t::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            t::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            t::U32 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            t::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            t::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            t::BOOL => MetaValue::Bool(self.bool(what)?),
            t::STRING => MetaValue::String(self.string(what)?),
            t::ARRAY => MetaValue::Array(self.meta_array(what, depth)?),
            t::U64 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            t::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            t::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            _ => unreachable!("value_type() admits only ids 0..=12"),
        })
    }

    fn bool(&mut self, what: &str) -> Result<bool, GgufError> {
        let offset = self.pos;
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(GgufError::BadValue {
                what: what.to_owned(),
                offset,
                reason: format!("bool byte is {b}, expected 0 or 1"),
            }),
        }
    }

    /// An array: element type u32, count u64, elements. `depth` counts enclosing arrays.
    fn meta_array(&mut self, what: &str, depth: u32) -> Result<MetaArray, GgufError> {
        let start = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::TooLarge {
                what: format!("{what}: array nesting depth at offset {start}"),
                len: u64::from(depth) + 1,
                cap: u64::from(MAX_ARRAY_DEPTH),
            });
        }
        let elem = self.value_type(what)?;
        let count = self.u64(what)?;
        let min_elem_bytes = match elem {
            value_type::U8 | value_type::I8 | value_type::BOOL => 1,
            value_type::U16 | value_type::I16 => 2,
            value_type::U32 | value_type::I32 | value_type::F32 => 4,
            value_type::STRING => 8,    // its length
            value_type::ARRAY => 4 + 8, // element type + count
            _ => 8,                     // u64, i64, f64
        };
        let elem_what = format!("{what} (array of {})", value_type_name(elem));
        self.check_count(&elem_what, count, MAX_ARRAY_LEN, min_elem_bytes)?;
        let n = count as usize; // <= MAX_ARRAY_LEN and <= bytes left

        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const SIZE: usize = std::mem::size_of::<$t>();
                let raw = self.take(count * SIZE as u64, &elem_what)?;
                MetaArray::$variant(
                    raw.chunks_exact(SIZE).map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of SIZE"))).collect(),
                )
            }};
        }
        use value_type as t;
        Ok(match elem {
            t::U8 => MetaArray::U8(self.take(count, &elem_what)?.to_vec()),
            t::I8 => fixed!(I8, i8),
            t::U16 => fixed!(U16, u16),
            t::I16 => fixed!(I16, i16),
            t::U32 => fixed!(U32, u32),
            t::I32 => fixed!(I32, i32),
            t::F32 => fixed!(F32, f32),
            t::U64 => fixed!(U64, u64),
            t::I64 => fixed!(I64, i64),
            t::F64 => fixed!(F64, f64),
            t::BOOL => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(&elem_what)?);
                }
                MetaArray::Bool(v)
            }
            t::STRING => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(&elem_what)?);
                }
                MetaArray::String(v)
            }
            t::ARRAY => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(&elem_what, depth + 1)?);
                }
                MetaArray::Array(v)
            }
            _ => unreachable!("value_type() admits only ids 0..=12"),
        })
    }

    /// One tensor info. `offset` in the result is still relative to the data section.
    fn tensor_info(&mut self, index: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string(&format!("name of tensor {index}"))?;
        let what = format!("tensor '{name}'");
        let n_dims_offset = self.pos;
        let n_dims = self.u32(&format!("{what} n_dims"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooLarge {
                what: format!("{what} n_dims at offset {n_dims_offset}"),
                len: n_dims.into(),
                cap: MAX_DIMS.into(),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(&format!("{what} dim {d}"))?);
        }
        let type_id = self.u32(&format!("{what} type"))?;
        let offset = self.u64(&format!("{what} data offset"))?;

        let ggml_type =
            GgmlType::from_id(type_id).map_err(|_| bad_tensor(&name, format!("unknown ggml type id {type_id}")))?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad_tensor(&name, format!("element count of dims {dims:?} overflows u64")))?;
        let block = ggml_type.block_size() as u64;
        // A tensor with no dims is a scalar: one element along the (absent) first dim.
        let first_dim = dims.first().copied().unwrap_or(1);
        if first_dim % block != 0 {
            return Err(bad_tensor(
                &name,
                format!("first dim {first_dim} is not a multiple of the {} block size {block}", ggml_type.name()),
            ));
        }
        let n_bytes = ggml_type.bytes_for(n_elements).ok_or_else(|| {
            bad_tensor(&name, format!("size of {n_elements} {} elements overflows u64", ggml_type.name()))
        })?;
        Ok(TensorInfo { name, dims, ggml_type, offset, n_bytes })
    }
}
