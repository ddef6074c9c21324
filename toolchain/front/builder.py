"""Write .tflite files from Python: the example models and the test models come from here.

Everything goes through the generated TFLite schema's object API (`...T` classes and `.Pack`), so
no flatbuffer layout is written by hand. Two layers: a generic one (`input`, `const`, `tensor`,
`op`, `custom`, `build`, and `subgraph` for the further subgraphs an operator runs) that can
express any model, and layer helpers (`conv_2d`, `softmax`, ..., and the resource-variable ops
`var_handle`, `read_variable`, `assign_variable`, `call_once` the converter writes for streaming
models) that draw weights from the builder's seeded generator and choose int8 quantization from
a per-tensor estimate of the float range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flatbuffers
import numpy as np
from flatbuffers import flexbuffers

from toolchain.front.schema import OPCODE_CODES, TENSOR_TYPES, fb

Pair = int | tuple[int, int]
Quant = float | Sequence[float] | None

SCHEMA_VERSION = 3
FILE_IDENTIFIER = b"TFL3"
BUFFER_ALIGNMENT = 16
SIGNATURE_KEY = "serving_default"
# Builtin codes above this do not fit the deprecated int8 field; it holds this placeholder instead.
_PLACEHOLDER = fb.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES

# Operators whose options table is not named after the operator. Every other operator's options
# class is found by name (CONV_2D -> Conv2DOptions, TOPK_V2 -> TopKV2Options), or it has none.
_SHARED_OPTIONS = {
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "SUM": "ReducerOptions",
    "MEAN": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions",
    "RANDOM_UNIFORM": "RandomOptions",
    "RANDOM_STANDARD_NORMAL": "RandomOptions",
    "MULTINOMIAL": "RandomOptions",
}
_OPTIONS_BY_KEY = {
    name.lower(): name for name in vars(fb.BuiltinOptions) if name.endswith("Options")
}

# Options fields holding an enum: a string value is looked up as a member name of that enum.
_ENUM_FIELDS: dict[str, type] = {
    "padding": fb.Padding,
    "fused_activation_function": fb.ActivationFunctionType,
    "weights_format": fb.FullyConnectedOptionsWeightsFormat,
    "kernel_type": fb.LSTMKernelType,
    "combiner": fb.CombinerType,
    "mode": fb.MirrorPadMode,
    "type": fb.LSHProjectionType,
    **dict.fromkeys(
        (
            "in_data_type",
            "out_data_type",
            "output_type",
            "idx_out_type",
            "out_type",
            "quantized_bias_type",
            "key_dtype",
            "value_dtype",
        ),
        fb.TensorType,
    ),
}

# Output spatial size from (input size, effective kernel size, stride), as TFLite computes it.
_OUTPUT_SIZE: dict[str, Callable[[int, int, int], int]] = {
    "SAME": lambda n, k, s: -(-n // s),
    "VALID": lambda n, k, s: -(-(n - k + 1) // s),
}

# Fused activation -> (low clamp, high clamp, share of a zero-mean signal's power it keeps).
_ACTIVATIONS = {
    "NONE": (-math.inf, math.inf, 1.0),
    "RELU": (0.0, math.inf, 0.5),
    "RELU6": (0.0, 6.0, 0.5),
    "RELU_N1_TO_1": (-1.0, 1.0, 1.0),
}

# Operators whose first version is not 1: BROADCAST_TO's version 1 is the TensorFlow op's, which
# only the Flex delegate runs; the builtin starts at 2 (what the converter writes, and all
# LiteRT's kernel registers).
_FIRST_VERSIONS = {"BROADCAST_TO": 2}

# Operator versions of int8 kernels (float kernels are version 1), as the TFLite converter writes.
_INT8_VERSIONS = {
    "CONV_2D": 3,
    "DEPTHWISE_CONV_2D": 3,
    "FULLY_CONNECTED": 4,
    "AVERAGE_POOL_2D": 2,
    "MAX_POOL_2D": 2,
    "ADD": 2,
    "SOFTMAX": 2,
}

# Quantized softmax outputs are fixed by TFLite: [0, 1) in steps of 1/256 (1/32768 in int16).
_SOFTMAX_QUANT = {"int8": (1.0 / 256.0, -128), "uint8": (1.0 / 256.0, 0),
                  "int16": (1.0 / 32768.0, 0)}
# int8 activations cover this many estimated standard deviations either side of the bias.
_COVERAGE = 5.0
_BIAS_STD = 0.1
# Root mean square of an input without quantization: uniform on [-1, 1].
_DEFAULT_RMS = 1.0 / math.sqrt(3.0)


class AlignedBufferT(fb.BufferT):
    """A BufferT whose data starts on a 16-byte boundary, so kernels may read it in place."""

    def Pack(self, builder: flatbuffers.Builder) -> int:  # noqa: N802 (generated API's name)
        if self.data is not None:
            # Pad so the vector the generated code writes next (4-byte aligned) ends up 16-aligned.
            builder.Prep(BUFFER_ALIGNMENT, len(self.data))
        return super().Pack(builder)


def options_class_name(opcode: str) -> str | None:
    """Name of the BuiltinOptions member for a builtin operator, or None if it takes none."""
    return _SHARED_OPTIONS.get(opcode) or _OPTIONS_BY_KEY.get(
        opcode.replace("_", "").lower() + "options"
    )


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _builtin_code(opcode: str) -> int:
    if opcode not in OPCODE_CODES:
        raise ValueError(f"unknown builtin operator {opcode!r}")
    return OPCODE_CODES[opcode]


def _options(opcode: str, options: dict[str, object]) -> tuple[int, object] | None:
    """(BuiltinOptions type, options T-object) for an operator, or None if it takes none."""
    name = options_class_name(opcode)
    if name is None:
        if options:
            raise ValueError(f"{opcode} takes no options, got {sorted(options)}")
        return None
    table = getattr(fb, name + "T")()
    for key, value in options.items():
        attr = _camel(key)
        if not hasattr(table, attr):
            raise ValueError(f"{name} has no field {key!r}")
        # A string names an enum member, except in the string fields (a variable's name),
        # which the object API leaves None until set.
        if isinstance(value, str) and (key in _ENUM_FIELDS or getattr(table, attr) is not None):
            enum = _ENUM_FIELDS.get(key)
            if enum is None or not hasattr(enum, value):
                raise ValueError(f"{name}.{key}: invalid value {value!r}")
            value = getattr(enum, value)
        setattr(table, attr, value)
    return getattr(fb.BuiltinOptions, name), table


def _tensor_type(dtype: str | np.dtype) -> int:
    """The TensorType code of a numpy dtype, or of a name such as "resource" numpy lacks."""
    if isinstance(dtype, str) and dtype in TENSOR_TYPES:
        return TENSOR_TYPES[dtype]
    return TENSOR_TYPES[np.dtype(dtype).name]


def _quantization(
    scale: Quant, zero_point: int | Sequence[int] | None, quantized_dimension: int
) -> fb.QuantizationParametersT | None:
    if scale is None:
        return None
    scales = [float(s) for s in np.atleast_1d(scale)]
    zero_points = np.broadcast_to(np.asarray(0 if zero_point is None else zero_point), len(scales))
    return fb.QuantizationParametersT(
        scale=scales,
        zeroPoint=[int(z) for z in zero_points],
        quantizedDimension=quantized_dimension,
    )


def _pair(value: Pair) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[1])


# The stored range of each quantized activation type the builder writes.
_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}

# The bias type of each quantized scheme: int16 activations (16x8) take int64 biases, as
# TFLite's converter writes them.
_BIAS_TYPES = {"int8": np.int32, "uint8": np.int32, "int16": np.int64}


def _activation_quant(lo: float, hi: float, dtype: str) -> tuple[float, int]:
    """Scale and zero point covering [lo, hi] (widened to contain 0, as TFLite requires); int16
    is symmetric with zero point 0, as TFLite's 16x8 scheme requires."""
    low, high = _RANGES[dtype]
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if dtype == "int16":
        return max(-lo, hi, 1e-6) / high, 0
    scale = max(hi - lo, 1e-6) / 255.0
    zero_point = int(np.clip(round(low - lo / scale), low, high))
    return scale, zero_point


