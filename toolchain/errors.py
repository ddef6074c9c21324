"""One exception type per layer; the CLI turns each into one line on stderr and exit status 2."""

from __future__ import annotations


class ArenacError(Exception):
    """Base of every error the toolchain reports to a user.

    `source` names what was being read (usually the model file) so that the single line the
    user sees says both where and what.
    """

    def __init__(self, message: str, source: str | None = None):
        super().__init__(message)
        self.message = message
        self.source = source

    def __str__(self) -> str:
        return f"{self.source}: {self.message}" if self.source else self.message


class ModelError(ArenacError):
    """The .tflite file is missing, not a TFLite model, corrupt, or describes an invalid graph."""


class UnsupportedOpError(ArenacError):
    """The model uses operators (or dtypes) that a backend cannot execute."""


class PlanError(ArenacError):
    """A plan is invalid: overlapping live buffers, misaligned, or outside the arena."""


class RuntimeBackendError(ArenacError):
    """A backend (runtime_py, the oracle, compiled C) could not run or its inputs were wrong."""
