//! GGUF metadata: `MetaValue` (one typed value), `MetaArray` (a typed array, possibly
//! nested) and `Metadata` (the ordered key → value map of a file) with typed getters whose
//! errors name the key.
//!
//! Getters convert where no information is lost: `get_u32` takes any integer type whose
//! value fits, `get_f32` takes f32, f64 and integers, the array getters convert element-wise.

use std::collections::HashMap;
use std::fmt;

use super::GgufError;

/// One metadata value. Variant order follows the GGUF value type ids 0..=12.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed metadata array. Arrays of arrays are allowed up to `MAX_ARRAY_DEPTH` levels.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Nested arrays; each element may have its own element type.
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// GGUF value type ids (the `u32` before every value and array element type).
pub(crate) mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Name of a value type id, for messages.
pub(crate) fn value_type_name(id: u32) -> &'static str {
    match id {
        value_type::U8 => "u8",
        value_type::I8 => "i8",
        value_type::U16 => "u16",
        value_type::I16 => "i16",
        value_type::U32 => "u32",
        value_type::I32 => "i32",
        value_type::F32 => "f32",
        value_type::BOOL => "bool",
        value_type::STRING => "string",
        value_type::ARRAY => "array",
        value_type::U64 => "u64",
        value_type::I64 => "i64",
        value_type::F64 => "f64",
        _ => "unknown",
    }
}

impl MetaValue {
    /// The GGUF value type id of this value.
    pub fn type_id(&self) -> u32 {
        use value_type as t;
        match self {
            MetaValue::U8(_) => t::U8,
            MetaValue::I8(_) => t::I8,
            MetaValue::U16(_) => t::U16,
            MetaValue::I16(_) => t::I16,
            MetaValue::U32(_) => t::U32,
            MetaValue::I32(_) => t::I32,
            MetaValue::F32(_) => t::F32,
            MetaValue::Bool(_) => t::BOOL,
            MetaValue::String(_) => t::STRING,
            MetaValue::Array(_) => t::ARRAY,
            MetaValue::U64(_) => t::U64,
            MetaValue::I64(_) => t::I64,
            MetaValue::F64(_) => t::F64,
        }
    }

    /// `"u32"`, `"string"`, `"array"`, … for messages.
    pub fn type_name(&self) -> &'static str {
        value_type_name(self.type_id())
    }

    /// The value as an `i128` if it is an integer of any width.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl MetaArray {
    /// The GGUF value type id of the elements.
    pub fn elem_type_id(&self) -> u32 {
        use value_type as t;
        match self {
            MetaArray::U8(_) => t::U8,
            MetaArray::I8(_) => t::I8,
            MetaArray::U16(_) => t::U16,
            MetaArray::I16(_) => t::I16,
            MetaArray::U32(_) => t::U32,
            MetaArray::I32(_) => t::I32,
            MetaArray::F32(_) => t::F32,
            MetaArray::Bool(_) => t::BOOL,
            MetaArray::String(_) => t::STRING,
            MetaArray::Array(_) => t::ARRAY,
            MetaArray::U64(_) => t::U64,
            MetaArray::I64(_) => t::I64,
            MetaArray::F64(_) => t::F64,
        }
    }

    /// Element type name for messages: `"u8"`, `"string"`, …
    pub fn elem_type_name(&self) -> &'static str {
        value_type_name(self.elem_type_id())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Integer elements widened to `i128`, or `None` for non-integer arrays.
    fn integers(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            MetaArray::U8(v) => widen(v),
            MetaArray::I8(v) => widen(v),
            MetaArray::U16(v) => widen(v),
            MetaArray::I16(v) => widen(v),
            MetaArray::U32(v) => widen(v),
            MetaArray::I32(v) => widen(v),
            MetaArray::U64(v) => widen(v),
            MetaArray::I64(v) => widen(v),
            _ => return None,
        })
    }
}

