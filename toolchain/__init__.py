"""arenac: offline arena planning and C generation for TensorFlow Lite models."""

__version__ = "0.1.0"
