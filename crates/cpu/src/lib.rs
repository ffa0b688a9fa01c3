//! placeholder
pub mod threadpool;
pub mod quant;
