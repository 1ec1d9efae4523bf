//! The node protocol's wire types, generated from `proto/` by `build.rs`.
#![allow(missing_docs, clippy::all)]
include!(concat!(env!("OUT_DIR"), "/iop.v1.rs"));
