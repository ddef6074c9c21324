"""CUMSUM (toolchain/ops/scan): runtime_py in its planned arena and the C (under the
sanitizers) against LiteRT's kernel, bit for bit, along every axis, exclusive and reversed."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, refusal, three_ways
from toolchain.front.builder import ModelBuilder
from toolchain.lab.oracle import LiteRTOracle


def cumsum_model(dtype: str, shape: tuple[int, ...], axis: int, exclusive: bool = False,
                 reverse: bool = False) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, dtype)
    y = b.tensor("y", shape, dtype)
    b.op("CUMSUM", [x, b.const("axis", np.array(axis, np.int32))], [y],
         {"exclusive": exclusive, "reverse": reverse})
    b.output(y)
    return b.build()


@pytest.mark.parametrize(("exclusive", "reverse"), [(False, False), (True, False), (False, True),
                                                    (True, True)])
@pytest.mark.parametrize(("shape", "axis"), [((2, 5, 3), 1), ((2, 5, 3), 0), ((2, 5, 3), -1),
                                             ((7,), 0)])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_cumsum(dtype, shape, axis, exclusive, reverse):
    assert_matches_oracle(cumsum_model(dtype, shape, axis, exclusive, reverse), inputs=2,
                          sanitize=True)


def test_the_sum_starts_from_zero_and_wraps():
    """-0.0 alone sums to +0.0 (LiteRT adds it to 0); int32 sums wrap past INT32_MAX."""
    for dtype, values in (("float32", [-0.0, -0.0]), ("int32", [2**31 - 1, 5])):
        three_ways(cumsum_model(dtype, (2,), 0), [np.array(values, dtype)])
    assert not np.signbit(LiteRTOracle(cumsum_model("float32", (1,), 0)).invoke(
        [np.array([-0.0], np.float32)])[0][0])


def test_an_axis_given_at_run_time_is_refused():
    b = ModelBuilder()
    x = b.input("x", (2, 3), "float32")
    axis = b.input("axis", (), "int32")
    y = b.tensor("y", (2, 3), "float32")
    b.op("CUMSUM", [x, axis], [y])
    b.output(y)
    assert "axis must be a constant scalar" in refusal(b.build())
