//! Compiles the kubelet device plugin API (v1beta1) with protox, so no protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin_v1beta1.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
