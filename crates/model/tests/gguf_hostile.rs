//! Truncated, corrupt and hostile GGUF files: each must be an `Err` that names what is
//! wrong — never a panic, an overflow or a huge allocation. Crafted headers are built with
//! `Raw`, a byte-level builder that can write anything, valid or not.

use pagekv_model::gguf::{
    GgmlType, GgufError, GgufFile, GgufWriter, MetaArray, MetaValue, MAX_ARRAY_LEN, MAX_STRING_LEN,
};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts this thread's allocations, so a test can bound what parsing a file allocates:
/// the largest single request and the peak of live bytes.
struct Tracking;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + size);
        let _ = PEAK.try_with(|p| p.set(p.get().max(live.get())));
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    });
}

fn note_free(size: usize) {
    // Saturating: a block may have been allocated by another thread.
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size)));
}

// SAFETY: forwards every call to `System` unchanged; the bookkeeping only touches
// const-initialized thread-locals, which never allocate.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        note_free(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            note_free(layout.size());
            note_alloc(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Parses `bytes` and checks what it allocated against the input size `n`: no single
/// request above 8n + 4 KiB, no more than 16n + 64 KiB live at once (parsed metadata
/// included). Bounds that hold for any input show no size comes from the file unchecked.
fn parse_with_bounded_allocation(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    let n = bytes.len();
    let start = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(start));
    LARGEST.with(|l| l.set(0));
    let result = GgufFile::from_bytes(bytes);
    let largest = LARGEST.with(|l| l.get());
    let peak = PEAK.with(|p| p.get()) - start;
    assert!(largest <= 8 * n + 4096, "largest allocation {largest} for a {n}-byte input");
    assert!(peak <= 16 * n + 65536, "peak {peak} bytes for a {n}-byte input");
    result
}

