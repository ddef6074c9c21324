"""Params for the recurrent family: UNIDIRECTIONAL_SEQUENCE_LSTM, BIDIRECTIONAL_SEQUENCE_LSTM
and LSTM.

A cell's code is written once: `CellLayout` says where its tensors sit among its op's inputs
and `CellWiring` which input it reads and where its output goes. The bidirectional op is two
such cells (LiteRT's EvalFloat or EvalHybrid twice, the backward one walking time from the
end); the LSTM op's FULL kernel is one cell over one time step per invoke, and its BASIC
kernel (float32 only) a cell of its own (LstmBasicParams).

Follows LiteRT's reference kernel (tflite/kernels/unidirectional_sequence_lstm.cc, lstm_eval.cc
and the portable tensor_utils), in three forms:
- int8 activations and weights with an int16 cell state (LiteRT's "8x8_16" integer path). Every
  gate's pre-activation is an int16 in Q3.12 (with layer norm, at the scale of the op's
  intermediate tensor for that gate): the input and the recurrent matrix products are each
  requantized by their own multiplier and saturated in turn, the zero points folded into
  per-row biases here. The gates go through gemmlowp's int16 fixed-point logistic and tanh, the
  cell update rounds each of its products once, and the hidden values are requantized at the
  scale of the op's fifth intermediate tensor. TFLite Micro's integer LSTM is another algorithm
  (table-driven int16 sigmoid and tanh, double rounding in the cell update): arenac follows
  LiteRT, the oracle, and the two disagree on the same model.
- float32, with the fused activation on the cell gate and on the cell (LiteRT's integer path
  uses tanh there whatever the option says, and so does arenac's).
- hybrid: float32 activations with int8 weights (LstmHybridParams), the float cell whose
  matrix products take int8 rows quantized at every step as toolchain/ops/hybrid.py describes.

The output state and the cell state are variable tensors: they persist in the state block
across invokes and the kernels read and write them in place (an int8 output state starts at its
zero point, as in LiteRT).

What LiteRT's kernel does that arenac does not reproduce is refused here: a cell-state scale
whose tanh LiteRT skips (it then reads a stale scratch buffer), peephole weights walked past the
cell state (a projection to more outputs than cells), models on which LiteRT's prepare silently
leaves its multipliers at zero (a missing quantization), sums that would overflow LiteRT's int32
arithmetic, diagonal recurrent weights and uint8 weights.

int16 activations with int8 weights and an int16 cell state (int16x8), which LiteRT's prepare
refuses, follow TFLite Micro's kernel, the interpreter `check` then uses as the oracle
(LstmInt16Params): each gate's input and recurrent products are int64 sums requantized by
TFLite's int64 MultiplyByQuantizedMultiplier and saturated to int16 each, then summed and
saturated; the gates go through the int16 LOGISTIC and TANH's table (the kernels of
toolchain/ops/activations/); every product of the cell update and of the hidden values is an
elementwise int16 MUL (MultiplyByQuantizedMultiplier of the int32 product, saturated). TFLite
Micro runs the standard LSTM only: CIFG, peephole, projection and layer norm are refused, as
its prepare refuses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import INT32_MAX, Graph, Operator, Tensor
from toolchain.numerics.fixedpoint import rounding_divide_by_pot
from toolchain.numerics.gemmlowp import (
    EXP_BARREL_SHIFTER,
    EXP_MINUS_ONE_EIGHTH,
    FORTY_EIGHT_OVER_SEVENTEEN_Q2,
    MINUS_THIRTY_TWO_OVER_SEVENTEEN_Q2,
    ONE_THIRD,
)
from toolchain.numerics.quant import MAX_SHIFT, quantize_multiplier
from toolchain.numerics.tables import checked_log2
from toolchain.ops.activations.prepare import Int16SigmoidParams
from toolchain.ops.spec import MemoryRequest, required_input

GATES = ("input", "forget", "cell", "output")
# Positions of the op's inputs (LiteRT's lstm::full tensor indices).
INPUT = 0
INPUT_WEIGHTS = (1, 2, 3, 4)  # input -> each gate, [n_cell, n_input]
RECURRENT_WEIGHTS = (5, 6, 7, 8)  # output state -> each gate, [n_cell, n_output]
PEEPHOLE_WEIGHTS = {"input": 9, "forget": 10, "output": 11}  # cell state -> gate, [n_cell]
GATE_BIASES = (12, 13, 14, 15)
PROJECTION_WEIGHTS, PROJECTION_BIAS = 16, 17
OUTPUT_STATE, CELL_STATE = 18, 19
LAYER_NORM_COEFFICIENTS = (20, 21, 22, 23)
HIDDEN_INTERMEDIATE = 4


@dataclass(frozen=True)
class CellLayout:
    """Where one LSTM cell's tensors sit among its op's inputs: the unidirectional op holds one
    cell, the bidirectional op a forward and a backward cell (and weights for an auxiliary
    input). `peephole` is the input, forget and output gates' in turn."""

    input_weights: tuple[int, ...]
    recurrent_weights: tuple[int, ...]
    peephole: tuple[int, ...]
    biases: tuple[int, ...]
    projection: int
    projection_bias: int
    output_state: int
    cell_state: int
    layer_norm: tuple[int, ...] = ()
    aux_weights: tuple[int, ...] = ()

    @property
    def peephole_of(self) -> dict[str, int]:
        return dict(zip(PEEPHOLE_WEIGHTS, self.peephole, strict=True))


UNIDIRECTIONAL = CellLayout(INPUT_WEIGHTS, RECURRENT_WEIGHTS, tuple(PEEPHOLE_WEIGHTS.values()),
                            GATE_BIASES, PROJECTION_WEIGHTS, PROJECTION_BIAS, OUTPUT_STATE,
                            CELL_STATE, LAYER_NORM_COEFFICIENTS)


@dataclass(frozen=True)
class CellWiring:
    """How one cell's sequence meets its op: the input it reads (and the auxiliary input whose
    `n_aux` values per row its layout's aux weights multiply, if any), the output it writes
    from column `output_offset` of rows `output_width` wide (its n_output unless the two cells
    of a bidirectional op merge their outputs), and whether it walks time backwards."""

    layout: CellLayout = UNIDIRECTIONAL
    input: int = INPUT
    aux_input: int | None = None
    n_aux: int = 0
    output: int = 0
    output_offset: int = 0
    output_width: int | None = None
    reverse: bool = False
    one_step: bool = False  # the LSTM op: one time step of [batch, n_input] per invoke
    what: str = ""  # the cell as comments name it ("the forward cell"), "" for the only one


# BIDIRECTIONAL_SEQUENCE_LSTM's 48 inputs: the input, each cell's 17 weights and biases (the
# unidirectional op's first 17, in the same order), the four states, the auxiliary input and
# each cell's four weights for it. It has no layer norm.
BIDIRECTIONAL_INPUTS = 48
CELL_TENSORS = 17
AUX_INPUT = 39


