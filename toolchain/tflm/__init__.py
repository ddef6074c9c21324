"""Stock TensorFlow Lite Micro: arenac's plan embedded in the model for TFLM's own planner."""
