//! Generates the gRPC code from `proto/pgfleet.proto` with protox (pure Rust),
//! so a fresh machine builds without `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pgfleet.proto");
    let fds = protox::compile(["pgfleet.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .type_attribute(".", "#[allow(clippy::all)]")
        .compile_fds(fds)?;
    Ok(())
}
