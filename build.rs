//! Compiles `proto/anarchon/v1/*.proto` with protox (pure Rust, no system
//! `protoc`) and generates the tonic/prost code plus a descriptor set for
//! gRPC reflection.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["anarchon/v1/claims.proto", "anarchon/v1/mesh.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed=proto/{f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("anarchon_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
