"""The convolution family: CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C; arm_dsp.py (and arm_dsp_rows.py, for few input channels and
deep filters, and arm_dsp_direct.py and arm_dsp_depthwise_direct.py, the forms without
scratch) and arm_mve.py hold the kernels of the cores with the DSP extension and of Helium,
from the same params. `SPECS` registers the ops
(toolchain.ops.REGISTRY), `TARGET_KERNELS` the target kernels in the order binding tries them
(toolchain.ops.VARIANTS).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.conv import (
    arm_dsp,
    arm_dsp_depthwise_direct,
    arm_dsp_direct,
    arm_dsp_rows,
    arm_mve,
)
from toolchain.ops.conv.emit import (
    convolution_scratch,
    emit_conv_2d,
    emit_depthwise_conv_2d,
    emit_transpose_conv,
)
from toolchain.ops.conv.prepare import (
    CONVOLUTION_STRIPING,
    convolution_axes,
    pads_with_nothing,
    prepare_conv_2d,
    prepare_depthwise_conv_2d,
    prepare_transpose_conv,
)
from toolchain.ops.padding import PadRule
from toolchain.ops.spec import OpSpec, TargetKernel, kernels

# Convolutions read (data, filter, optional bias); TRANSPOSE_CONV reads (output_shape, filter,
# data, optional bias).
_CONVOLUTION = kernels("float32, float32, float32? -> float32", "int8, int8, int32? -> int8")
# A fused PAD must write the zero point: the taps outside the image add nothing.
_PAD = PadRule(pads_with_nothing, convolution_axes)


SPECS: tuple[OpSpec, ...] = (
    # TFLite's legacy uint8 and 16x8 CONV_2D require their bias; DEPTHWISE_CONV_2D does not.
    # A 16x8 int32 bias needs quantized_bias_type INT32 in the options (prepare checks).
    # Hybrid (float32 data, int8 filter): TFLite requires CONV_2D's bias here too.
    OpSpec("CONV_2D",
           (*_CONVOLUTION, *kernels("uint8, uint8, int32 -> uint8", "int16, int8, int64 -> int16",
                                    "int16, int8, int32 -> int16",
                                    "float32, int8, float32 -> float32")),
           prepare_conv_2d, emit_conv_2d, scratch=convolution_scratch,
           overlaps=overlaps.convolution, striping=CONVOLUTION_STRIPING, pad=_PAD),
    OpSpec("DEPTHWISE_CONV_2D",
           (*_CONVOLUTION, *kernels("uint8, uint8, int32? -> uint8",
                                    "int16, int8, int64? -> int16",
                                    "float32, int8, float32? -> float32")),
           prepare_depthwise_conv_2d, emit_depthwise_conv_2d, scratch=convolution_scratch,
           overlaps=overlaps.convolution, striping=CONVOLUTION_STRIPING, pad=_PAD),
    OpSpec("TRANSPOSE_CONV",
           kernels("int32, float32, float32, float32? -> float32",
                   "int32, int8, int8, int32? -> int8", "int32, int8, int16, int64? -> int16",
                   "int32, int8, int16, int32 -> int16"),
           prepare_transpose_conv, emit_transpose_conv, shape_input=0),
)

TARGET_KERNELS: tuple[TargetKernel, ...] = (
    *arm_dsp_rows.TARGET_KERNELS, *arm_dsp_direct.ROWS_DIRECT, *arm_dsp.POINTWISE_KERNELS,
    *arm_dsp_direct.POINTWISE_DIRECT, *arm_dsp.WINDOWED_KERNELS, *arm_dsp_direct.IM2COL_DIRECT,
    *arm_dsp_depthwise_direct.TARGET_KERNELS,
    *arm_mve.TARGET_KERNELS)