impl fmt::Display for MetaValue {
    /// Scalars print as themselves, strings quoted, arrays as a summary
    /// (`[string; 49152]`) so printing a tokenizer's vocabulary stays one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(v) => write!(f, "{v:?}"),
            MetaValue::Array(a) => write!(f, "[{}; {}]", a.elem_type_name(), a.len()),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F64(v) => write!(f, "{v}"),
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for MetaValue {
            fn from(x: $t) -> Self { MetaValue::$v(x) }
        }
        impl From<Vec<$t>> for MetaArray {
            fn from(x: Vec<$t>) -> Self { MetaArray::$v(x) }
        }
        impl From<Vec<$t>> for MetaValue {
            fn from(x: Vec<$t>) -> Self { MetaValue::Array(MetaArray::$v(x)) }
        }
    )*};
}
from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
             bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for MetaValue {
    fn from(x: &str) -> Self {
        MetaValue::String(x.to_owned())
    }
}

impl From<MetaArray> for MetaValue {
    fn from(x: MetaArray) -> Self {
        MetaValue::Array(x)
    }
}

/// The metadata of a GGUF file: keys in file order, each once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>, // in file order
    index: HashMap<String, usize>,     // key → position in `entries`
}

impl Metadata {
    /// An empty map.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds `key`; returns `false` (and changes nothing) if the key is already present.
    pub(crate) fn insert(&mut self, key: String, value: MetaValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Reserves room for `n` more keys (the caller has bounded `n` by the file size).
    pub(crate) fn reserve(&mut self, n: usize) {
        self.entries.reserve(n);
        self.index.reserve(n);
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All keys and values in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_owned()))
    }

    fn require_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        match self.require(key)? {
            MetaValue::Array(a) => Ok(a),
            other => Err(wrong_type(key, "array", other.type_name())),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            MetaValue::String(s) => Ok(s),
            other => Err(wrong_type(key, "string", other.type_name())),
        }
    }

    /// An integer of any stored type whose value fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_integer(key, "u32")
    }

    /// An integer of any stored type whose value fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_integer(key, "u64")
    }

    /// An integer of any stored type whose value fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.get_integer(key, "i64")
    }

    fn get_integer<T: TryFrom<i128>>(&self, key: &str, name: &'static str) -> Result<T, GgufError> {
        let value = self.require(key)?;
        let wide = value.as_integer().ok_or_else(|| wrong_type(key, "integer", value.type_name()))?;
        T::try_from(wide).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            value: wide.to_string(),
            expected: name,
        })
    }

    /// A float: f32, f64 (rounded to f32; finite values beyond f32's range are an error)
    /// or an integer (converted).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            MetaValue::F32(v) => Ok(*v),
            MetaValue::F64(v) => f64_to_f32(key, *v),
            other => match other.as_integer() {
                Some(i) => Ok(i as f32),
                None => Err(wrong_type(key, "float", other.type_name())),
            },
        }
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetaValue::Bool(b) => Ok(*b),
            other => Err(wrong_type(key, "bool", other.type_name())),
        }
    }

    /// Any array, as stored.
    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        self.require_array(key)
    }

    /// An array of strings (borrowed; no copy).
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require_array(key)? {
            MetaArray::String(v) => Ok(v),
            other => Err(wrong_type(key, "array of string", array_type_name(other))),
        }
    }

    /// An array of integers of any stored type, each of which must fit in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let array = self.require_array(key)?;
        if let MetaArray::I32(v) = array {
            return Ok(v.clone());
        }
        let wide = array.integers().ok_or_else(|| wrong_type(key, "array of integer", array_type_name(array)))?;
        wide.into_iter()
            .map(|x| {
                i32::try_from(x).map_err(|_| GgufError::OutOfRange {
                    key: key.to_owned(),
                    value: x.to_string(),
                    expected: "i32",
                })
            })
            .collect()
    }

    /// An array of floats (f32, f64) or integers, converted to `f32`.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let array = self.require_array(key)?;
        match array {
            MetaArray::F32(v) => Ok(v.clone()),
            MetaArray::F64(v) => v.iter().map(|&x| f64_to_f32(key, x)).collect(),
            other => match other.integers() {
                Some(wide) => Ok(wide.into_iter().map(|x| x as f32).collect()),
                None => Err(wrong_type(key, "array of float", array_type_name(other))),
            },
        }
    }

    /// `general.architecture` (e.g. `"llama"`), which prefixes the model's own keys.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &'static str) -> GgufError {
    GgufError::WrongType { key: key.to_owned(), expected, found }
}

