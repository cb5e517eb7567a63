//! Compiles the kubelet's plugin APIs with protox, so no protoc is needed: the device plugin API
//! (v1beta1), the DRA plugin API (v1 and v1beta1), the DRA health API (v1alpha1), the plugin
//! registration API and the PodResources API (v1).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/dra_health_v1alpha1.proto",
        "proto/pluginregistration_v1.proto",
        "proto/podresources_v1.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
