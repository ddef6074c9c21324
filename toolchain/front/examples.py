"""Built-in example models: small, deterministic, and branchy enough to make arena planning
interesting. `python -m toolchain.front.examples NAME OUT.tflite` writes one to a file."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from toolchain.front.builder import ModelBuilder

# Quantized inputs cover [-1, 1) like the float models' inputs (uint8: legacy quantization).
_INPUT_QUANT = {"float32": (None, None), "int8": (1.0 / 128.0, 0), "uint8": (1.0 / 128.0, 128),
                "int16": (1.0 / 32768.0, 0)}


def _input(b: ModelBuilder, shape: tuple[int, ...]) -> int:
    return b.input("input", shape, b.dtype, *_INPUT_QUANT[b.dtype])


def tiny_cnn(dtype: str, seed: int = 0) -> bytes:
    """A plain chain of convolutions, pools, reshape, FC and softmax (~3.4k params)."""
    b = ModelBuilder(dtype, seed)
    x = _input(b, (1, 16, 16, 3))
    x = b.conv_2d(x, 8, 3, activation="RELU")
    x = b.depthwise_conv_2d(x, 3, stride=2, activation="RELU6")
    x = b.conv_2d(x, 16, 1, activation="RELU")
    x = b.max_pool_2d(x, 2)
    x = b.conv_2d(x, 16, 3, activation="RELU")
    x = b.average_pool_2d(x, 2)
    x = b.reshape(x, (1, -1))
    x = b.fully_connected(x, 10)
    b.output(b.softmax(x))
    return b.build()


def _residual_block(b: ModelBuilder, x: int) -> int:
    branch = b.depthwise_conv_2d(x, 3, activation="RELU6")
    branch = b.conv_2d(branch, b.shape(x)[-1], 1)
    return b.add(x, branch, activation="RELU")


def residual_cnn(dtype: str, seed: int = 0) -> bytes:
    """Two residual blocks: each skip tensor stays live across its branch (~7.2k params)."""
    b = ModelBuilder(dtype, seed)
    x = _input(b, (1, 32, 32, 3))
    x = b.conv_2d(x, 16, 3, stride=2, activation="RELU")
    x = _residual_block(b, x)
    x = b.max_pool_2d(x, 2)
    x = b.conv_2d(x, 32, 3, stride=2, activation="RELU")
    x = _residual_block(b, x)
    x = b.average_pool_2d(x, b.shape(x)[1:3])
    x = b.reshape(x, (1, -1))
    x = b.fully_connected(x, 10)
    b.output(b.softmax(x))
    return b.build()


def streaming_kws(dtype: str, seed: int = 0) -> bytes:
    """A streaming keyword spotter as TFLite's converter writes one: each invocation takes one
    frame of 8 features, a resource variable keeps the 3 frames before it (CALL_ONCE's
    initialization subgraph sets them to zero on the first invocation), and a fully connected
    layer scores the 4-frame window (~330 params)."""
    frame, history = 8, 3
    b = ModelBuilder(dtype, seed)
    scale, zero_point = _INPUT_QUANT[dtype]
    past_shape = (1, frame * history)
    init = b.subgraph("init")
    init.assign_variable(
        init.var_handle("frames"),
        init.const("frames/zero", np.full(past_shape, zero_point or 0, np.dtype(dtype)), scale,
                   zero_point),
    )
    x = _input(b, (1, frame))
    b.call_once(init)
    handle = b.var_handle("frames")
    past = b.read_variable(handle, past_shape, dtype, scale, zero_point, name="frames/past")
    window = b.tensor("window", (1, frame * (history + 1)), dtype, scale, zero_point)
    b.op("CONCATENATION", [past, x], [window], {"axis": 1})
    kept = b.tensor("frames/kept", past_shape, dtype, scale, zero_point)
    begin = b.const("frames/begin", np.asarray([0, frame], np.int32))
    size = b.const("frames/size", np.asarray(past_shape, np.int32))
    b.op("SLICE", [window, begin, size], [kept])
    b.assign_variable(handle, kept)
    b.output(b.softmax(b.fully_connected(window, 10)))
    return b.build()


# The schemes each example is built in: the CNNs in every one; the streaming model, whose
# checks also run TFLite Micro, only where TFLite Micro's kernels agree with LiteRT's (its int16
# FULLY_CONNECTED rescales in fixed point, LiteRT's in double).
EXAMPLES: dict[str, Callable[[], bytes]] = {
    f"{model.__name__}_{dtype}": partial(model, dtype)
    for model, dtypes in ((tiny_cnn, ("float32", "int8", "uint8", "int16")),
                          (residual_cnn, ("float32", "int8", "uint8", "int16")),
                          (streaming_kws, ("float32", "int8", "uint8")))
    for dtype in dtypes
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in EXAMPLES:
        print(
            f"usage: python -m toolchain.front.examples {{{','.join(EXAMPLES)}}} OUT.tflite",
            file=sys.stderr,
        )
        return 2
    out = Path(args[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(EXAMPLES[args[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
