//! The checks: everything `cargo xtask test` runs, each also a command of its own, and the
//! mutation testing that runs only on demand.

pub mod book;
pub mod crdgen;
pub mod explain;
pub mod fields;
pub mod helm;
pub mod monitoring;
pub mod mutants;
pub mod test;
