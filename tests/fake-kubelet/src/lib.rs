//! Test double of the kubelet's device-plugin side: Registration server and plugin client over unix sockets (to be written).
