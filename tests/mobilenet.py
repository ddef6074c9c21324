"""A MobileNetV2-class model built here (no file needed): the inverted residual blocks of
Sandler et al. (2018), int8, at a chosen input size and width, with the converter's explicit
PADs in front of the strided depthwise convolutions when asked. Big enough that a plan's
search has real work to do: the determinism tests plan it at 224x224."""

from __future__ import annotations

from toolchain.front.builder import ModelBuilder

# (expansion, output channels at width 1.0, repeats, first stride), as in the paper
BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))


def divisible(channels: float, by: int = 8) -> int:
    """The paper's rounding of scaled widths: to a multiple of 8, never 10% below."""
    rounded = max(by, int(channels + by / 2) // by * by)
    return rounded + by if rounded < 0.9 * channels else rounded


def mobilenet_v2(size: int = 224, alpha: float = 0.35, explicit_pads: bool = False,
                 classes: int = 10, seed: int = 3) -> bytes:
    b = ModelBuilder("int8", seed)
    x = b.input("input", (1, size, size, 3), "int8", scale=1 / 128, zero_point=0)

    def strided(x: int, window) -> int:
        if not explicit_pads:
            return window(x, 2, "SAME")
        return window(b.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0))), 2, "VALID")

    x = strided(x, lambda x, s, p: b.conv_2d(x, divisible(32 * alpha), 3, s, p, "RELU6"))
    channels = divisible(32 * alpha)
    for expansion, width, repeats, first_stride in BLOCKS:
        out = divisible(width * alpha)
        for k in range(repeats):
            stride = first_stride if k == 0 else 1
            y = x
            if expansion != 1:
                y = b.conv_2d(y, channels * expansion, 1, activation="RELU6")
            if stride == 2:
                y = strided(y, lambda y, s, p: b.depthwise_conv_2d(y, 3, s, p,
                                                                   activation="RELU6"))
            else:
                y = b.depthwise_conv_2d(y, 3, activation="RELU6")
            y = b.conv_2d(y, out, 1)
            x = b.add(x, y) if stride == 1 and channels == out else y
            channels = out
    x = b.conv_2d(x, 1280, 1, activation="RELU6")
    x = b.average_pool_2d(x, b.shape(x)[1:3])
    x = b.fully_connected(b.reshape(x, (1, -1)), classes)
    b.output(b.softmax(x))
    return b.build()
