//! JSON files the tests read: the reference figures the Python generators committed under
//! `fixtures/`, and the JSON rlcr writes (metrics, trainer states, configs).
use std::path::Path;

use serde_json::Value;

/// The JSON document at `path` (a test failure naming the file when it is missing or malformed).
pub fn read(path: impl AsRef<Path>) -> Value {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// An array of numbers.
pub fn f64s(v: &Value) -> Vec<f64> {
    serde_json::from_value(v.clone()).expect("an array of numbers")
}

/// An array of token ids.
pub fn u32s(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("an array of token ids")
}
