//! Allocate latency benchmark (to be written).
fn main() {}
