//! Test double of libnvidia-ml.so.1: the NVML C ABI nvml-wrapper calls, driven by a JSON file (to be written).
