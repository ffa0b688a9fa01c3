//! Writer → reader round trips: every metadata value and array type, nested arrays,
//! tensors of several ggml types and alignments, versions 2 and 3, and `open` from disk.

use pagekv_model::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetaArray, MetaValue};
use rand::{Rng, SeedableRng};

/// One value of every scalar type and one array of every element type, with values at
/// the edges of each type.
fn every_value() -> Vec<(String, MetaValue)> {
    let scalars = vec![
        MetaValue::U8(u8::MAX),
        MetaValue::I8(i8::MIN),
        MetaValue::U16(u16::MAX),
        MetaValue::I16(i16::MIN),
        MetaValue::U32(u32::MAX),
        MetaValue::I32(i32::MIN),
        MetaValue::F32(-1.5e-7),
        MetaValue::Bool(true),
        MetaValue::Bool(false),
        MetaValue::String("héllo ✓ \u{0} end".into()),
        MetaValue::String(String::new()),
        MetaValue::U64(u64::MAX),
        MetaValue::I64(i64::MIN),
        MetaValue::F64(std::f64::consts::PI),
    ];
    let arrays = vec![
        MetaArray::U8(vec![0, 1, 255]),
        MetaArray::I8(vec![-128, 0, 127]),
        MetaArray::U16(vec![0, 65535]),
        MetaArray::I16(vec![-32768, 32767]),
        MetaArray::U32(vec![7, u32::MAX]),
        MetaArray::I32(vec![-1, i32::MAX]),
        MetaArray::F32(vec![0.25, f32::MAX, -0.0]),
        MetaArray::Bool(vec![true, false, true]),
        MetaArray::String(vec!["a".into(), String::new(), "Ġthe".into()]),
        MetaArray::U64(vec![u64::MAX, 0]),
        MetaArray::I64(vec![i64::MIN, 1]),
        MetaArray::F64(vec![1e300, -2.5]),
        MetaArray::U8(vec![]),
        MetaArray::String(vec![]),
        MetaArray::Array(vec![
            MetaArray::I32(vec![1, 2]),
            MetaArray::String(vec!["x".into()]),
            MetaArray::Array(vec![MetaArray::Array(vec![MetaArray::F64(vec![0.5])])]),
        ]),
    ];
    let mut out = Vec::new();
    for (i, v) in scalars.into_iter().enumerate() {
        out.push((format!("test.scalar.{i}.{}", v.type_name()), v));
    }
    for (i, a) in arrays.into_iter().enumerate() {
        out.push((format!("test.array.{i}.{}", a.elem_type_name()), MetaValue::Array(a)));
    }
    out
}

#[test]
fn every_value_and_array_type_round_trips_in_order() {
    let values = every_value();
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.set(k, v.clone());
    }
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.version(), 3);
    let read: Vec<(String, MetaValue)> = file.metadata().iter().map(|(k, v)| (k.to_owned(), v.clone())).collect();
    // PartialEq on f32/f64 is fine here: no NaNs above.
    assert_eq!(read, values);
    assert!(file.tensors().is_empty());
}

