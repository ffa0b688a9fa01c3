//! placeholder
pub mod attention;
pub mod quant;
pub mod threadpool;
