//! Compiles Sluice's own protos (`proto/`, see `proto/README.md`) with a pure-Rust protobuf
//! compiler, so that building needs no system `protoc`. Envoy's protos come from the
//! `envoy-types` crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const ADMIN: &str = "proto/sluice/admin/v1/admin.proto";
    println!("cargo:rerun-if-changed={ADMIN}");
    let files = protox::compile([ADMIN], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(files)?;
    Ok(())
}
