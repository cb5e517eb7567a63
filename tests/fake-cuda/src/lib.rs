//! Test double of libcuda.so.1: the CUDA driver C ABI with device-memory bookkeeping (to be written).
