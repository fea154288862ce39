//! The checks: everything `cargo xtask test` runs, each also a command of its own.

pub mod crdgen;
pub mod explain;
pub mod helm;
pub mod monitoring;
pub mod test;
