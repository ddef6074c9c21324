"""The one numeric spec: fixed point, gemmlowp, quantization constants, rounding proofs and
lookup tables, imported by the C kernels (toolchain.ops) and runtime_py alike."""
