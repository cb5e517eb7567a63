//! Compiles the same kubelet API files the plugin speaks (the device plugin API, the PodResources
//! API), so the double speaks the wire format from the public definition, not from the plugin's
//! generated code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "../../device-plugin/proto";
    let protos = [
        format!("{dir}/deviceplugin_v1beta1.proto"),
        format!("{dir}/podresources_v1.proto"),
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(&protos, [dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
