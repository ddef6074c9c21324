"""Checking a planned model: the TFLite oracles, the `check` orchestration that compares them
with runtime_py, and the backends that build and run the generated C (host and QEMU).

Kept apart from runtime_py, which is only the reference runtime, so that the proof and the
things it is compared with do not share a package.
"""
