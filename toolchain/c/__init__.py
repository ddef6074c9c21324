"""The C generator: a plan in, the model's C, its header and build fragments out."""
