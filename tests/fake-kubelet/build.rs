//! Compiles the same kubelet device plugin API file the plugin serves, so the double speaks the wire
//! format from the public definition, not from the plugin's generated code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "../../device-plugin/proto";
    let proto = format!("{dir}/deviceplugin_v1beta1.proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto.as_str()], [dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
