"""runtime_py: the reference runtime. It runs a plan inside one poisoned arena, with numpy kernels
that state the arithmetic a second time, independently of the C."""
