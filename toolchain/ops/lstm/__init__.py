"""The recurrent family: UNIDIRECTIONAL_SEQUENCE_LSTM, BIDIRECTIONAL_SEQUENCE_LSTM and LSTM.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.lstm.emit import HYBRID_CELL, cell_form, emit_bidirectional_lstm, emit_lstm
from toolchain.ops.lstm.prepare import (
    bidirectional_scratch,
    lstm_scratch,
    lstm_tflm_scratch,
    prepare_bidirectional_lstm,
    prepare_lstm,
    prepare_lstm_step,
)
from toolchain.ops.spec import TFLM, OpSpec, kernels

BIDIRECTIONAL_FORM = ", ".join(["T", cell_form("T"), cell_form("T"), *["T"] * 4,
                                *["T?"] * 9])


BIDIRECTIONAL_HYBRID_FORM = ", ".join(["float32", HYBRID_CELL, HYBRID_CELL,
                                       *["float32"] * 4, "float32?", *["int8?"] * 8])


# The unidirectional op's kernels, which the LSTM op's FULL kernel shares.
UNIDIRECTIONAL_KERNELS = kernels(
    "int8, int8?, int8, int8, int8, int8?, int8, int8, int8, int16?, int16?, int16?, int32?, "
    "int32, int32, int32, int8?, int32?, int8, int16, int16?, int16?, int16?, int16? -> int8",
    "T, T?, T, T, T, T?, T, T, T, T?, T?, T?, T?, T, T, T, T?, T?, T, T, T?, T?, T?, T? -> T",
    "float32, int8?, int8, int8, int8, int8?, int8, int8, int8, int8?, int8?, int8?, float32?, "
    "float32, float32, float32, int8?, float32?, float32, float32, float32?, float32?, float32?, "
    "float32? -> float32",
    T=("float32",))


# int16x8, which LiteRT's prepare refuses: TFLite Micro's kernel, whose arithmetic it is. The
# positions of the variants it refuses take the dtypes they would have, so that prepare names
# the variant.
INT16X8_KERNELS = kernels(
    "int16, int8?, int8, int8, int8, int8?, int8, int8, int8, int16?, int16?, int16?, int64?, "
    "int64, int64, int64, int8?, int64?, int16, int16, int16?, int16?, int16?, int16? -> int16",
    oracle=TFLM)


SPECS: tuple[OpSpec, ...] = (
    OpSpec("UNIDIRECTIONAL_SEQUENCE_LSTM", (*UNIDIRECTIONAL_KERNELS, *INT16X8_KERNELS),
           prepare_lstm, emit_lstm, scratch=lstm_scratch, tflm_scratch=lstm_tflm_scratch),
    OpSpec("LSTM", (*UNIDIRECTIONAL_KERNELS, *kernels(
        "float32, float32, float32, float32, float32 -> float32, float32, float32, float32")),
           prepare_lstm_step, emit_lstm, scratch=lstm_scratch),
    OpSpec("BIDIRECTIONAL_SEQUENCE_LSTM",
           kernels(f"{BIDIRECTIONAL_FORM} -> T", f"{BIDIRECTIONAL_FORM} -> T, T",
                   f"{BIDIRECTIONAL_HYBRID_FORM} -> float32",
                   f"{BIDIRECTIONAL_HYBRID_FORM} -> float32, float32", T=("float32",)),
           prepare_bidirectional_lstm, emit_bidirectional_lstm, scratch=bidirectional_scratch),
)
