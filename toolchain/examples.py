"""Built-in example models: small, deterministic, and branchy enough to make arena planning
interesting. `python -m toolchain.examples NAME OUT.tflite` writes one to a file."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from toolchain.builder import ModelBuilder

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


EXAMPLES: dict[str, Callable[[], bytes]] = {
    f"{model.__name__}_{dtype}": partial(model, dtype)
    for model in (tiny_cnn, residual_cnn)
    for dtype in ("float32", "int8", "uint8", "int16")
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in EXAMPLES:
        print(
            f"usage: python -m toolchain.examples {{{','.join(EXAMPLES)}}} OUT.tflite",
            file=sys.stderr,
        )
        return 2
    out = Path(args[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(EXAMPLES[args[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
