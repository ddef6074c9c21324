"""The lab: what arenac's output is measured and proven against. The TFLite oracles and the
`check` orchestration that compares them with runtime_py, the backends that build and run the
generated C (host and QEMU), the firmware, its footprint and `bench`.

Kept apart from runtime_py, which is only the reference runtime, so that the proof and the
things it is compared with do not share a package.
"""