/// Little-endian byte builder for hand-made (possibly invalid) GGUF files.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version 3, and the two counts.
    fn header(n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default().bytes(b"GGUF").u32(3).u64(n_tensors).u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A metadata entry `key` of type u32.
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info.
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`, then `n` data bytes.
    fn data(mut self, align: usize, n: usize) -> Raw {
        let start = self.0.len().next_multiple_of(align);
        self.0.resize(start + n, 0x5a);
        self
    }
    fn parse(self) -> Result<GgufFile, GgufError> {
        parse_with_bounded_allocation(self.0)
    }
}

/// A small valid file with several value types, arrays and three tensors.
fn small_valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama")
        .set("llama.block_count", 2u32)
        .set("flag", true)
        .set("eps", 1e-5f32)
        .set("big", -7i64)
        .set("tokens", vec!["<s>".to_string(), "ab".to_string()])
        .set("types", vec![1i32, 3])
        .set("nested", MetaArray::Array(vec![MetaArray::U8(vec![1, 2]), MetaArray::Bool(vec![true])]));
    w.add_f32_tensor("a", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    w.add_tensor("q", &[32], GgmlType::Q8_0, (0..34).collect()).unwrap();
    w.add_f32_tensor("b", &[1], &[9.0]).unwrap();
    w.to_bytes()
}

#[track_caller]
fn expect_err(r: Result<GgufFile, GgufError>) -> GgufError {
    match r {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => e,
    }
}

#[test]
fn the_small_file_is_valid() {
    let f = GgufFile::from_bytes(small_valid_file()).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.metadata().len(), 8);
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let full = small_valid_file();
    for len in 0..full.len() {
        let err = expect_err(parse_with_bounded_allocation(full[..len].to_vec()));
        // Cut inside the header/metadata/infos: Truncated or a count that no longer fits;
        // cut inside the data: the tensor's range.
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. }
                    | GgufError::TooLarge { .. }
                    | GgufError::BadTensor { .. }
                    | GgufError::BadMagic { .. }
            ),
            "len {len}: {err:?}"
        );
    }
}

#[test]
fn truncation_errors_name_the_item_and_offset() {
    let full = Raw::header(0, 1).kv_u32("my.key", 5).0;
    // Cut inside the u32 value of my.key (starts at 24 + 8 + 6 + 4 = 42).
    let err = expect_err(GgufFile::from_bytes(full[..44].to_vec()));
    match &err {
        GgufError::Truncated { what, offset } => {
            assert!(what.contains("my.key"), "{what}");
            assert_eq!(*offset, 42);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("offset 42"), "{err}");
    // Cut inside the header.
    let err = expect_err(GgufFile::from_bytes(full[..10].to_vec()));
    assert!(matches!(err, GgufError::Truncated { ref what, offset: 8 } if what == "tensor count"));
}

#[test]
fn allocation_tracking_sees_parsing() {
    // The bound checker must notice a parse that allocates: a 10 000-string array.
    let mut w = GgufWriter::new();
    w.set("s", vec!["ab".to_string(); 10_000]);
    let bytes = w.to_bytes();
    let start = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(start));
    let f = GgufFile::from_bytes(bytes).unwrap();
    let peak = PEAK.with(|p| p.get()) - start;
    assert!(peak >= 10_000 * 24, "peak {peak}");
    drop(f);
}

#[test]
fn bad_magic_and_empty_input() {
    assert!(matches!(expect_err(GgufFile::from_bytes(vec![])), GgufError::Truncated { .. }));
    let err = expect_err(Raw::default().bytes(b"GGML").u32(3).u64(0).u64(0).parse());
    assert!(matches!(err, GgufError::BadMagic { ref found } if found == b"GGML"));
}

#[test]
fn huge_string_lengths_are_rejected_before_allocating() {
    // Key length past the cap.
    let err = expect_err(Raw::header(0, 1).u64(u64::MAX).bytes(&[0; 32]).parse());
    assert!(matches!(err, GgufError::TooLarge { len: u64::MAX, cap, .. } if cap == MAX_STRING_LEN));
    let err = expect_err(Raw::header(0, 1).u64(MAX_STRING_LEN + 1).bytes(&[0; 32]).parse());
    assert!(matches!(err, GgufError::TooLarge { .. }), "{err:?}");
    // Under the cap but past the end of the file.
    let err = expect_err(Raw::header(0, 1).u64(1000).bytes(b"short").parse());
    assert!(matches!(err, GgufError::Truncated { .. }), "{err:?}");
    // A string value of a named key.
    let err = expect_err(Raw::header(0, 1).str("k.name").u32(8).u64(1 << 40).parse());
    match err {
        GgufError::TooLarge { what, .. } => assert!(what.contains("k.name"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn huge_array_lengths_are_rejected() {
    for elem_type in 0..=12u32 {
        // Past the fixed cap.
        let err = expect_err(Raw::header(0, 1).str("arr").u32(9).u32(elem_type).u64(u64::MAX).parse());
        assert!(matches!(err, GgufError::TooLarge { .. }), "type {elem_type}: {err:?}");
        // Under the cap, but more than the bytes left could hold.
        let err =
            expect_err(Raw::header(0, 1).str("arr").u32(9).u32(elem_type).u64(MAX_ARRAY_LEN).bytes(&[0; 64]).parse());
        match err {
            GgufError::TooLarge { what, len, cap } => {
                assert!(what.contains("'arr'"), "{what}");
                assert_eq!(len, MAX_ARRAY_LEN);
                assert!(cap <= 64, "cap {cap}");
            }
            other => panic!("type {elem_type}: {other:?}"),
        }
    }
}

#[test]
fn huge_tensor_and_key_counts_are_rejected() {
    for (n_tensors, n_kv) in [(u64::MAX, 0), (1 << 20, 0), (0, u64::MAX), (0, 1 << 30), (3, 0)] {
        let err = expect_err(Raw::header(n_tensors, n_kv).bytes(&[0; 40]).parse());
        assert!(matches!(err, GgufError::TooLarge { .. }), "{n_tensors} {n_kv}: {err:?}");
    }
}

#[test]
fn unknown_metadata_value_types() {
    let err = expect_err(Raw::header(0, 1).str("k").u32(13).u32(0).parse());
    assert!(matches!(err, GgufError::UnknownValueType { id: 13, offset: 33, ref what } if what.contains("'k'")));
    let err = expect_err(Raw::header(0, 1).str("k").u32(9).u32(u32::MAX).u64(0).parse());
    assert!(matches!(err, GgufError::UnknownValueType { id: u32::MAX, .. }), "{err:?}");
}

#[test]
fn array_nesting_depth_is_capped() {
    // Four levels read; the fifth is refused.
    let nest = |levels: usize| {
        let mut r = Raw::header(0, 1).str("deep").u32(9);
        for _ in 0..levels - 1 {
            r = r.u32(9).u64(1);
        }
        r.u32(0).u64(1).bytes(&[7]).parse()
    };
    let ok = nest(4).unwrap();
    assert!(matches!(ok.metadata().get("deep"), Some(MetaValue::Array(MetaArray::Array(_)))));
    let err = expect_err(nest(5));
    assert!(matches!(err, GgufError::TooLarge { .. }), "{err:?}");
    // Hostile: millions of declared levels in a small file stop at the cap, no recursion blowup.
    let mut r = Raw::header(0, 1).str("deep").u32(9);
    for _ in 0..100_000 {
        r = r.u32(9).u64(1);
    }
    assert!(matches!(expect_err(r.parse()), GgufError::TooLarge { .. }));
}

#[test]
fn invalid_utf8_and_bad_bools() {
    let err = expect_err(Raw::header(0, 1).u64(2).bytes(&[0xff, 0xfe]).u32(4).u32(0).parse());
    assert!(matches!(err, GgufError::InvalidUtf8 { offset: 24, .. }), "{err:?}");
    let err = expect_err(Raw::header(0, 1).str("s").u32(8).u64(1).bytes(&[0x80]).parse());
    assert!(matches!(err, GgufError::InvalidUtf8 { ref what, .. } if what.contains("'s'")));
    let err = expect_err(Raw::header(1, 0).u64(1).bytes(&[0xc0]).u32(1).u64(1).u32(0).u64(0).parse());
    assert!(matches!(err, GgufError::InvalidUtf8 { ref what, .. } if what.contains("tensor 0")));
    let err = expect_err(Raw::header(0, 1).str("b").u32(7).bytes(&[2]).parse());
    assert!(matches!(err, GgufError::BadValue { ref what, .. } if what.contains("'b'")));
}

#[test]
fn duplicate_keys_and_tensor_names() {
    let err = expect_err(Raw::header(0, 2).kv_u32("k", 1).kv_u32("k", 2).parse());
    assert!(matches!(err, GgufError::BadValue { ref reason, .. } if reason.contains("duplicate")));
    let err = expect_err(Raw::header(2, 0).tensor("t", &[1], 0, 0).tensor("t", &[1], 0, 32).data(32, 64).parse());
    assert!(matches!(err, GgufError::BadTensor { ref name, .. } if name == "t"));
}

#[test]
fn bad_alignment_values() {
    for value in [0u32, 3, 48, 1000] {
        let err = expect_err(Raw::header(0, 1).kv_u32("general.alignment", value).parse());
        assert!(matches!(err, GgufError::BadAlignment(ref v) if *v == value.to_string()), "{err:?}");
    }
    let negative = Raw::header(0, 1).str("general.alignment").u32(5).bytes(&(-32i32).to_le_bytes());
    assert!(matches!(expect_err(negative.parse()), GgufError::BadAlignment(_)));
    let too_big = Raw::header(0, 1).str("general.alignment").u32(10).u64(1 << 40);
    assert!(matches!(expect_err(too_big.parse()), GgufError::BadAlignment(_)));
    let string = Raw::header(0, 1).str("general.alignment").u32(8).str("32");
    assert!(matches!(
        expect_err(string.parse()),
        GgufError::WrongType { ref key, .. } if key == "general.alignment"
    ));
    // A valid, unusual alignment is honoured.
    let ok = Raw::header(1, 1).kv_u32("general.alignment", 8).tensor("t", &[2], 0, 8).data(8, 16).parse().unwrap();
    assert_eq!(ok.alignment(), 8);
    assert_eq!(ok.tensors()[0].offset, ok.data_start() + 8);
}

#[test]
fn tensor_data_out_of_range_or_misaligned() {
    // Offsets past the end, near u64::MAX (overflow), and data running off the end.
    for offset in [1 << 20, 1 << 63, !31u64, u64::MAX] {
        let err = expect_err(Raw::header(1, 0).tensor("w", &[4], 0, offset).data(32, 16).parse());
        assert!(matches!(err, GgufError::BadTensor { ref name, .. } if name == "w"), "{err:?}");
    }
    let err = expect_err(Raw::header(1, 0).tensor("w", &[5], 0, 0).data(32, 16).parse());
    assert!(matches!(err, GgufError::BadTensor { ref reason, .. } if reason.contains("past the end")));
    let err = expect_err(Raw::header(1, 0).tensor("w", &[1], 0, 4).data(32, 16).parse());
    assert!(matches!(err, GgufError::BadTensor { ref reason, .. } if reason.contains("multiple")));
    // Exactly at the end is fine, and a tensor with no data section at all is not.
    Raw::header(1, 0).tensor("w", &[4], 0, 0).data(32, 16).parse().unwrap();
    let err = expect_err(Raw::header(1, 0).tensor("w", &[4], 0, 0).parse());
    assert!(matches!(err, GgufError::BadTensor { .. }));
}

#[test]
fn overlapping_tensors_are_allowed() {
    let f = Raw::header(2, 0).tensor("a", &[4], 0, 0).tensor("b", &[2, 2], 0, 0).data(32, 16).parse().unwrap();
    let (a, b) = (&f.tensors()[0], &f.tensors()[1]);
    assert_eq!(a.offset, b.offset);
    assert_eq!(f.tensor_data(a), f.tensor_data(b));
}

#[test]
fn too_many_dims_overflowing_counts_and_block_mismatch() {
    for n_dims in [5u32, 64, u32::MAX] {
        let err = expect_err(Raw::header(1, 0).str("w").u32(n_dims).bytes(&[1; 64]).parse());
        assert!(matches!(err, GgufError::TooLarge { ref what, .. } if what.contains("'w'")), "{err:?}");
    }
    // Element count overflows u64.
    let err = expect_err(Raw::header(1, 0).tensor("w", &[1 << 32, 1 << 32, 2], 0, 0).parse());
    assert!(matches!(err, GgufError::BadTensor { ref reason, .. } if reason.contains("overflows")));
    // Element count fits, byte count does not (F32: 4 bytes each).
    let err = expect_err(Raw::header(1, 0).tensor("w", &[1 << 62], 0, 0).parse());
    assert!(matches!(err, GgufError::BadTensor { ref reason, .. } if reason.contains("overflows")));
    // Huge but non-overflowing: out of range.
    let err = expect_err(Raw::header(1, 0).tensor("w", &[1 << 40, 1 << 10], 1, 0).data(32, 8).parse());
    assert!(matches!(err, GgufError::BadTensor { .. }));
    // A scalar (no dims) of a quantized type: one element is not a whole block. Found by
    // the fuzzer (the message indexed dims[0]).
    let err = expect_err(Raw::header(1, 0).tensor("s", &[], 2, 0).data(32, 64).parse());
    assert!(matches!(err, GgufError::BadTensor { ref reason, .. } if reason.contains("first dim 1")));
    // A scalar F32 is one element.
    let f = Raw::header(1, 0).tensor("s", &[], 0, 0).data(32, 4).parse().unwrap();
    assert_eq!((f.tensors()[0].n_elements(), f.tensors()[0].n_bytes), (1, 4));
    // Q4_1 needs whole blocks of 32 along dims[0].
    let err = expect_err(Raw::header(1, 0).tensor("w", &[48, 2], 3, 0).data(32, 1024).parse());
    assert!(matches!(err, GgufError::BadTensor { ref reason, .. } if reason.contains("block size 32")));
}

#[test]
fn unknown_tensor_type_ids_name_the_id() {
    for id in [4u32, 5, 31, 40, 1000, u32::MAX] {
        let err = expect_err(Raw::header(1, 0).tensor("w", &[32], id, 0).data(32, 256).parse());
        match &err {
            GgufError::BadTensor { name, reason } => {
                assert_eq!(name, "w");
                assert!(reason.contains(&format!("type id {id}")), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Everything a reader of a parsed file can touch, to show it holds up after a mutation.
fn touch_everything(f: &GgufFile) {
    let m = f.metadata();
    for (k, v) in m.iter() {
        let _ = (m.get_str(k), m.get_u32(k), m.get_u64(k), m.get_f32(k), m.get_bool(k));
        let _ = (m.get_str_array(k), m.get_i32_array(k), m.get_f32_array(k));
        let _ = v.to_string();
    }
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert!(t.offset + t.n_bytes <= f.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_byte_mutations_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = small_valid_file();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(f) = parse_with_bounded_allocation(bytes) {
            touch_everything(&f);
        }
    }

    #[test]
    fn random_length_fields_never_panic(
        field in 0usize..64,
        value in prop_oneof![Just(u64::MAX), Just(1u64 << 63), Just(1u64 << 32), any::<u64>(), 0u64..300],
    ) {
        // Overwrite an 8-byte window at an 4-byte-aligned offset in the header/metadata area.
        let mut bytes = small_valid_file();
        let at = (field * 4).min(bytes.len() - 8);
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        if let Ok(f) = parse_with_bounded_allocation(bytes) {
            touch_everything(&f);
        }
    }
}
