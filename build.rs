//! Generates the node protocol's Rust types from `proto/` with prost-build.
//!
//! The `.proto` files are parsed by `protox` (pure Rust), so building needs no system
//! `protoc`. The generated code lands in `OUT_DIR` and is included by `src/wire/mod.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/iop/v1/edge.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
