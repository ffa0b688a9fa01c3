//! placeholder
pub mod attention;
pub mod threadpool;
pub mod quant;