#[test]
fn typed_getters_on_a_written_file() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama")
        .set("llama.block_count", 30u32)
        .set("llama.context_length", 8192u64)
        .set("llama.rope.freq_base", 10000.0f32)
        .set("tokenizer.ggml.add_bos_token", true)
        .set("tokenizer.ggml.tokens", vec!["<s>".to_string(), "a".to_string()])
        .set("tokenizer.ggml.token_type", vec![3i32, 1])
        .set("tokenizer.ggml.scores", vec![0.0f32, -1.0]);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let m = file.metadata();
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.get_u32("llama.context_length").unwrap(), 8192);
    assert_eq!(m.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(m.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert!(m.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(m.get_str_array("tokenizer.ggml.tokens").unwrap(), ["<s>", "a"]);
    assert_eq!(m.get_i32_array("tokenizer.ggml.token_type").unwrap(), [3, 1]);
    assert_eq!(m.get_f32_array("tokenizer.ggml.scores").unwrap(), [0.0, -1.0]);
    match m.get_str("llama.block_count") {
        Err(GgufError::WrongType { key, expected, found }) => {
            assert_eq!((key.as_str(), expected, found), ("llama.block_count", "string", "u32"));
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    let err = m.get_u32("llama.missing").unwrap_err();
    assert!(err.to_string().contains("llama.missing"), "{err}");
}

/// Random bytes of the exact size for `ty` and `dims`.
fn random_tensor(rng: &mut impl Rng, dims: &[u64], ty: GgmlType) -> Vec<u8> {
    let n: u64 = dims.iter().product();
    let len = ty.bytes_for(n).unwrap() as usize;
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn tensors_of_many_types_round_trip_at_several_alignments() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6767_7566);
    for alignment in [None, Some(1u32), Some(8), Some(64), Some(4096)] {
        let mut w = GgufWriter::new();
        w.set("general.architecture", "test");
        if let Some(a) = alignment {
            w.set("general.alignment", a);
        }
        let specs: Vec<(String, Vec<u64>, GgmlType)> = GgmlType::ALL
            .iter()
            .enumerate()
            .map(|(i, &ty)| {
                let bs = ty.block_size() as u64;
                // 1 to 4 dims; dims[0] a multiple of the block size.
                let dims = match i % 4 {
                    0 => vec![bs * 2],
                    1 => vec![bs, 3],
                    2 => vec![bs, 1, 2],
                    _ => vec![bs * 3, 2, 1, 2],
                };
                (format!("t{i}.{}", ty.name()), dims, ty)
            })
            .chain([("empty".to_string(), vec![0, 5], GgmlType::F32)])
            .collect();
        let mut expected = Vec::new();
        for (name, dims, ty) in &specs {
            let data = random_tensor(&mut rng, dims, *ty);
            w.add_tensor(name, dims, *ty, data.clone()).unwrap();
            expected.push(data);
        }
        let bytes = w.to_bytes();
        let file = GgufFile::from_bytes(bytes).unwrap();
        let align = u64::from(alignment.unwrap_or(32));
        assert_eq!(file.alignment(), align);
        assert_eq!(file.data_start() % align, 0);
        assert_eq!(file.tensors().len(), specs.len());
        for ((info, (name, dims, ty)), data) in file.tensors().iter().zip(&specs).zip(&expected) {
            assert_eq!(&info.name, name);
            assert_eq!(&info.dims, dims);
            assert_eq!(info.ggml_type, *ty);
            assert_eq!(info.n_bytes, data.len() as u64);
            assert_eq!((info.offset - file.data_start()) % align, 0, "{name}");
            assert_eq!(file.tensor_data(info), &data[..], "{name}");
            assert_eq!(file.tensor(name), Some(info));
        }
        assert!(file.tensor("nope").is_none());
    }
}

#[test]
fn f32_tensor_helper_and_element_count() {
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let mut w = GgufWriter::new();
    w.add_f32_tensor("w", &[4, 3], &values).unwrap();
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let info = file.tensor("w").unwrap();
    assert_eq!(info.n_elements(), 12);
    let back: Vec<f32> =
        file.tensor_data(info).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(back, values);
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let mut w = GgufWriter::new();
    let wrong_len = w.add_tensor("a", &[4], GgmlType::F32, vec![0; 15]);
    assert!(matches!(wrong_len, Err(GgufError::BadTensor { name, .. }) if name == "a"));
    let not_blocks = w.add_tensor("q", &[16], GgmlType::Q8_0, vec![0; 17]);
    assert!(not_blocks.is_err());
    let five_dims = w.add_tensor("d", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]);
    assert!(five_dims.is_err());
    w.add_tensor("a", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    assert!(w.add_tensor("a", &[1], GgmlType::F32, vec![0; 4]).is_err());
}

#[test]
fn version_2_reads_like_version_3_and_others_are_rejected() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").set("k", vec![1u64, 2]);
    w.add_f32_tensor("x", &[2], &[1.0, 2.0]).unwrap();
    w.version(2);
    let v2 = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(v2.version(), 2);
    assert_eq!(v2.metadata().get_u32("k").ok(), None); // an array, not an integer
    assert_eq!(v2.tensor_data(&v2.tensors()[0]), &[0, 0, 128, 63, 0, 0, 0, 64]);
    for bad in [0u32, 1, 4, 0x0300_0000] {
        w.version(bad);
        match GgufFile::from_bytes(w.to_bytes()) {
            Err(GgufError::UnsupportedVersion(v)) => assert_eq!(v, bad),
            other => panic!("version {bad}: expected UnsupportedVersion, got {other:?}"),
        }
    }
}

#[test]
fn open_reads_a_file_from_disk_and_names_a_missing_one() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama");
    w.add_f32_tensor("x", &[3], &[1.0, -1.0, 0.5]).unwrap();
    let path = std::env::temp_dir().join(format!("pagekv-gguf-open-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let file = GgufFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    let file = file.unwrap();
    assert_eq!(file.metadata().architecture().unwrap(), "llama");
    assert_eq!(file.tensor_data(file.tensor("x").unwrap()).len(), 12);

    // An empty file maps (or fails to) without panicking, and is not a GGUF file.
    std::fs::write(&path, b"").unwrap();
    let empty = GgufFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(empty, Err(GgufError::Truncated { .. } | GgufError::Io { .. })), "{empty:?}");

    let missing = GgufFile::open(&path).unwrap_err();
    assert!(matches!(missing, GgufError::Io { .. }));
    assert!(missing.to_string().contains("pagekv-gguf-open"), "{missing}");
}

#[test]
fn tensor_data_is_read_without_the_mapping_and_its_pages_can_be_dropped() {
    // Two tensors, one spanning several 4 KiB pages, from a file on disk (a mapping) and from
    // memory: `read_tensor_data` equals `tensor_data` whole and in pieces, refuses a range past
    // the tensor, and dropping the mapped pages changes no byte.
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama");
    let big: Vec<f32> = (0..5000).map(|i| i as f32 * 0.5 - 7.0).collect();
    w.add_f32_tensor("small", &[3], &[1.0, -1.0, 0.5]).unwrap();
    w.add_f32_tensor("big", &[5000], &big).unwrap();
    let bytes = w.to_bytes();
    let path = std::env::temp_dir().join(format!("pagekv-gguf-pread-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let mapped = GgufFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    for file in [mapped.unwrap(), GgufFile::from_bytes(bytes).unwrap()] {
        for name in ["small", "big"] {
            let info = file.tensor(name).unwrap();
            let want = file.tensor_data(info).to_vec();
            let mut whole = vec![0u8; want.len()];
            file.read_tensor_data(info, 0, &mut whole).unwrap();
            assert_eq!(whole, want, "{name}");
            let mut tail = vec![0u8; want.len() - 5];
            file.read_tensor_data(info, 5, &mut tail).unwrap();
            assert_eq!(tail, want[5..], "{name} from byte 5");
            let err = file.read_tensor_data(info, 1, &mut whole).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{name}: {err}");
            file.release_tensor_pages(info);
            assert_eq!(file.tensor_data(info), want, "{name} after dropping its pages");
        }
    }
}

#[test]
fn setting_a_key_twice_replaces_it() {
    let mut w = GgufWriter::new();
    w.set("a", 1u32).set("b", 2u32).set("a", "now a string");
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let keys: Vec<&str> = file.metadata().iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(file.metadata().get_str("a").unwrap(), "now a string");
}
