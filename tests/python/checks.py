"""What every check script shares: the slice it runs under (CAP_MIB, its first argument), the
`ok NAME` line the Rust side reads, and `call`, which checks a cuda-bindings result."""
import sys

MIB = 1 << 20
CAP = int(sys.argv[1]) * MIB


def ok(name):
    print("ok", name, flush=True)


def call(result, want=None):
    """The values of a cuda-bindings call (driver or runtime module), after checking its error is
    `want` (by default success, 0 in both CUresult and cudaError_t)."""
    err, *values = result
    assert (err == want) if want is not None else int(err) == 0, f"{err!r}, expected {want!r}"
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
