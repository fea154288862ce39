//! `cargo xtask bench …`: the controller measured on the local servers. Each benchmark is a
//! module of its own; what they share is in [`harness`].

pub mod anchor;
pub mod big;
pub mod flood;
mod harness;
pub mod objects;
pub mod overlap;
pub mod rollout;
pub mod scale;
pub mod shards;
pub mod tenants;
