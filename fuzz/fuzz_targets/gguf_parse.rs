//! Fuzz target: `GgufFile::from_bytes` on arbitrary bytes must return (Ok or Err) without
//! panicking, aborting or allocating without bound; for files it accepts, every metadata
//! getter and every tensor's data slice must work too.
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../crates/model/src/gguf/mod.rs"]
mod gguf;

use gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let m = file.metadata();
    for (key, value) in m.iter() {
        let _ = (m.get_str(key), m.get_u32(key), m.get_u64(key), m.get_f32(key));
        let _ = (m.get_bool(key), m.get_str_array(key), m.get_i32_array(key));
        let _ = (m.get_f32_array(key), value.to_string());
    }
    for info in file.tensors() {
        let bytes = file.tensor_data(info);
        assert_eq!(bytes.len() as u64, info.n_bytes);
        assert_eq!(file.tensor(&info.name).map(|t| t.offset), Some(info.offset));
    }
});