fn array_type_name(a: &MetaArray) -> &'static str {
    match a.elem_type_id() {
        value_type::U8 => "array of u8",
        value_type::I8 => "array of i8",
        value_type::U16 => "array of u16",
        value_type::I16 => "array of i16",
        value_type::U32 => "array of u32",
        value_type::I32 => "array of i32",
        value_type::F32 => "array of f32",
        value_type::BOOL => "array of bool",
        value_type::STRING => "array of string",
        value_type::ARRAY => "array of array",
        value_type::U64 => "array of u64",
        value_type::I64 => "array of i64",
        _ => "array of f64",
    }
}

fn f64_to_f32(key: &str, v: f64) -> Result<f32, GgufError> {
    let narrow = v as f32;
    if v.is_finite() && !narrow.is_finite() {
        return Err(GgufError::OutOfRange { key: key.to_owned(), value: v.to_string(), expected: "f32" });
    }
    Ok(narrow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::new();
        m.insert("a.u8".into(), MetaValue::U8(7));
        m.insert("a.i64".into(), MetaValue::I64(-3));
        m.insert("a.big".into(), MetaValue::U64(1 << 40));
        m.insert("a.f64".into(), MetaValue::F64(0.5));
        m.insert("a.huge".into(), MetaValue::F64(1e300));
        m.insert("a.s".into(), "hi".into());
        m.insert("a.ints".into(), vec![1u16, 2, 65535].into());
        m.insert("a.wide".into(), vec![1u64 << 33].into());
        m.insert("a.strs".into(), vec!["x".to_string()].into());
        m
    }

    #[test]
    fn integer_getters_convert_when_the_value_fits() {
        let m = sample();
        assert_eq!(m.get_u32("a.u8").unwrap(), 7);
        assert_eq!(m.get_u64("a.big").unwrap(), 1 << 40);
        assert_eq!(m.get_i64("a.i64").unwrap(), -3);
        assert!(matches!(m.get_u32("a.big"), Err(GgufError::OutOfRange { key, .. }) if key == "a.big"));
        assert!(matches!(m.get_u64("a.i64"), Err(GgufError::OutOfRange { .. })));
        assert!(matches!(m.get_u32("a.s"), Err(GgufError::WrongType { expected: "integer", found: "string", .. })));
        assert!(matches!(m.get_u32("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    }

    #[test]
    fn float_and_array_getters() {
        let m = sample();
        assert_eq!(m.get_f32("a.f64").unwrap(), 0.5);
        assert_eq!(m.get_f32("a.u8").unwrap(), 7.0);
        assert!(matches!(m.get_f32("a.huge"), Err(GgufError::OutOfRange { .. })));
        assert_eq!(m.get_i32_array("a.ints").unwrap(), vec![1, 2, 65535]);
        assert_eq!(m.get_f32_array("a.ints").unwrap(), vec![1.0, 2.0, 65535.0]);
        assert!(matches!(m.get_i32_array("a.wide"), Err(GgufError::OutOfRange { .. })));
        assert_eq!(m.get_str_array("a.strs").unwrap(), ["x"]);
        assert!(matches!(m.get_str_array("a.ints"), Err(GgufError::WrongType { found: "array of u16", .. })));
        assert!(matches!(m.get_str_array("a.s"), Err(GgufError::WrongType { found: "string", .. })));
    }

    #[test]
    fn insert_keeps_order_and_rejects_duplicates() {
        let mut m = sample();
        assert!(!m.insert("a.u8".into(), MetaValue::U8(1)));
        assert_eq!(m.get_u32("a.u8").unwrap(), 7);
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys[0], "a.u8");
        assert_eq!(keys[8], "a.strs");
        assert_eq!(m.len(), 9);
    }
}
