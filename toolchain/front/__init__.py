"""The front: a .tflite file in, the toolchain's IR out (reader, validate), and the model
builder that writes .tflite files (the examples and the tests' models)."""
