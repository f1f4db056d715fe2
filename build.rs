//! Compiles the CSI schema (proto/csi.proto) and our admin API (proto/admin.proto) into Rust with
//! protox (pure Rust, no system protoc) and tonic-prost-build. The encoded descriptor set is also
//! written out so the server can offer gRPC reflection and name its methods in metrics.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/admin.proto");
    let descriptors = protox::compile(["proto/csi.proto", "proto/admin.proto"], ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("descriptors.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .generate_default_stubs(true)
        // Stream chunks as `Bytes`: decoded as slices of the received buffer, not copied.
        .bytes(".stickyvol.admin.v1")
        .compile_fds(descriptors)?;
    Ok(())
}