class ModelBuilder:
    """Accumulates tensors, operators and buffers of one subgraph; `build` serializes them.

    The builder made by the constructor writes subgraph 0 (the main graph); `subgraph` adds
    another one, whose builder shares this one's buffers, operator codes and random generator.
    `build` on any of them serializes the whole model."""

    def __init__(self, dtype: str = "float32", seed: int = 0, description: str = "arenac"):
        if dtype not in ("float32", "int8", "uint8", "int16"):
            raise ValueError(
                f"dtype must be 'float32', 'int8', 'uint8' or 'int16', not {dtype!r}")
        self.dtype = dtype
        self.description = description
        self.rng = np.random.default_rng(seed)
        self._tensors: list[fb.TensorT] = []
        self._buffers: list[fb.BufferT] = [AlignedBufferT()]  # buffer 0: empty, by convention
        self._opcodes: list[fb.OperatorCodeT] = []
        self._opcode_index: dict[tuple[int, str | None, int], int] = {}
        self._operators: list[fb.OperatorT] = []
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._metadata: list[fb.MetadataT] = []
        self._rms: dict[int, float] = {}  # estimated root mean square of each layer's output
        self._layer_counts: dict[str, int] = {}
        self.index = 0  # this subgraph's index in the model
        self._name = "main"
        self._subgraphs: list[ModelBuilder] = [self]  # every subgraph of the model, in order

    def subgraph(self, name: str) -> ModelBuilder:
        """Add a subgraph to the model (an initialization graph that CALL_ONCE runs, ...) and
        return the builder of its tensors, operators, inputs and outputs; its `index` is the
        number operators call it by. It shares the model's buffers, operator codes, metadata
        and random generator."""
        sub = ModelBuilder.__new__(ModelBuilder)
        sub.__dict__.update(self.__dict__)  # the shared lists and dicts are the same objects
        sub._tensors, sub._operators, sub._inputs, sub._outputs = [], [], [], []
        sub._rms, sub._layer_counts = {}, {}
        sub.index, sub._name = len(self._subgraphs), name
        self._subgraphs.append(sub)
        return sub

    # -- tensors -------------------------------------------------------------------------------

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str,
        scale: Quant = None,
        zero_point: int | Sequence[int] | None = None,
    ) -> int:
        """Add an activation (intermediate or output) tensor; returns its index."""
        return self._add_tensor(name, shape, dtype, _quantization(scale, zero_point, 0))

    def input(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str,
        scale: Quant = None,
        zero_point: int | Sequence[int] | None = None,
    ) -> int:
        """Add a model input tensor; returns its index."""
        index = self.tensor(name, shape, dtype, scale, zero_point)
        self._inputs.append(index)
        return index

    def const(
        self,
        name: str,
        array: np.ndarray,
        scale: Quant = None,
        zero_point: int | Sequence[int] | None = None,
        quantized_dimension: int = 0,
    ) -> int:
        """Add a constant tensor with its own buffer; dtype and shape come from `array`."""
        array = np.asarray(array)
        return self._add_tensor(
            name,
            array.shape,
            array.dtype,
            _quantization(scale, zero_point, quantized_dimension),
            buffer=self._add_buffer(array),
        )

    def variable(
        self,
        name: str,
        array: np.ndarray,
        scale: Quant = None,
        zero_point: int | Sequence[int] | None = None,
    ) -> int:
        """Add a variable tensor (state kept across invocations) that starts as `array`.

        All-zero state is written without data: runtimes start variables at zero (an int8 one
        at its zero point), and the TFLite interpreter rejects variable tensors that carry a
        buffer.
        """
        array = np.asarray(array)
        buffer = self._add_buffer(array) if array.any() else 0
        return self._add_tensor(name, array.shape, array.dtype,
                                _quantization(scale, zero_point, 0), buffer, variable=True)

    def intermediates(self, tensors: Sequence[int]) -> None:
        """Give the operator added last these intermediate tensors (the integer LSTM reads the
        scales of its gates and of its hidden values from them)."""
        self._operators[-1].intermediates = list(tensors)

    def output(self, index: int) -> None:
        """Mark a tensor as a model output."""
        self._outputs.append(index)

    def shape(self, index: int) -> tuple[int, ...]:
        """Shape of a tensor added earlier."""
        return tuple(self._tensors[index].shape)

    def metadata(self, name: str, data: bytes) -> None:
        """Attach a named metadata buffer to the model."""
        buffer = self._add_buffer(np.frombuffer(data, np.uint8))
        self._metadata.append(fb.MetadataT(name=name, buffer=buffer))

    # -- operators -----------------------------------------------------------------------------

    def op(
        self,
        opcode: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options: dict[str, object] | None = None,
        version: int = 1,
    ) -> None:
        """Add a builtin operator; `options` maps snake_case field names of its options table.

        Enum fields accept member names ("SAME", "RELU"); absent optional inputs are -1. A
        version below the operator's first (_FIRST_VERSIONS) is raised to it.
        """
        version = max(version, _FIRST_VERSIONS.get(opcode, 1))
        operator = fb.OperatorT(
            opcodeIndex=self._opcode(_builtin_code(opcode), None, version),
            inputs=list(inputs),
            outputs=list(outputs),
        )
        typed = _options(opcode, options or {})
        if typed is not None:
            operator.builtinOptionsType, operator.builtinOptions = typed
        self._operators.append(operator)

    def custom(
        self, code: str, inputs: Sequence[int], outputs: Sequence[int],
        options: bytes | Mapping[str, Any] = b"",
    ) -> None:
        """Add a custom operator; `options` are its raw custom options, or a map of them,
        written as the flexbuffer map TFLite Micro's signal ops read."""
        if not isinstance(options, bytes):
            options = bytes(flexbuffers.Dumps(dict(options))) if options else b""
        self._operators.append(
            fb.OperatorT(
                opcodeIndex=self._opcode(fb.BuiltinOperator.CUSTOM, code, 1),
                inputs=list(inputs),
                outputs=list(outputs),
                customOptions=list(options) or None,
            )
        )

    # -- serialization -------------------------------------------------------------------------

    def build(self) -> bytes:
        """Serialize the model (every subgraph, whichever builder is asked); the same sequence
        of calls always yields the same bytes."""
        main = self._subgraphs[0]
        if not main._outputs:
            raise ValueError("the model has no outputs; call output()")
        subgraphs = [
            fb.SubGraphT(
                tensors=g._tensors,
                inputs=g._inputs,
                outputs=g._outputs,
                operators=g._operators,
                name=g._name,
            )
            for g in self._subgraphs
        ]
        signature = fb.SignatureDefT(
            inputs=main._tensor_maps(main._inputs),
            outputs=main._tensor_maps(main._outputs),
            signatureKey=SIGNATURE_KEY,
            subgraphIndex=0,
        )
        model = fb.ModelT(
            version=SCHEMA_VERSION,
            operatorCodes=self._opcodes,
            subgraphs=subgraphs,
            description=self.description,
            buffers=self._buffers,
            metadata=self._metadata or None,
            signatureDefs=[signature],
        )
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
        return bytes(builder.Output())

    # -- layer helpers -------------------------------------------------------------------------

    def conv_2d(
        self,
        x: int,
        filters: int,
        kernel: Pair,
        stride: Pair = 1,
        padding: str = "SAME",
        activation: str = "NONE",
        dilation: Pair = 1,
    ) -> int:
        """2-D convolution with He-initialized weights [filters, kh, kw, in] and a bias."""
        batch, height, width, channels = self.shape(x)
        (kh, kw), (sh, sw), (dh, dw) = _pair(kernel), _pair(stride), _pair(dilation)
        weights = self._he_normal((filters, kh, kw, channels), fan_in=kh * kw * channels)
        out_shape = (
            batch,
            _OUTPUT_SIZE[padding](height, (kh - 1) * dh + 1, sh),
            _OUTPUT_SIZE[padding](width, (kw - 1) * dw + 1, sw),
            filters,
        )
        options = {
            "padding": padding,
            "stride_h": sh,
            "stride_w": sw,
            "dilation_h_factor": dh,
            "dilation_w_factor": dw,
            "fused_activation_function": activation,
        }
        return self._weighted("conv_2d", "CONV_2D", x, weights, 0, out_shape, options, activation)

    def depthwise_conv_2d(
        self,
        x: int,
        kernel: Pair,
        stride: Pair = 1,
        padding: str = "SAME",
        depth_multiplier: int = 1,
        activation: str = "NONE",
    ) -> int:
        """Depthwise convolution with weights [1, kh, kw, in * depth_multiplier] and a bias."""
        batch, height, width, channels = self.shape(x)
        (kh, kw), (sh, sw) = _pair(kernel), _pair(stride)
        out_channels = channels * depth_multiplier
        weights = self._he_normal((1, kh, kw, out_channels), fan_in=kh * kw)
        out_shape = (
            batch,
            _OUTPUT_SIZE[padding](height, kh, sh),
            _OUTPUT_SIZE[padding](width, kw, sw),
            out_channels,
        )
        options = {
            "padding": padding,
            "stride_h": sh,
            "stride_w": sw,
            "depth_multiplier": depth_multiplier,
            "fused_activation_function": activation,
        }
        return self._weighted(
            "depthwise_conv_2d", "DEPTHWISE_CONV_2D", x, weights, 3, out_shape, options, activation
        )

    def fully_connected(self, x: int, units: int, activation: str = "NONE",
                        flatten: bool = False) -> int:
        """Fully connected layer over the last dimension, weights [units, in] and a bias;
        `flatten`: over each batch's whole input (an image read as one row, as TFLite's dense
        layer reads an NHWC input without a RESHAPE before it)."""
        shape = self.shape(x)
        rows, depth = ((shape[0], math.prod(shape[1:])) if flatten
                       else (math.prod(shape[:-1]), shape[-1]))
        weights = self._he_normal((units, depth), fan_in=depth)
        out_shape = (rows, units)
        options = {"fused_activation_function": activation}
        return self._weighted(
            "fully_connected", "FULLY_CONNECTED", x, weights, 0, out_shape, options, activation
        )

    def average_pool_2d(
        self, x: int, size: Pair = 2, stride: Pair | None = None, padding: str = "VALID"
    ) -> int:
        """Average pooling; the output keeps the input's quantization."""
        return self._pool("average_pool_2d", "AVERAGE_POOL_2D", x, size, stride, padding)

    def max_pool_2d(
        self, x: int, size: Pair = 2, stride: Pair | None = None, padding: str = "VALID"
    ) -> int:
        """Max pooling; the output keeps the input's quantization."""
        return self._pool("max_pool_2d", "MAX_POOL_2D", x, size, stride, padding)

    def add(self, a: int, b: int, activation: str = "NONE") -> int:
        """Elementwise (broadcasting) addition."""
        name = self._layer("add")
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        rms = self._estimate(a) + self._estimate(b)  # an upper bound: residuals correlate
        out = self._activation_tensor(name, shape, 0.0, 0.0, rms, activation)
        options = {"fused_activation_function": activation}
        self.op("ADD", [a, b], [out], options, self._version("ADD"))
        return out

    def reshape(self, x: int, shape: Sequence[int]) -> int:
        """Reshape (one dimension may be -1); the output keeps the input's quantization."""
        name = self._layer("reshape")
        size, known = math.prod(self.shape(x)), math.prod(d for d in shape if d != -1)
        new_shape = tuple(size // known if d == -1 else d for d in shape)
        if math.prod(new_shape) != size:
            raise ValueError(f"cannot reshape {self.shape(x)} to {tuple(shape)}")
        shape_tensor = self.const(f"{name}/shape", np.asarray(new_shape, np.int32))
        out = self._like(name, x, new_shape)
        self.op("RESHAPE", [x, shape_tensor], [out], {"new_shape": list(new_shape)})
        return out

    def pad(self, x: int, paddings: Sequence[Sequence[int]]) -> int:
        """PAD by (before, after) per dimension; the output keeps the input's quantization, so
        the padding is its zero point."""
        name = self._layer("pad")
        pairs = np.asarray(paddings, np.int32)
        out = self._like(name, x, tuple(int(n + a + z) for n, (a, z) in zip(self.shape(x), pairs,
                                                                            strict=True)))
        self.op("PAD", [x, self.const(f"{name}/paddings", pairs)], [out])
        return out

    def softmax(self, x: int, beta: float = 1.0) -> int:
        """Softmax over the last dimension; a quantized 8-bit output uses TFLite's fixed 1/256
        and the type's lowest value as zero point, int16 1/32768 and zero point 0."""
        name = self._layer("softmax")
        scale, zero_point = _SOFTMAX_QUANT.get(self.dtype, (None, None))
        out = self.tensor(name, self.shape(x), self.dtype, scale, zero_point)
        self.op("SOFTMAX", [x], [out], {"beta": beta}, self._version("SOFTMAX"))
        return out

    # -- resource variables (what the converter writes for streaming models) -------------------

    def var_handle(self, shared_name: str, container: str = "") -> int:
        """A VAR_HANDLE naming the resource variable `shared_name`; returns its handle tensor.
        Handles of one name in any subgraph of the model name the same variable."""
        handle = self._add_tensor(f"{shared_name}/handle", (), "resource", None)
        self.op("VAR_HANDLE", [], [handle], {"container": container, "shared_name": shared_name})
        return handle

    def read_variable(
        self,
        handle: int,
        shape: Sequence[int],
        dtype: str,
        scale: Quant = None,
        zero_point: int | Sequence[int] | None = None,
        name: str | None = None,
    ) -> int:
        """READ_VARIABLE: a tensor holding the variable's current value."""
        value = self.tensor(name or self._layer("read_variable"), shape, dtype, scale, zero_point)
        self.op("READ_VARIABLE", [handle], [value])
        return value

    def assign_variable(self, handle: int, value: int) -> None:
        """ASSIGN_VARIABLE: the variable takes `value` (kept across invocations)."""
        self.op("ASSIGN_VARIABLE", [handle, value], [])

    def call_once(self, init: ModelBuilder | int) -> None:
        """CALL_ONCE: run subgraph `init` (a builder from `subgraph`, or its index) on the
        first invocation only."""
        index = init if isinstance(init, int) else init.index
        self.op("CALL_ONCE", [], [], {"init_subgraph_index": index})

    # -- control flow --------------------------------------------------------------------------

    def if_(self, cond: int, then: ModelBuilder, else_: ModelBuilder,
            inputs: Sequence[int]) -> list[int]:
        """IF: run subgraph `then` when the bool `cond` holds, else `else_`, on `inputs` (each
        branch declares as many inputs, and as many outputs); returns the IF's outputs, typed
        like `then`'s."""
        outputs = [self._copy_of(then, t, self._layer("if")) for t in then._outputs]
        self.op("IF", [cond, *inputs], outputs,
                {"then_subgraph_index": then.index, "else_subgraph_index": else_.index})
        return outputs

    def while_(self, cond: ModelBuilder, body: ModelBuilder, inputs: Sequence[int]) -> list[int]:
        """WHILE: the loop values start as `inputs`; while subgraph `cond` outputs true for
        them, subgraph `body` computes the next ones. Returns the final values."""
        outputs = [self._copy_of(self, t, self._layer("while")) for t in inputs]
        self.op("WHILE", list(inputs), outputs,
                {"cond_subgraph_index": cond.index, "body_subgraph_index": body.index})
        return outputs

    def _copy_of(self, graph: ModelBuilder, tensor: int, name: str) -> int:
        """A new tensor of this subgraph typed like `tensor` of `graph`."""
        t = graph._tensors[tensor]
        self._tensors.append(fb.TensorT(shape=list(t.shape), type=t.type, buffer=0, name=name,
                                        quantization=t.quantization))
        return len(self._tensors) - 1

    # -- internals -----------------------------------------------------------------------------

    def _add_tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str | np.dtype,
        quantization: fb.QuantizationParametersT | None,
        buffer: int = 0,
        variable: bool = False,
    ) -> int:
        self._tensors.append(
            fb.TensorT(
                shape=[int(d) for d in shape],
                type=_tensor_type(dtype),
                buffer=buffer,
                name=name,
                quantization=quantization,
                isVariable=variable,
            )
        )
        return len(self._tensors) - 1

    def _add_buffer(self, array: np.ndarray) -> int:
        little_endian = array.astype(array.dtype.newbyteorder("<"), copy=False)
        data = np.frombuffer(np.ascontiguousarray(little_endian).tobytes(), np.uint8)
        self._buffers.append(AlignedBufferT(data=data))
        return len(self._buffers) - 1

    def _opcode(self, code: int, custom_code: str | None, version: int) -> int:
        key = (code, custom_code, version)
        if key not in self._opcode_index:
            self._opcode_index[key] = len(self._opcodes)
            self._opcodes.append(
                fb.OperatorCodeT(
                    deprecatedBuiltinCode=min(code, _PLACEHOLDER),
                    customCode=custom_code,
                    version=version,
                    builtinCode=code,
                )
            )
        return self._opcode_index[key]

    def _he_normal(self, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        """Weights that keep activations at about unit scale through ReLU layers (He et al.)."""
        return self.rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)

    def _tensor_maps(self, indices: list[int]) -> list[fb.TensorMapT]:
        return [fb.TensorMapT(name=self._tensors[i].name, tensorIndex=i) for i in indices]

    def _layer(self, kind: str) -> str:
        count = self._layer_counts.get(kind, 0)
        self._layer_counts[kind] = count + 1
        return f"{kind}_{count}"

    def _version(self, opcode: str) -> int:
        return _INT8_VERSIONS.get(opcode, 1) if self.dtype == "int8" else 1

    def _estimate(self, x: int) -> float:
        """Root mean square of a tensor's float values: recorded for layer outputs; for inputs,
        that of a uniform spread over what the int8 quantization can represent."""
        if x in self._rms:
            return self._rms[x]
        q = self._tensors[x].quantization
        if q is None:
            return _DEFAULT_RMS
        scale, zero_point = q.scale[0], q.zeroPoint[0]
        low, high = _RANGES[self.dtype]
        return max(scale * (zero_point - low), scale * (high - zero_point)) / math.sqrt(3.0)

    def _input_scale(self, x: int) -> float:
        q = self._tensors[x].quantization
        if q is None:
            raise ValueError(f"{self.dtype} tensor {self._tensors[x].name!r} has no quantization")
        return q.scale[0]

    def _activation_tensor(
        self,
        name: str,
        shape: Sequence[int],
        low_mean: float,
        high_mean: float,
        rms: float,
        activation: str,
    ) -> int:
        """Output tensor of a layer whose channel means lie in [low_mean, high_mean] and whose
        values have root mean square `rms` before the activation; int8 covers the likely range."""
        clamp_lo, clamp_hi, power = _ACTIVATIONS[activation]
        lo = min(max(low_mean - _COVERAGE * rms, clamp_lo), clamp_hi)
        hi = max(min(high_mean + _COVERAGE * rms, clamp_hi), clamp_lo)
        quant = _activation_quant(lo, hi, self.dtype) if self.dtype in _RANGES else (None, None)
        out = self.tensor(name, shape, self.dtype, *quant)
        self._rms[out] = min(rms * math.sqrt(power), max(-lo, hi))
        return out

    def _like(self, name: str, x: int, shape: Sequence[int]) -> int:
        """A tensor with the dtype, quantization and range of `x`."""
        source = self._tensors[x]
        index = self._add_tensor(name, shape, self.dtype, source.quantization)
        self._rms[index] = self._estimate(x)
        return index

    def _weighted(
        self,
        kind: str,
        opcode: str,
        x: int,
        weights: np.ndarray,
        channel_axis: int,
        out_shape: Sequence[int],
        options: dict[str, object],
        activation: str,
    ) -> int:
        """Add filter and bias constants and the operator; quantizes them in int8 and int16 mode
        (int8 weights per channel, symmetric) and in uint8 mode (per tensor, asymmetric, as
        legacy converters)."""
        name = self._layer(kind)
        axes = tuple(i for i in range(weights.ndim) if i != channel_axis)
        bias = self.rng.normal(0.0, _BIAS_STD, weights.shape[channel_axis])
        if self.dtype in ("int8", "int16"):
            weight_scale = np.abs(weights).max(axis=axes) / 127.0
            broadcast = np.expand_dims(weight_scale, axes)
            q_weights = np.clip(np.round(weights / broadcast), -127, 127).astype(np.int8)
            bias_scale = self._input_scale(x) * weight_scale
            q_bias = np.round(bias / bias_scale).astype(_BIAS_TYPES[self.dtype])
            weights, bias = q_weights * broadcast, q_bias * bias_scale
            filter_index = self.const(
                f"{name}/filter", q_weights, weight_scale, 0, quantized_dimension=channel_axis
            )
            bias_index = self.const(f"{name}/bias", q_bias, bias_scale, 0)
        elif self.dtype == "uint8":
            lo, hi = min(float(weights.min()), 0.0), max(float(weights.max()), 0.0)
            weight_scale = max(hi - lo, 1e-6) / 255.0
            zero_point = int(np.clip(round(-lo / weight_scale), 0, 255))
            q_weights = np.clip(np.round(weights / weight_scale) + zero_point, 0, 255)
            bias_scale = self._input_scale(x) * weight_scale
            q_bias = np.round(bias / bias_scale).astype(np.int32)
            weights = (q_weights - zero_point) * weight_scale
            bias = q_bias * bias_scale
            filter_index = self.const(f"{name}/filter", q_weights.astype(np.uint8), weight_scale,
                                      zero_point)
            bias_index = self.const(f"{name}/bias", q_bias, bias_scale, 0)
        else:
            filter_index = self.const(f"{name}/filter", weights.astype(np.float32))
            bias_index = self.const(f"{name}/bias", bias.astype(np.float32))
        # Each output channel sums fan_in products: with roughly independent terms its
        # deviation is ||w_c|| times the input's root mean square.
        deviation = np.sqrt((weights**2).sum(axis=axes)) * self._estimate(x)
        rms = float(np.sqrt(np.mean(deviation**2 + bias**2)))
        out = self._activation_tensor(
            name, out_shape, float(bias.min()), float(bias.max()), rms, activation
        )
        self.op(opcode, [x, filter_index, bias_index], [out], options, self._version(opcode))
        return out

    def _pool(
        self, kind: str, opcode: str, x: int, size: Pair, stride: Pair | None, padding: str
    ) -> int:
        name = self._layer(kind)
        batch, height, width, channels = self.shape(x)
        (fh, fw) = _pair(size)
        (sh, sw) = _pair(size if stride is None else stride)
        out_shape = (
            batch,
            _OUTPUT_SIZE[padding](height, fh, sh),
            _OUTPUT_SIZE[padding](width, fw, sw),
            channels,
        )
        out = self._like(name, x, out_shape)
        options = {
            "padding": padding,
            "stride_h": sh,
            "stride_w": sw,
            "filter_height": fh,
            "filter_width": fw,
        }
        self.op(opcode, [x], [out], options, self._version(opcode))
        return out