def _bidirectional_layout(cell: int) -> CellLayout:
    """The forward (0) or the backward (1) cell's positions."""
    base = cell * CELL_TENSORS

    def shifted(positions: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(base + k for k in positions)

    return CellLayout(shifted(INPUT_WEIGHTS), shifted(RECURRENT_WEIGHTS),
                      shifted(tuple(PEEPHOLE_WEIGHTS.values())), shifted(GATE_BIASES),
                      base + PROJECTION_WEIGHTS, base + PROJECTION_BIAS, 35 + 2 * cell,
                      36 + 2 * cell, aux_weights=tuple(40 + 4 * cell + k for k in range(4)))


FORWARD, BACKWARD = _bidirectional_layout(0), _bidirectional_layout(1)

# The integer gates' pre-activations without layer norm: Q3.12.
GATE_SCALE_LOG2 = -12
GATE_INTEGER_BITS = 3
# LiteRT's int16 tanh exists for 0 to 6 integer bits; for a cell scale outside 2^-15..2^-9 it
# writes nothing and the hidden values come from a stale scratch buffer.
CELL_INTEGER_BITS = range(0, 7)
# LiteRT's float activations of the cell gate and the cell (ApplyActivationToVector); NONE
# leaves its output buffer unwritten there, so the gate keeps stale scratch.
FLOAT_ACTIVATIONS = ("TANH", "RELU", "RELU6", "RELU_N1_TO_1")


def constant16(raw32: int) -> int:
    """A gemmlowp Q0.31 (or Q2.29) constant as its int16 FixedPoint holds it: rounded to 16
    bits."""
    return int(rounding_divide_by_pot(raw32, 16))


# gemmlowp's constants of exp, logistic and tanh in int16.
EXP_MINUS_ONE_EIGHTH16 = constant16(EXP_MINUS_ONE_EIGHTH)
ONE_THIRD16 = constant16(ONE_THIRD)
EXP_BARREL_SHIFTER16 = tuple((e, constant16(m)) for e, m in EXP_BARREL_SHIFTER)
FORTY_EIGHT_OVER_SEVENTEEN16 = constant16(FORTY_EIGHT_OVER_SEVENTEEN_Q2)
MINUS_THIRTY_TWO_OVER_SEVENTEEN16 = constant16(MINUS_THIRTY_TWO_OVER_SEVENTEEN_Q2)
ONE_EIGHTH16 = 1 << 12  # 1/8 in Q0.15
ONE_Q2 = 1 << 13  # 1.0 in Q2.13
# int8 operands of a matrix product are at most 128 in magnitude.
INT8_MAGNITUDE = 128
INT16_MAGNITUDE = 32768


@dataclass(frozen=True)
class LstmShape:
    """The sequence: `time` steps of `batch` rows of `n_input` values; `n_cell` cells and
    `n_output` outputs (n_cell, or the projection's rows). A time-major input is [time, batch,
    n_input], else [batch, time, n_input]; the output is the same with n_output."""

    batch: int
    time: int
    n_input: int
    n_cell: int
    n_output: int
    time_major: bool

    @property
    def rows(self) -> int:
        """Batch rows one step computes: all of them time-major, one at a time otherwise."""
        return self.batch if self.time_major else 1


@dataclass(frozen=True)
class GateProducts:
    """What every integer gate requantizes: its input and recurrent products, each with its
    bias (the zero points folded in), by a multiplier and shift of its own."""

    name: str
    input_multiplier: int
    input_shift: int
    recurrent_multiplier: int
    recurrent_shift: int
    input_bias: tuple[int, ...]
    recurrent_bias: tuple[int, ...]


@dataclass(frozen=True)
class IntegerGate(GateProducts):
    """One gate of the integer LSTM. Its pre-activation is
    sat16(sat16(mbqm(input_bias + x . W_in)) + mbqm(recurrent_bias + h . W_rec)), in Q3.12 or,
    with layer norm, at its intermediate's scale; the biases fold the zero points in (the gate's
    own bias too, unless layer norm adds it after normalizing). A peephole adds
    mbqm(w_peephole * c); layer norm rescales by norm_multiplier and norm_shift (LiteRT's +12
    included) and falls back to `variance_guard` for a variance below 1."""

    peephole_multiplier: int = 0
    peephole_shift: int = 0
    norm_multiplier: int = 0
    norm_shift: int = 0
    variance_guard: int = 0


@dataclass(frozen=True)
class LstmIntegerParams:
    """int8 activations and weights, int16 cell state (LiteRT's 8x8_16 kernel).

    `gates` holds the input gate (absent under CIFG, where it is 32767 - forget), forget, cell
    and output gates. The cell update is c = clip(sat16(rdbpot(f * c, 15) + rdbpot(i * g,
    cell_shift))); the hidden value is mbqm(o * tanh(c), hidden) + hidden_zero_point, tanh(c)
    read with cell_integer_bits; with a projection the hidden value takes -hidden_zero_point
    (as LiteRT) and the output is sat8(mbqm(projection_bias + hidden . W_proj) +
    output_zero_point), clipped to +-projection_clip when that is positive. A clip of 0 is off.
    """

    shape: LstmShape
    gates: tuple[IntegerGate, ...]
    cifg: bool
    peephole: bool
    layer_norm: bool
    projection: bool
    cell_shift: int
    cell_integer_bits: int
    cell_clip: int
    hidden_multiplier: int
    hidden_shift: int
    hidden_zero_point: int
    output_zero_point: int
    projection_multiplier: int = 0
    projection_shift: int = 0
    projection_bias: tuple[int, ...] = ()
    projection_clip: int = 0
    wiring: CellWiring = CellWiring()

    def gate(self, name: str) -> IntegerGate:
        return next(g for g in self.gates if g.name == name)


@dataclass(frozen=True)
class Int16Gate(GateProducts):
    """One gate of the int16x8 LSTM: sat16(sat16(rq(input_bias + x . W_in)) +
    sat16(rq(recurrent_bias + h . W_rec))), each sum in int64 and rq TFLite's int64
    MultiplyByQuantizedMultiplier, (acc * multiplier + 2^(shift - 1)) >> shift wrapped to
    int32, with the multiplier already rounded to 16 bits and `shift` the whole right shift.
    The biases fold the zero points in (the input product's holds the gate's bias too)."""


# The int16x8 gates' activations: their pre-activations are Q3.12, which the int16 LOGISTIC
# and TANH read at 3 * 2^0 steps of 1 / (3 * 4096) per unit.
INT16_SIGMOID = Int16SigmoidParams("LOGISTIC", 3, 0)
INT16_GATE_TANH = Int16SigmoidParams("TANH", 3, 0)


@dataclass(frozen=True)
class LstmInt16Params:
    """int16 activations, int8 weights, int16 cell state (TFLite Micro's kernel): the four
    gates (always all four, no variants), then c = clip(sat16(sat16(mul(f, c, forget)) +
    sat16(mul(i, g, update)))) and h = sat16(mul(tanh(c), o, hidden) + hidden_zero_point),
    where mul(a, b, m) is MultiplyByQuantizedMultiplier(a * b) by multiplier and shift m and
    tanh(c) reads the cell state by `cell_tanh`. The output rows are copies of h. A cell clip
    of None is off."""

    shape: LstmShape
    gates: tuple[Int16Gate, ...]
    cell_tanh: Int16SigmoidParams
    forget_multiplier: int
    forget_shift: int
    update_multiplier: int
    update_shift: int
    hidden_multiplier: int
    hidden_shift: int
    hidden_zero_point: int
    cell_clip: int | None = None
    wiring: CellWiring = CellWiring()
    # the variants the shared C and scratch code asks every cell about: TFLite Micro runs none
    cifg: bool = False
    peephole: bool = False
    layer_norm: bool = False
    projection: bool = False

    def gate(self, name: str) -> Int16Gate:
        return next(g for g in self.gates if g.name == name)


@dataclass(frozen=True)
class LstmFloatParams:
    """float32 (LiteRT's EvalFloat): gate = act(bias + W_in . x + W_rec . h [+ w_peep * c]),
    with layer norm act(coefficients * normalize(...) + bias); sigmoid for the input, forget and
    output gates, `activation` for the cell gate. c = clip(f * c + i * g) (i = 1 - f under
    CIFG), h = o * activation(c), then the projection W_proj . h + bias, clipped. A clip of 0 is
    off."""

    shape: LstmShape
    cifg: bool
    peephole: bool
    layer_norm: bool
    projection: bool
    projection_bias: bool
    activation: str
    cell_clip: float
    projection_clip: float
    wiring: CellWiring = CellWiring()


@dataclass(frozen=True)
class LstmBasicParams:
    """The LSTM op's BASIC kernel in float32 (LiteRT's LstmCell): the input and the previous
    activation concatenated (`concat`, [batch, n_input + depth]), one fully connected layer to
    the four gates' pre-activations (`gates`, [batch, 4 * depth]: input, new input, forget,
    output), state = sigmoid(i) * tanh(g) + sigmoid(f) * previous state, activation =
    sigmoid(o) * tanh(state). Inputs 1 and 4 (the previous activation and state) are variables
    the kernel then overwrites, as LiteRT copies its outputs back into them."""

    batch: int
    n_input: int
    depth: int


BASIC_INPUTS = ("input", "previous activation", "weights", "bias", "previous state")


@dataclass(frozen=True)
class LstmHybridParams(LstmFloatParams):
    """float32 activations with int8 weights (LiteRT's EvalHybrid): the float cell, each matrix
    product taken over int8 rows quantized from the float input, output state and (before a
    projection) hidden values at every step, as toolchain/ops/hybrid.py describes:
    gate += float(q . w - zero_point * row_sum) * (row scale * weight scale). Peephole weights
    are int8 too, used as float32(w) * scale. `input_scales` and `recurrent_scales` hold each
    gate's (0 for an absent input gate); the row sums are set with `asymmetric` only."""

    asymmetric: bool = False
    input_scales: tuple[float, ...] = ()
    recurrent_scales: tuple[float, ...] = ()
    peephole_weights: tuple[tuple[float, ...], ...] = ()  # input, forget, output: float32(w) * s
    projection_scale: float = 0.0
    input_row_sums: tuple[tuple[int, ...], ...] = ()
    recurrent_row_sums: tuple[tuple[int, ...], ...] = ()
    projection_row_sums: tuple[int, ...] = ()
    aux_scales: tuple[float, ...] = ()  # with an auxiliary input (the bidirectional op)
    aux_row_sums: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class BidirectionalLstmParams:
    """BIDIRECTIONAL_SEQUENCE_LSTM: two float (or hybrid) cells over one sequence, the
    backward one walking it from its end; their wirings say which input each reads (the
    backward cell reads the auxiliary input instead when the op has one without weights for
    it), and which output and columns each writes (one output, the forward cell's columns
    first, when merged)."""

    forward: LstmFloatParams
    backward: LstmFloatParams
    merge_outputs: bool


# -- prepare ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Operands:
    """The op's tensors by role (None where absent) and the sizes they agree on."""

    x: Tensor
    input_weights: dict[str, Tensor]
    recurrent_weights: dict[str, Tensor]
    peephole: dict[str, Tensor]
    biases: dict[str, Tensor]
    norm: dict[str, Tensor]
    projection: Tensor | None
    projection_bias: Tensor | None
    output_state: Tensor
    cell_state: Tensor
    output: Tensor
    shape: LstmShape


def prepare_lstm(graph: Graph, op: Operator,
                 wiring: CellWiring = CellWiring()) -> LstmIntegerParams | LstmFloatParams:
    if len(op.inputs) not in (20, 24):
        raise ModelError(f"{len(op.inputs)} inputs (LiteRT's kernel takes 20 or 24)")
    if len(op.outputs) != 1:
        raise ModelError(f"{len(op.outputs)} outputs (LiteRT's kernel writes 1)")
    operands = _operands(graph, op, wiring)
    _require_output(graph, op, 0, (*operands.x.shape[:-1], operands.shape.n_output))
    activation = op.options.get("fused_activation_function", "NONE")
    if operands.x.dtype == "float32" and operands.input_weights["output"].dtype == "int8":
        return _prepare_hybrid(operands, op, _prepare_float(operands, op, activation, wiring))
    if operands.x.dtype == "float32":
        return _prepare_float(operands, op, activation, wiring)
    if operands.x.dtype == "int16":
        return replace(_prepare_int16(op, operands, activation), wiring=wiring)
    return replace(_prepare_integer(graph, op, operands), wiring=wiring)


def prepare_lstm_step(graph: Graph, op: Operator) -> LstmIntegerParams | LstmFloatParams:
    """The LSTM op (LiteRT's lstm.cc): its FULL kernel is the unidirectional op's cell over one
    time step of [batch, n_input] per invoke, with the same inputs."""
    kernel = op.options.get("kernel_type", "FULL")
    if kernel == "BASIC":
        return _prepare_basic(graph, op)
    if kernel != "FULL":
        raise UnsupportedOpError(f"kernel type {kernel} (arenac runs FULL and BASIC)")
    x = required_input(graph, op, INPUT, "input")
    if len(op.intermediates) == 12 and x.dtype == "int8":
        raise UnsupportedOpError("12 intermediate tensors: LiteRT's 8x8_8 integer kernel (arenac "
                                 "runs the 8x8_16 one, with 5)")
    return prepare_lstm(graph, op, CellWiring(one_step=True))


def _prepare_basic(graph: Graph, op: Operator) -> LstmBasicParams:
    """LiteRT's basic::Prepare, and the float32 types its Eval runs (uint8 is its quantized
    LstmCell, which arenac does not run)."""
    if len(op.inputs) != 5 or len(op.outputs) != 4:
        raise ModelError(f"{len(op.inputs)} inputs and {len(op.outputs)} outputs (LiteRT's "
                         "BASIC kernel takes 5 and writes 4)")
    x, h, w, bias, c = (required_input(graph, op, k, what)
                        for k, what in enumerate(BASIC_INPUTS))
    if len(x.shape) != 2 or len(h.shape) != 2 or h.shape[0] != x.shape[0]:
        raise ModelError(f"input {list(x.shape)} and previous activation {list(h.shape)} "
                         "(LiteRT needs [batch, n] and [batch, depth])")
    batch, n_input, depth = x.shape[0], x.shape[1], h.shape[1]
    for t, expected, what in ((w, (4 * depth, n_input + depth), "weights"),
                              (bias, (4 * depth,), "bias"), (c, (batch, depth), "previous state")):
        if tuple(t.shape) != expected:
            raise ModelError(f"the {what} have shape {list(t.shape)}, not {list(expected)}")
    for t, what in ((h, "previous activation"), (c, "previous state")):
        if not t.is_variable:
            raise UnsupportedOpError(f"the {what} is not a variable tensor (arenac keeps the "
                                     "state LiteRT makes persistent in variables)")
    if op.inputs[1] == op.inputs[4]:
        raise UnsupportedOpError("the previous activation and state are one tensor")
    # the activation, the state, the concatenation and the gates' pre-activations
    expected = ((batch, depth), (batch, depth), (batch, n_input + depth), (batch, 4 * depth))
    for k, shape in enumerate(expected):
        _require_output(graph, op, k, shape)
    return LstmBasicParams(batch, n_input, depth)


def prepare_bidirectional_lstm(graph: Graph, op: Operator) -> BidirectionalLstmParams:
    """LiteRT's bidirectional Prepare and Eval: EvalFloat once per cell."""
    options = op.options
    merge = bool(options.get("merge_outputs", False))
    if len(op.inputs) != BIDIRECTIONAL_INPUTS:
        raise ModelError(f"{len(op.inputs)} inputs (LiteRT's kernel takes 48)")
    if len(op.outputs) != (1 if merge else 2):
        raise ModelError(f"{len(op.outputs)} outputs (LiteRT's kernel writes "
                         f"{'1 with merge_outputs' if merge else '2 without merge_outputs'})")
    x = required_input(graph, op, INPUT, "input")
    aux = None if op.inputs[AUX_INPUT] < 0 else graph.tensors[op.inputs[AUX_INPUT]]
    present = [op.inputs[k] >= 0 for layout in (FORWARD, BACKWARD)
               for k in layout.aux_weights[1:]]
    if any(present) and not all(present):
        raise ModelError("the auxiliary weights of the forget, cell and output gates must be "
                         "present for both cells or for neither")
    with_weights = all(present)
    if aux is not None or with_weights:
        if aux is None:
            raise ModelError("auxiliary weights without the auxiliary input (input 39)")
        if len(aux.shape) != 3 or aux.shape[:2] != x.shape[:2] or (
                not with_weights and aux.shape != x.shape):
            raise ModelError(f"the auxiliary input has shape {list(aux.shape)} (LiteRT needs "
                             f"{list(x.shape[:2])} ahead of its features"
                             + ("" if with_weights else f", and {x.shape[2]} features without "
                                "weights for it") + ")")
    cells = []
    for layout, direction in ((FORWARD, "forward"), (BACKWARD, "backward")):
        # Without weights for it, the auxiliary input is the backward cell's input.
        reads = AUX_INPUT if aux is not None and not with_weights and layout is BACKWARD \
            else INPUT
        wiring = CellWiring(layout, reads, AUX_INPUT if with_weights else None,
                            aux.shape[2] if with_weights else 0, reverse=layout is BACKWARD,
                            what=f"the {direction} cell")
        try:
            o = _operands(graph, op, wiring)
            if with_weights:
                _check_aux_weights(graph, op, o, layout, aux.shape[2])
        except (ModelError, UnsupportedOpError) as e:
            raise type(e)(f"the {direction} cell: {e.message}") from None
        cells.append((o, wiring))
    (fw, fw_wiring), (bw, bw_wiring) = cells
    if (fw.shape.n_cell, fw.shape.n_output) != (bw.shape.n_cell, bw.shape.n_output):
        raise ModelError(f"the forward cell has {fw.shape.n_cell} cells and {fw.shape.n_output} "
                         f"outputs, the backward {bw.shape.n_cell} and {bw.shape.n_output} "
                         "(LiteRT checks both against the forward cell's)")
    n_output = fw.shape.n_output
    if merge:
        if not fw.shape.time_major and fw.shape.batch > 1:
            raise UnsupportedOpError(
                f"merged outputs of {fw.shape.batch} batch-major rows (LiteRT steps each row's "
                "output state by the merged width and runs past the state's end)")
        _require_output(graph, op, 0, (*x.shape[:-1], 2 * n_output))
        fw_wiring = replace(fw_wiring, output_width=2 * n_output)
        bw_wiring = replace(bw_wiring, output_width=2 * n_output, output_offset=n_output)
    else:
        _require_output(graph, op, 0, (*x.shape[:-1], n_output))
        _require_output(graph, op, 1, (*x.shape[:-1], n_output))
        bw_wiring = replace(bw_wiring, output=1)
    activation = options.get("fused_activation_function", "NONE")
    cells = []
    for o, wiring in ((fw, fw_wiring), (bw, bw_wiring)):
        cell = _prepare_float(o, op, activation, wiring)
        if o.input_weights["output"].dtype == "int8":
            aux_weights = {g: graph.tensors[op.inputs[wiring.layout.aux_weights[k]]]
                           for k, g in enumerate(GATES) if g in o.input_weights
                           } if with_weights else None
            cell = _prepare_hybrid(o, op, cell, aux_weights)
        cells.append(cell)
    return BidirectionalLstmParams(*cells, merge)


def _check_aux_weights(graph: Graph, op: Operator, o: _Operands, layout: CellLayout,
                       n_aux: int) -> None:
    """CheckAuxInputTensorDimensions: [n_cell, n_aux] for each gate the cell computes (LiteRT
    reads the input gate's whenever the cell has that gate)."""
    for k, gate in enumerate(GATES):
        position = layout.aux_weights[k]
        if gate not in o.input_weights:
            continue
        if op.inputs[position] < 0:
            raise ModelError(f"the {gate} gate's auxiliary weights are missing")
        _require_shape(graph.tensors[op.inputs[position]], (o.shape.n_cell, n_aux),
                       f"the {gate} gate's auxiliary weights")


def _require_output(graph: Graph, op: Operator, index: int, expected: tuple[int, ...]) -> None:
    output = graph.tensors[op.outputs[index]]
    if output.shape != expected:
        raise UnsupportedOpError(f"output of shape {list(output.shape)} (LiteRT writes "
                                 f"{list(expected)})")


def _optional(graph: Graph, op: Operator, position: int) -> Tensor | None:
    """The input at `position`, None where the op leaves it out."""
    if position >= len(op.inputs) or op.inputs[position] < 0:
        return None
    return graph.tensors[op.inputs[position]]


def _sequence(graph: Graph, op: Operator, wiring: CellWiring
              ) -> tuple[Tensor, bool, int, int, int]:
    """The input and how it holds the sequence: (input, time_major, time, batch, n_input)."""
    x = required_input(graph, op, wiring.input, "input")
    if wiring.one_step:
        if len(x.shape) != 2:
            raise UnsupportedOpError(f"input of rank {len(x.shape)} (LiteRT's LSTM reads "
                                     "[batch, features])")
        return x, True, 1, x.shape[0], x.shape[1]
    if len(x.shape) != 3:
        raise UnsupportedOpError(f"input of rank {len(x.shape)} (LiteRT reads [batch, time, "
                                 "features] or, time-major, [time, batch, features])")
    time_major = bool(op.options.get("time_major", False))
    time, batch = (x.shape[0], x.shape[1]) if time_major else (x.shape[1], x.shape[0])
    return x, time_major, time, batch, x.shape[2]


def _gate_weights(graph: Graph, op: Operator, layout: CellLayout, n_input: int
                  ) -> tuple[dict[str, Tensor], dict[str, Tensor], int, int]:
    """Each present gate's input and recurrent weights (the input gate's absent under CIFG),
    checked against each other; and n_cell and n_output, which they give."""
    input_weights, recurrent_weights = {}, {}
    for k, gate in enumerate(GATES):
        w = _optional(graph, op, layout.input_weights[k])
        r = _optional(graph, op, layout.recurrent_weights[k])
        if gate == "input":
            if (w is None) != (r is None):
                raise ModelError("the input gate's input and recurrent weights must be both "
                                 "present or both absent (CIFG)")
        elif w is None or r is None:
            raise ModelError(f"the {gate} gate's weights are missing")
        if w is not None:
            input_weights[gate], recurrent_weights[gate] = w, r
    n_cell = input_weights["output"].shape[0] if input_weights["output"].shape else 0
    if any(len(r.shape) == 1 for r in recurrent_weights.values()):
        raise UnsupportedOpError("diagonal (1-D) recurrent weights")
    n_output = recurrent_weights["output"].shape[1] if len(
        recurrent_weights["output"].shape) == 2 else 0
    for gate in input_weights:
        _require_shape(input_weights[gate], (n_cell, n_input), f"the {gate} gate's input weights")
        _require_shape(recurrent_weights[gate], (n_cell, n_output),
                       f"the {gate} gate's recurrent weights")
    return input_weights, recurrent_weights, n_cell, n_output


def _peepholes(graph: Graph, op: Operator, layout: CellLayout, cifg: bool,
               n_cell: int) -> dict[str, Tensor]:
    """The peephole weights of each gate that has one: every gate's or none."""
    peephole = {g: _optional(graph, op, at) for g, at in layout.peephole_of.items()}
    if peephole["output"] is not None:
        if peephole["forget"] is None or (peephole["input"] is None and not cifg):
            raise ModelError("peephole weights must be present for every gate or none")
    elif any(w is not None for w in peephole.values()):
        raise ModelError("peephole weights must be present for every gate or none")
    peephole = {g: w for g, w in peephole.items()
                if w is not None and not (cifg and g == "input")}
    for gate, w in peephole.items():
        _require_shape(w, (n_cell,), f"the {gate} gate's peephole weights")
    return peephole


def _per_gate(graph: Graph, op: Operator, positions: tuple[int, ...], cifg: bool, n_cell: int,
              what: str, missing: str, under_cifg: str) -> dict[str, Tensor]:
    """A vector of n_cell values per gate (the biases, the layer norm coefficients): every
    gate's but the input gate's under CIFG, which must have none (else `under_cifg`)."""
    found = {}
    for k, gate in enumerate(GATES):
        vector = _optional(graph, op, positions[k])
        if gate == "input" and cifg:
            if vector is not None:
                raise ModelError(under_cifg)
            continue
        if vector is None:
            raise ModelError(f"the {gate} gate's {what} {missing}")
        _require_shape(vector, (n_cell,), f"the {gate} gate's {what}")
        found[gate] = vector
    return found


def _projection(graph: Graph, op: Operator, layout: CellLayout, n_cell: int,
                n_output: int) -> tuple[Tensor | None, Tensor | None]:
    """The projection weights and bias, if any: without them n_output must be n_cell."""
    projection = _optional(graph, op, layout.projection)
    projection_bias = _optional(graph, op, layout.projection_bias)
    if projection is not None:
        _require_shape(projection, (n_output, n_cell), "the projection weights")
    elif projection_bias is not None:
        raise ModelError("a projection bias without projection weights")
    elif n_output != n_cell:
        raise ModelError(f"{n_output} outputs for {n_cell} cells without a projection")
    if projection_bias is not None:
        _require_shape(projection_bias, (n_output,), "the projection bias")
    return projection, projection_bias


def _states(graph: Graph, op: Operator, layout: CellLayout, batch: int, n_output: int,
            n_cell: int) -> tuple[Tensor, Tensor]:
    """The output state and the cell state: variable tensors of their own, of their sizes."""
    states = []
    for position, what, size in ((layout.output_state, "output state", batch * n_output),
                                 (layout.cell_state, "cell state", batch * n_cell)):
        state = required_input(graph, op, position, what)
        if not state.is_variable:
            raise ModelError(f"the {what} (input {position}) is not a variable tensor")
        if state.num_elements != size:
            raise ModelError(f"the {what} holds {state.num_elements} values, not {size}")
        states.append(state)
    if op.inputs[layout.output_state] == op.inputs[layout.cell_state]:
        raise UnsupportedOpError("the output state and the cell state are one tensor")
    return states[0], states[1]


def _operands(graph: Graph, op: Operator, wiring: CellWiring) -> _Operands:
    """LiteRT's Prepare and CheckInputTensorDimensions for one cell, on every dtype."""
    layout = wiring.layout
    options = op.options
    if options.get("diagonal_recurrent_tensors", False):
        raise UnsupportedOpError("diagonal recurrent weights")
    cell_clip = float(options.get("cell_clip", 0.0))
    proj_clip = float(options.get("proj_clip", 0.0))
    if not (cell_clip >= 0 and proj_clip >= 0):
        raise ModelError(f"cell_clip {cell_clip} and proj_clip {proj_clip} must not be negative")
    x, time_major, time, batch, n_input = _sequence(graph, op, wiring)
    input_weights, recurrent_weights, n_cell, n_output = _gate_weights(graph, op, layout, n_input)
    cifg = "input" not in input_weights
    peephole = _peepholes(graph, op, layout, cifg, n_cell)
    biases = _per_gate(graph, op, layout.biases, cifg, n_cell, "bias", "is missing",
                       "an input gate bias under CIFG (no input gate)")
    projection, projection_bias = _projection(graph, op, layout, n_cell, n_output)
    norm = {}
    if layout.layer_norm and _optional(graph, op, layout.layer_norm[1]) is not None:
        norm = _per_gate(graph, op, layout.layer_norm, cifg, n_cell, "layer norm coefficients",
                         "are missing", "input gate layer norm coefficients under CIFG")
    output_state, cell_state = _states(graph, op, layout, batch, n_output, n_cell)
    output = graph.tensors[op.outputs[wiring.output]]
    shape = LstmShape(batch, time, n_input, n_cell, n_output, time_major)
    return _Operands(x, input_weights, recurrent_weights, peephole, biases, norm, projection,
                     projection_bias, output_state, cell_state, output, shape)


def _require_shape(t: Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != shape:
        raise ModelError(f"{what} have shape {list(t.shape)}, not {list(shape)}")


def _prepare_float(o: _Operands, op: Operator, activation: str,
                   wiring: CellWiring) -> LstmFloatParams:
    if activation not in FLOAT_ACTIVATIONS:
        raise UnsupportedOpError(f"fused activation {activation} (LiteRT's float kernel "
                                 "leaves the cell gate unwritten for it)")
    return LstmFloatParams(
        shape=o.shape, cifg="input" not in o.input_weights, peephole=bool(o.peephole),
        layer_norm=bool(o.norm), projection=o.projection is not None,
        projection_bias=o.projection_bias is not None, activation=activation,
        cell_clip=float(np.float32(op.options.get("cell_clip", 0.0))),
        projection_clip=float(np.float32(op.options.get("proj_clip", 0.0))), wiring=wiring)


def _prepare_hybrid(o: _Operands, op: Operator, cell: LstmFloatParams,
                    aux: dict[str, Tensor] | None = None) -> LstmHybridParams:
    """LiteRT's EvalHybrid: per-tensor weight scales (their zero points ignored, as LiteRT
    does), and with asymmetric_quantize_inputs the row sums of every weight matrix (`aux`:
    the auxiliary input's weights per gate, if the cell has them)."""
    f32 = np.float32
    asymmetric = bool(op.options.get("asymmetric_quantize_inputs", False))

    def scale(t: Tensor | None, what: str) -> float:
        return 0.0 if t is None else float(f32(_quantized(t, what)[0]))

    def row_sums(t: Tensor | None, what: str) -> tuple[int, ...]:
        if t is None or not asymmetric:
            return ()
        if t.data is None:
            raise UnsupportedOpError(f"{what} ({t.name!r}) are not a constant (their row sums "
                                     "are taken at prepare)")
        return tuple(int(v) for v in _int64(t).sum(axis=1))

    peephole = []
    for gate in PEEPHOLE_WEIGHTS:
        w = o.peephole.get(gate)
        if w is not None and w.data is None:
            raise UnsupportedOpError(f"the {gate} gate's peephole weights are not a constant")
        peephole.append(() if w is None else tuple(
            float(v) for v in (_int64(w).astype(f32) * f32(scale(w, "peephole weights")))))
    return LstmHybridParams(
        **{f.name: getattr(cell, f.name) for f in fields(cell)}, asymmetric=asymmetric,
        input_scales=tuple(scale(o.input_weights.get(g), f"the {g} gate's input weights")
                           for g in GATES),
        recurrent_scales=tuple(scale(o.recurrent_weights.get(g),
                                     f"the {g} gate's recurrent weights") for g in GATES),
        peephole_weights=tuple(peephole),
        projection_scale=scale(o.projection, "the projection weights"),
        input_row_sums=tuple(row_sums(o.input_weights.get(g), f"the {g} gate's input weights")
                             for g in GATES),
        recurrent_row_sums=tuple(row_sums(o.recurrent_weights.get(g),
                                          f"the {g} gate's recurrent weights") for g in GATES),
        projection_row_sums=row_sums(o.projection, "the projection weights"),
        aux_scales=tuple(scale(aux.get(g), f"the {g} gate's auxiliary weights")
                         for g in GATES) if aux else (),
        aux_row_sums=tuple(row_sums(aux.get(g), f"the {g} gate's auxiliary weights")
                           for g in GATES) if aux else ())


def _integer_gate_extras(o: _Operands, name: str, cell_log2: int, gate_scale: np.float32
                         ) -> dict:
    """A gate's peephole multiplier and shift, and its layer norm's, where it has them."""
    f32, shape = np.float32, o.shape
    extra = {}
    if name in o.peephole:
        w = o.peephole[name]
        real = f32(2.0**cell_log2 * float(f32(_quantized(w, "peephole weights")[0]))
                   / float(gate_scale))
        m, s = _multiplier(float(real), f"the {name} gate's peephole scale")
        _require_sum_fits(_int64(w)[:, None], np.zeros(shape.n_cell, np.int64),
                          INT16_MAGNITUDE, m, s, INT16_MAGNITUDE,
                          f"the {name} gate's peephole product")
        extra.update(peephole_multiplier=m, peephole_shift=s)
    if o.norm:
        norm_scale = f32(_quantized(o.norm[name], "layer norm coefficients")[0])
        m, s = _multiplier(float(norm_scale), f"the {name} gate's layer norm scale")
        if s + 12 > 30:
            raise UnsupportedOpError(f"the {name} gate's layer norm scale {norm_scale:.6g} "
                                     "needs a left shift beyond 30 bits")
        guard = max(1, int(f32(f32(10000) * norm_scale)))
        extra.update(norm_multiplier=m, norm_shift=s + 12, variance_guard=guard)
    return extra


def _integer_projection(o: _Operands, hidden_scale: float, hidden_zp: int,
                        out_state_scale: float, output_scale: float, proj_clip: float) -> dict:
    """The projection's multiplier and shift, its bias with the hidden zero point folded in,
    and its clip in output units."""
    f32 = np.float32
    proj_scale = _quantized(o.projection, "the projection weights")[0]
    real = f32(f32(proj_scale) * f32(hidden_scale)) / f32(out_state_scale)
    m, s = _multiplier(float(real), "the projection scale")
    weights = _int64(o.projection)
    bias = (np.zeros(o.shape.n_output, np.int64) if o.projection_bias is None
            else _int64(o.projection_bias)) + hidden_zp * weights.sum(axis=1)
    _require_sum_fits(weights, bias, INT8_MAGNITUDE, m, s, INT8_MAGNITUDE,
                      "the projection product")
    clip = 0
    if proj_clip > 0:
        clip = int(min(max(f32(proj_clip) / f32(output_scale), f32(-128)), f32(127)))
    return dict(projection_multiplier=m, projection_shift=s,
                projection_bias=_int32s(bias, "projection"), projection_clip=clip)


def _prepare_integer(graph: Graph, op: Operator, o: _Operands) -> LstmIntegerParams:
    """PopulateQuantizedLstmParams8x8_16 and PopulatePrecomputedZPTimesWeightsWithBias."""
    shape, f32 = o.shape, np.float32
    in_scale, in_zp = _quantized(o.x, "the input")
    out_state_scale, out_state_zp = _quantized(o.output_state, "the output state")
    cell_scale, _ = _quantized(o.cell_state, "the cell state")
    is_pot, cell_log2 = checked_log2(cell_scale)
    if not is_pot:
        raise UnsupportedOpError(f"cell state scale {cell_scale:.6g} is not a power of two "
                                 "(LiteRT then leaves its multipliers at zero)")
    if 15 + cell_log2 not in CELL_INTEGER_BITS:
        raise UnsupportedOpError(f"cell state scale 2^{cell_log2}: LiteRT's int16 tanh of the "
                                 "cell takes 2^-15 to 2^-9 and skips it otherwise")
    output_scale, _ = _quantized(o.output, "the output")
    if len(op.intermediates) != 5:
        raise ModelError(f"{len(op.intermediates)} intermediate tensors (the integer kernel "
                         "reads 5: the gates' and the hidden scales)")
    intermediates = [graph.tensors[t] for t in op.intermediates]
    hidden_scale, hidden_zp = _quantized(intermediates[HIDDEN_INTERMEDIATE],
                                         "the hidden intermediate (5th)")
    layer_norm = bool(o.norm)
    if o.peephole and shape.n_output > shape.n_cell:
        raise UnsupportedOpError(f"peephole weights with {shape.n_output} outputs for "
                                 f"{shape.n_cell} cells (LiteRT reads past the cell state)")
    _require_constant_weights(o)

    gates = []
    for k, name in enumerate(GATES):
        if name not in o.input_weights:
            continue
        gate_scale = f32(2.0**GATE_SCALE_LOG2)
        if layer_norm:
            gate_scale = f32(_quantized(intermediates[k], f"intermediate {k}")[0])
        w_in, w_rec = o.input_weights[name], o.recurrent_weights[name]
        in_real = f32(f32(_quantized(w_in, "weights")[0]) * f32(in_scale)) / gate_scale
        rec_real = f32(f32(_quantized(w_rec, "weights")[0]) * f32(out_state_scale)) / gate_scale
        w_in_values, w_rec_values = _int64(w_in), _int64(w_rec)
        bias = _int64(o.biases[name])
        input_bias = (0 if layer_norm else bias) - in_zp * w_in_values.sum(axis=1)
        recurrent_bias = -out_state_zp * w_rec_values.sum(axis=1)
        m_in, s_in = _multiplier(float(in_real), f"the {name} gate's input scale")
        m_rec, s_rec = _multiplier(float(rec_real), f"the {name} gate's recurrent scale")
        _require_sum_fits(w_in_values, input_bias, INT8_MAGNITUDE, m_in, s_in, INT16_MAGNITUDE,
                          f"the {name} gate's input product")
        _require_sum_fits(w_rec_values, recurrent_bias, INT8_MAGNITUDE, m_rec, s_rec,
                          INT16_MAGNITUDE, f"the {name} gate's recurrent product")
        gates.append(IntegerGate(name, m_in, s_in, m_rec, s_rec, _int32s(input_bias, name),
                                 _int32s(recurrent_bias, name),
                                 **_integer_gate_extras(o, name, cell_log2, gate_scale)))

    hidden_real = f32(2.0**-15 / float(f32(hidden_scale)) * 2.0**-15)
    m_hidden, s_hidden = _multiplier(float(hidden_real), "the hidden scale")
    _require_sum_fits(np.ones((1, 1), np.int64), np.zeros(1, np.int64), 2**30, m_hidden,
                      s_hidden, INT8_MAGNITUDE, "the hidden product")
    cell_clip = float(op.options.get("cell_clip", 0.0))
    proj_clip = float(op.options.get("proj_clip", 0.0))
    extra = {}
    if o.projection is not None:
        extra = _integer_projection(o, hidden_scale, hidden_zp, out_state_scale, output_scale,
                                    proj_clip)
    qcell_clip = 0
    if cell_clip > 0:
        qcell_clip = int(min(max(f32(cell_clip) / f32(cell_scale), f32(-32768)), f32(32767)))
    return LstmIntegerParams(
        shape=shape, gates=tuple(gates), cifg="input" not in o.input_weights,
        peephole=bool(o.peephole), layer_norm=layer_norm, projection=o.projection is not None,
        cell_shift=30 + cell_log2, cell_integer_bits=15 + cell_log2, cell_clip=qcell_clip,
        hidden_multiplier=m_hidden, hidden_shift=s_hidden, hidden_zero_point=hidden_zp,
        output_zero_point=out_state_zp, **extra)


# TFLite's int64 MultiplyByQuantizedMultiplier asserts an exponent below 8 and sums within
# 2^47.
INT16X8_MAX_EXPONENT = 7
INT16X8_SUM_LIMIT = 2**47
# The int16 TANH of the cell state scales it by 3 * 2^k: at most 2^14 keeps 3 * 2^15 * 2^k in
# int32; a right shift of more than 30 bits would be undefined in C.
CELL_TANH_SHIFTS = range(-30, 15)


def _prepare_int16(op: Operator, o: _Operands, activation: str) -> LstmInt16Params:
    """TFLite Micro's prepare for int16 activations: arenac refuses what it refuses, and
    what it would run with parameters left undefined, ignored or unapplied."""
    shape = o.shape
    if len(op.inputs) != 24:
        raise UnsupportedOpError(f"{len(op.inputs)} inputs (TFLite Micro's int16 kernel takes "
                                 "24)")
    variants = (("CIFG (no input gate)", "input" not in o.input_weights),
                ("peephole weights", bool(o.peephole)),
                ("a projection", o.projection is not None or o.projection_bias is not None),
                ("layer norm", bool(o.norm)))
    for what, present in variants:
        if present:
            raise UnsupportedOpError(f"int16 activations with {what}: TFLite Micro's kernel "
                                     "runs the standard LSTM only")
    if activation != "TANH":
        raise UnsupportedOpError(f"fused activation {activation} (TFLite Micro's int16 kernel "
                                 "applies only TANH to the cell gate, and nothing otherwise)")
    if len(o.output_state.shape) != 2 or o.output_state.shape[1] != shape.n_cell:
        raise UnsupportedOpError(f"output state of shape {list(o.output_state.shape)} (TFLite "
                                 f"Micro reads [batch, {shape.n_cell}])")
    _require_constant_weights(o)
    in_scale, in_zp = _quantized(o.x, "the input")
    state_scale, state_zp = _quantized(o.output_state, "the output state")
    cell_scale, _ = _quantized(o.cell_state, "the cell state")

    gates = []
    for name in GATES:
        products = []
        for w, scale, zp, bias, what in (
                (o.input_weights[name], in_scale, in_zp, o.biases[name], "input"),
                (o.recurrent_weights[name], state_scale, state_zp, None, "recurrent")):
            w_scale, w_zp = _quantized(w, f"the {name} gate's {what} weights")
            if w_zp:
                raise UnsupportedOpError(f"the {name} gate's {what} weights have zero point "
                                         f"{w_zp} (TFLite Micro's kernel needs 0)")
            # the two float32 scales' product in double, as this TFLite Micro build forms it
            real = scale * w_scale / 2.0**GATE_SCALE_LOG2
            multiplier, exponent = _multiplier(real, f"the {name} gate's {what} scale",
                                               INT16X8_MAX_EXPONENT)
            reduced = (multiplier + (1 << 15)) >> 16 if multiplier < 0x7FFF0000 else 0x7FFF
            values = _int64(w)
            folded = -zp * values.sum(axis=1) + (0 if bias is None else _int64(bias))
            largest = int((np.abs(folded) + INT16_MAGNITUDE * 2 * np.abs(values).sum(axis=1))
                          .max(initial=0))
            if largest >= INT16X8_SUM_LIMIT:  # then acc * reduced stays far within int64
                raise UnsupportedOpError(f"the {name} gate's {what} product could leave the "
                                         "2^47 TFLite's int64 requantization takes")
            products.append((reduced, 15 - exponent, tuple(int(v) for v in folded)))
        (m_in, s_in, b_in), (m_rec, s_rec, b_rec) = products
        gates.append(Int16Gate(name, m_in, s_in, m_rec, s_rec, b_in, b_rec))

    _, power = checked_log2(cell_scale)  # TFLite Micro takes the nearest power of two
    tanh_shift = 15 + power - 3
    if tanh_shift not in CELL_TANH_SHIFTS:
        raise UnsupportedOpError(f"cell state scale {cell_scale:.6g}: the int16 tanh of the "
                                 "cell would overflow or shift by more than 30 bits")
    cell_tanh = (Int16SigmoidParams("TANH", 3 << tanh_shift, 0) if tanh_shift >= 0
                 else Int16SigmoidParams("TANH", 3, -tanh_shift))
    gate_out = 2.0**-15
    forget = _multiplier(gate_out * cell_scale / cell_scale, "the forget product's scale")
    update = _multiplier(gate_out * gate_out / cell_scale, "the cell update's scale")
    hidden = _multiplier(gate_out * gate_out / state_scale, "the hidden scale")
    cell_clip = float(op.options.get("cell_clip", 0.0))
    clip = None
    if cell_clip > 0:
        clip = int(min(max(cell_clip / cell_scale, -32768.0), 32767.0))
    return LstmInt16Params(shape, tuple(gates), cell_tanh, *forget, *update, *hidden, state_zp,
                           clip)


def _require_constant_weights(o: _Operands) -> None:
    """The integer kernels fold the zero points into the biases at prepare: their weights and
    biases must be constants."""
    for t in _weights_and_biases(o):
        if t.data is None:
            raise UnsupportedOpError(f"tensor {t.name!r} is not a constant (the zero points "
                                     "are folded into the biases at prepare)")


def _weights_and_biases(o: _Operands) -> list[Tensor]:
    return [*o.input_weights.values(), *o.recurrent_weights.values(), *o.peephole.values(),
            *o.biases.values(), *o.norm.values(),
            *(t for t in (o.projection, o.projection_bias) if t is not None)]


def _quantized(t: Tensor, what: str) -> tuple[float, int]:
    """The per-tensor scale and zero point LiteRT reads (its legacy params)."""
    q = t.quantization
    if q is None or not q.scale:
        raise UnsupportedOpError(f"{what} ({t.name!r}) is not quantized (LiteRT then leaves "
                                 "the multipliers at zero)")
    if len(q.scale) != 1:
        raise UnsupportedOpError(f"{what} ({t.name!r}) is quantized per channel")
    scale = float(q.scale[0])
    if not (scale > 0 and math.isfinite(scale)):
        raise UnsupportedOpError(f"{what} ({t.name!r}) has scale {scale}")
    return scale, int(q.zero_point[0]) if q.zero_point else 0


def _multiplier(real: float, what: str, max_shift: int = MAX_SHIFT) -> tuple[int, int]:
    try:
        return quantize_multiplier(real, max_shift)
    except UnsupportedOpError as e:
        raise UnsupportedOpError(f"{what}: {e.message}") from None


def _int64(t: Tensor) -> np.ndarray:
    return np.asarray(t.data, dtype=np.int64)


def _int32s(values: np.ndarray, what: str) -> tuple[int, ...]:
    if np.abs(values).max(initial=0) > INT32_MAX:
        raise UnsupportedOpError(f"the {what} bias with the zero points folded in leaves int32")
    return tuple(int(v) for v in values)


def _require_sum_fits(weights: np.ndarray, bias: np.ndarray, operand: int, multiplier: int,
                      shift: int, addend: int, what: str) -> None:
    """LiteRT sums bias + operand . weights in int32, requantizes it (left-shifting first when
    the shift is positive) and adds up to `addend` more, all in int32: refuse what could
    overflow there, where LiteRT's result is undefined."""
    total = int((np.abs(bias) + operand * np.abs(weights).sum(axis=1)).max(initial=0))
    shifted = total << max(shift, 0)
    requantized = (shifted * multiplier >> 31) + 1
    if shifted > INT32_MAX or requantized + addend > INT32_MAX:
        raise UnsupportedOpError(f"{what} could overflow LiteRT's int32 arithmetic")


@dataclass(frozen=True)
class ScratchBuffer:
    """One of a cell's scratch buffers: the C pointer's name and element type, and the
    request."""

    name: str
    ctype: str
    request: MemoryRequest


def scratch_buffers(p: LstmIntegerParams | LstmFloatParams) -> tuple[ScratchBuffer, ...]:
    """The gate buffers of one step (the output gate reuses the forget gate's, which the cell
    update consumes) and the hidden values a projection reads; a hybrid cell's quantized rows
    of the input, the output state and the hidden values, with their scales and zero points
    (the hidden values reuse the input's, as LiteRT does)."""
    s = p.shape
    values = s.rows * s.n_cell
    integer = isinstance(p, (LstmIntegerParams, LstmInt16Params))
    gate, hidden = ("int16_t", "int8_t") if integer else ("float",) * 2
    size = {"int16_t": 2, "int8_t": 1, "float": 4, "int32_t": 4}

    def buffer(name: str, ctype: str, count: int, purpose: str) -> ScratchBuffer:
        return ScratchBuffer(name, ctype, MemoryRequest(count * size[ctype], purpose))

    buffers = [] if p.cifg else [buffer("input_gate", gate, values, "the input gate")]
    buffers += [buffer("forget_gate", gate, values, "the forget gate, then the output gate"),
                buffer("cell_gate", gate, values, "the cell gate")]
    if p.projection:
        buffers.append(buffer("hidden", hidden, values, "the hidden values before the "
                                                        "projection"))
    if isinstance(p, LstmHybridParams):
        quantized = [("x", "input", s.n_input),
                     *([("a", "auxiliary input", p.wiring.n_aux)] if p.aux_scales else []),
                     ("h", "output state", s.n_output)]
        for name, what, depth in quantized:
            buffers += [buffer(f"q{name}", "int8_t", s.rows * depth, f"the quantized {what}"),
                        buffer(f"{name}_scales", "float", s.rows, f"the {what} rows' scales")]
            if p.asymmetric:
                buffers.append(buffer(f"{name}_zero_points", "int32_t", s.rows,
                                      f"the {what} rows' zero points"))
        if p.projection:
            buffers.append(buffer("qhidden", "int8_t", values, "the quantized hidden values"))
    return tuple(buffers)


def lstm_scratch(p: LstmIntegerParams | LstmFloatParams) -> tuple[MemoryRequest, ...]:
    if isinstance(p, LstmBasicParams):
        return ()  # its temporaries are outputs
    return tuple(b.request for b in scratch_buffers(p))


def lstm_tflm_scratch(
        p: LstmIntegerParams | LstmInt16Params | LstmFloatParams) -> tuple[MemoryRequest, ...]:
    """TFLite Micro's UNIDIRECTIONAL_SEQUENCE_LSTM asks for four gate buffers, each a batch of
    output-state rows in the cell state's type (int16 for integer cells, else float32)."""
    width = 2 if isinstance(p, LstmIntegerParams | LstmInt16Params) else 4
    size = p.shape.batch * p.shape.n_output * width
    return tuple(MemoryRequest(size, f"LSTM gate buffer {k}") for k in range(1, 5))


def bidirectional_scratch(p: BidirectionalLstmParams) -> tuple[MemoryRequest, ...]:
    """The cells run one after the other, on buffers of the same sizes (LiteRT gives both the
    forward cell's sizes): they share one set, with the input gate's and the hidden values'
    if either cell needs them."""
    shared: dict[str, MemoryRequest] = {}
    for cell in (p.forward, p.backward):
        shared.update((r.purpose, r) for r in lstm_scratch(cell))
    return tuple(shared.values())
