"""arenac: offline arena planning and C generation for TensorFlow Lite models."""
