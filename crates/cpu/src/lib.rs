//! placeholder
pub mod threadpool;
