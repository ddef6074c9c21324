"""numpy kernels for the recurrent family: UNIDIRECTIONAL_SEQUENCE_LSTM and
BIDIRECTIONAL_SEQUENCE_LSTM (one cell's sequence, run once per cell).

The output state and the cell state arrive among the inputs as views of the interpreter's state
block; the kernel updates them in place, so they carry over to the next invoke.

The integer kernel follows LiteRT's 8x8_16 path step by step, with gemmlowp's int16 fixed-point
logistic and tanh written out below over int64 arrays holding int16 values. Every intermediate
of those functions stays within int16 (checked exhaustively against gemmlowp's wrapping int16
arithmetic), so they need no wrap. The int16x8 kernel follows TFLite Micro's, with the int16
LOGISTIC and TANH of the activations' kernels.
"""

from __future__ import annotations

import numpy as np

from runtime_py.hybrid import quantize_asymmetric, quantize_symmetric
from runtime_py.kernels.activations import _int16_sigmoid
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier as mbqm
from toolchain.numerics.fixedpoint import rounding_divide_by_pot, wrap_int32
from toolchain.numerics.gemmlowp import inv_sqrt_quantized_multiplier_exp
from toolchain.numerics.gemmlowp import saturating_rounding_doubling_high_mul_int16 as mul16
from toolchain.ops.lstm.prepare import (
    EXP_BARREL_SHIFTER16,
    EXP_MINUS_ONE_EIGHTH16,
    FORTY_EIGHT_OVER_SEVENTEEN16,
    GATE_INTEGER_BITS,
    GATES,
    INT16_GATE_TANH,
    INT16_SIGMOID,
    MINUS_THIRTY_TWO_OVER_SEVENTEEN16,
    ONE_EIGHTH16,
    ONE_Q2,
    ONE_THIRD16,
    PEEPHOLE_WEIGHTS,
    BidirectionalLstmParams,
    CellLayout,
    CellWiring,
    LstmBasicParams,
    LstmFloatParams,
    LstmHybridParams,
    LstmInt16Params,
    LstmIntegerParams,
    LstmShape,
)

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
PEEPHOLE_GATES = tuple(PEEPHOLE_WEIGHTS)


# -- gemmlowp's int16 fixed point ------------------------------------------------------------


def saturating_shift16(x, amount: int) -> np.ndarray:
    """x * 2^amount saturated to int16 (gemmlowp's SaturatingRoundingMultiplyByPOT, amount >= 0)."""
    return np.clip(np.asarray(x, np.int64) << amount, INT16_MIN, INT16_MAX)


def exp_on_negative_values16(a, integer_bits: int) -> np.ndarray:
    """exp(a) in Q0.15 for int16 a <= 0 with `integer_bits` integer bits: the lowest quarter by a
    Taylor expansion around -1/8, each higher bit of -a by a factor exp(-2^k)."""
    a = np.asarray(a, np.int64)
    fractional_bits = 15 - integer_bits
    quarter = 1 << (fractional_bits - 2)
    a_mod_quarter_minus_quarter = (a & (quarter - 1)) - quarter
    remainder = a_mod_quarter_minus_quarter - a
    x = saturating_shift16(a_mod_quarter_minus_quarter, integer_bits) + ONE_EIGHTH16
    x2 = mul16(x, x)
    x3 = mul16(x2, x)
    x4 = mul16(x2, x2)
    polynomial = rounding_divide_by_pot(
        mul16(rounding_divide_by_pot(x4, 2) + x3, ONE_THIRD16) + x2, 1)
    result = np.clip(EXP_MINUS_ONE_EIGHTH16 + mul16(EXP_MINUS_ONE_EIGHTH16, x + polynomial),
                     INT16_MIN, INT16_MAX)
    # -a rounded up to whole quarters (below 2^15: no bit beyond the integer bits is set)
    quarters = remainder >> (fractional_bits - 2)
    for k, (_, multiplier) in enumerate(EXP_BARREL_SHIFTER16):
        result = np.where((quarters >> k) & 1 == 1, mul16(result, multiplier), result)
    if integer_bits > 5:
        result = np.where(a < -(1 << (20 - integer_bits)), 0, result)
    return np.where(a == 0, INT16_MAX, result)


def reciprocal_q2(a) -> np.ndarray:
    """1 / (1 + a) in Q2.13 for Q0.15 a in [0, 1): three Newton-Raphson steps on half the
    denominator, as gemmlowp's one_over_one_plus_x_for_x_in_0_1 starts."""
    half_denominator = (np.asarray(a, np.int64) + 32768) // 2  # RoundingHalfSum(a, 1), a >= 0
    x = FORTY_EIGHT_OVER_SEVENTEEN16 + mul16(half_denominator, MINUS_THIRTY_TWO_OVER_SEVENTEEN16)
    for _ in range(3):
        x = x + saturating_shift16(mul16(x, ONE_Q2 - mul16(half_denominator, x)), 2)
    return x


def logistic16(a) -> np.ndarray:
    """gemmlowp logistic of Q3.12 int16 values, in Q0.15."""
    a = np.asarray(a, np.int64)
    positive = saturating_shift16(reciprocal_q2(
        exp_on_negative_values16(np.where(a > 0, -a, a), GATE_INTEGER_BITS)), 1)
    return np.where(a == 0, 1 << 14, np.where(a > 0, positive, INT16_MAX - positive))


def tanh16(a, integer_bits: int) -> np.ndarray:
    """gemmlowp tanh of int16 values with `integer_bits` integer bits, in Q0.15."""
    a = np.asarray(a, np.int64)
    t = saturating_shift16(reciprocal_q2(
        exp_on_negative_values16(np.where(a < 0, a, -a), integer_bits + 1)) - ONE_Q2, 2)
    return np.where(a == 0, 0, np.where(a < 0, -t, t))


# -- integer LSTM ----------------------------------------------------------------------------


def _sat16(x) -> np.ndarray:
    return np.clip(x, INT16_MIN, INT16_MAX)


def _product(v: np.ndarray, weights: np.ndarray, bias) -> np.ndarray:
    """bias + v . weights^T over int8 values, exactly (float64 sums of small integers)."""
    total = np.matmul(v.astype(np.float64), weights.T.astype(np.float64)).astype(np.int64)
    return total + np.asarray(bias, np.int64)


def _c_divide(a: np.ndarray, b: int) -> np.ndarray:
    """C's integer division by a positive b: truncated toward zero."""
    return np.where(a < 0, -((-a) // b), a // b)


def _layer_norm(gate: np.ndarray, coefficients: np.ndarray, bias: np.ndarray, g) -> np.ndarray:
    """LiteRT's integer ApplyLayerNorm over each row. The normalized value times the
    coefficient plus the bias can pass int32 (over a cell count that is not a power of two the
    variance truncates, even below 1, to the guard): LiteRT's build computes it in 64 bits, and
    its quotient by 1024 then wraps to int32."""
    n = gate.shape[-1]
    total, squares = gate.sum(axis=-1), (gate * gate).sum(axis=-1)
    mean = _c_divide(total * 1024, n)
    variance = _c_divide(squares * ((1 << 20) // n) - mean * mean, 1 << 20)
    variance = np.where(variance < 1, g.variance_guard, variance)
    multiplier, shift = inv_sqrt_quantized_multiplier_exp(variance, -1)
    rescaled = mbqm(1024 * gate - mean[:, None], multiplier[:, None], shift[:, None])
    scaled = rescaled * coefficients + bias
    rounded = wrap_int32(_c_divide(np.where(scaled > 0, scaled + 512, scaled - 512), 1024))
    return _sat16(mbqm(rounded, g.norm_multiplier, g.norm_shift))


def _integer_gate(p: LstmIntegerParams, name: str, ops: dict, x, h, c) -> np.ndarray:
    g = p.gate(name)
    s = p.shape
    k = GATES.index(name)
    gate = _sat16(mbqm(_product(x, ops["w_in"][k], g.input_bias),
                       g.input_multiplier, g.input_shift))
    gate = _sat16(gate + mbqm(_product(h, ops["w_rec"][k], g.recurrent_bias),
                              g.recurrent_multiplier, g.recurrent_shift))
    if g.peephole_multiplier:
        # LiteRT walks n_output values of the weights, the cell state and the gate (flat over
        # the step's rows): the first n_output cells of each row when rows == 1
        flat_gate, flat_c = gate.reshape(-1).copy(), c.reshape(-1)
        n = s.rows * s.n_output
        weights = np.tile(ops["peephole"][name][:s.n_output].astype(np.int64), s.rows)
        flat_gate[:n] = _sat16(flat_gate[:n] + mbqm(weights * flat_c[:n], g.peephole_multiplier,
                                                    g.peephole_shift))
        gate = flat_gate.reshape(gate.shape)
    if p.layer_norm:
        gate = _layer_norm(gate, ops["norm"][k], ops["bias"][k], g)
    if name == "cell":
        return tanh16(gate, GATE_INTEGER_BITS)  # tanh whatever the fused activation says
    return logistic16(gate)


def _integer_step(p: LstmIntegerParams, ops: dict, x, h, c) -> np.ndarray:
    """One step over x [rows, n_input] with h [rows, n_output] and c [rows, n_cell] (int64,
    updated); returns the new output state."""
    input_gate = None if p.cifg else _integer_gate(p, "input", ops, x, h, c)
    forget_gate = _integer_gate(p, "forget", ops, x, h, c)
    cell_gate = _integer_gate(p, "cell", ops, x, h, c)
    if p.cifg:
        input_gate = INT16_MAX - forget_gate
    kept = rounding_divide_by_pot(forget_gate * c, 15)
    added = rounding_divide_by_pot(input_gate * cell_gate, p.cell_shift)
    c[...] = _sat16(kept + added)
    if p.cell_clip > 0:
        c[...] = np.clip(c, -p.cell_clip, p.cell_clip)
    output_gate = _integer_gate(p, "output", ops, x, h, c)
    product = output_gate * tanh16(c, p.cell_integer_bits)
    if not p.projection:
        return np.clip(mbqm(product, p.hidden_multiplier, p.hidden_shift)
                       + p.hidden_zero_point, -128, 127)
    hidden = np.clip(mbqm(product, p.hidden_multiplier, p.hidden_shift) - p.hidden_zero_point,
                     -128, 127)
    out = np.clip(mbqm(_product(hidden, ops["projection"], p.projection_bias),
                       p.projection_multiplier, p.projection_shift) + p.output_zero_point,
                  -128, 127)
    if p.projection_clip > 0:
        out = np.clip(out, -p.projection_clip, p.projection_clip)
    return out


# -- int16x8 LSTM (TFLite Micro) ---------------------------------------------------------------


def _requantize64(acc: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """TFLite's int64 MultiplyByQuantizedMultiplier, its multiplier already rounded to 16 bits:
    the int64 result wraps to int32 as its cast does."""
    return wrap_int32((acc * multiplier + (1 << (shift - 1))) >> shift)


def _int16_gate(p: LstmInt16Params, name: str, ops: dict, x, h) -> np.ndarray:
    """TFLite Micro's CalculateLstmGate: two fully connected products, each saturated to
    int16, their saturated sum, then the sigmoid (tanh for the cell gate)."""
    g, k = p.gate(name), GATES.index(name)
    from_input = _sat16(_requantize64(_product(x, ops["w_in"][k], g.input_bias),
                                      g.input_multiplier, g.input_shift))
    from_state = _sat16(_requantize64(_product(h, ops["w_rec"][k], g.recurrent_bias),
                                      g.recurrent_multiplier, g.recurrent_shift))
    activation = INT16_GATE_TANH if name == "cell" else INT16_SIGMOID
    return _int16_sigmoid(activation, _sat16(from_input + from_state)).astype(np.int64)


def _int16_step(p: LstmInt16Params, ops: dict, x, h, c) -> np.ndarray:
    """One step over x [rows, n_input], h and c [rows, n_cell] (int64, c updated); returns the
    new output state."""
    forget_gate = _int16_gate(p, "forget", ops, x, h)
    input_gate = _int16_gate(p, "input", ops, x, h)
    cell_gate = _int16_gate(p, "cell", ops, x, h)
    kept = _sat16(mbqm(forget_gate * c, p.forget_multiplier, p.forget_shift))
    added = _sat16(mbqm(input_gate * cell_gate, p.update_multiplier, p.update_shift))
    c[...] = _sat16(kept + added)
    if p.cell_clip is not None:
        c[...] = np.clip(c, -p.cell_clip, p.cell_clip)
    output_gate = _int16_gate(p, "output", ops, x, h)
    tanh_c = _int16_sigmoid(p.cell_tanh, c).astype(np.int64)
    return _sat16(mbqm(tanh_c * output_gate, p.hidden_multiplier, p.hidden_shift)
                  + p.hidden_zero_point)


def _sequence(shape: LstmShape, wiring: CellWiring, step, inputs, outputs, state_dtype) -> None:
    """Runs `step(x, a, h, c)` (a: the auxiliary input's rows, or None) as LiteRT's loops do,
    writes the cell's columns of its output and the states back in place."""
    lead = (shape.time, shape.batch) if shape.time_major else (shape.batch, shape.time)
    x = inputs[wiring.input].reshape(*lead, shape.n_input).astype(state_dtype)
    aux = None if wiring.aux_input is None else \
        inputs[wiring.aux_input].reshape(*lead, wiring.n_aux).astype(state_dtype)
    h_view, c_view = inputs[wiring.layout.output_state], inputs[wiring.layout.cell_state]
    h = h_view.reshape(shape.batch, shape.n_output).astype(state_dtype)
    c = c_view.reshape(shape.batch, shape.n_cell).astype(state_dtype)
    y = np.zeros((*lead, shape.n_output), state_dtype)
    times = range(shape.time - 1, -1, -1) if wiring.reverse else range(shape.time)
    if shape.time_major:
        for t in times:
            h = step(x[t], None if aux is None else aux[t], h, c)
            y[t] = h
    else:
        for b in range(shape.batch):
            hb, cb = h[b:b + 1], c[b:b + 1]
            for t in times:
                hb = step(x[b, t:t + 1], None if aux is None else aux[b, t:t + 1], hb, cb)
                y[b, t] = hb[0]
            h[b] = hb[0]
            c[b] = cb[0]
    h_view[...] = h.reshape(h_view.shape)
    c_view[...] = c.reshape(c_view.shape)
    out = outputs[wiring.output]
    width = wiring.output_width or shape.n_output
    columns = out.reshape(*lead, width)[..., wiring.output_offset:
                                        wiring.output_offset + shape.n_output]
    columns[...] = y


def _gate_operands(inputs, layout: CellLayout) -> dict:
    def at(position: int):
        return inputs[position] if position < len(inputs) else None

    return {
        "w_in": [at(i) for i in layout.input_weights],
        "w_aux": [at(i) for i in layout.aux_weights],
        "w_rec": [at(i) for i in layout.recurrent_weights],
        "bias": [at(i) for i in layout.biases],
        "norm": [at(i) for i in layout.layer_norm] or [None] * len(GATES),
        "peephole": {g: at(i) for g, i in layout.peephole_of.items()},
        "projection": at(layout.projection),
        "projection_bias": at(layout.projection_bias),
    }


def _integer_operands(inputs, layout: CellLayout) -> dict:
    ops = _gate_operands(inputs, layout)
    for key in ("w_in", "w_rec", "bias", "norm"):
        ops[key] = [None if v is None else v.astype(np.int64) for v in ops[key]]
    if ops["projection"] is not None:
        ops["projection"] = ops["projection"].astype(np.int64)
    return ops


# -- float LSTM ------------------------------------------------------------------------------


def _float_activation(x: np.ndarray, activation: str) -> np.ndarray:
    one = np.float32(1.0)
    if activation == "TANH":
        return np.tanh(x)
    if activation == "SIGMOID":
        return one / (one + np.exp(-x))
    if activation == "RELU":
        return np.maximum(x, np.float32(0.0))
    if activation == "RELU6":
        return np.clip(x, np.float32(0.0), np.float32(6.0))
    return np.clip(x, -one, one)  # RELU_N1_TO_1


def _float_gate(p: LstmFloatParams, name: str, ops: dict, products, c,
                activation) -> np.ndarray:
    """One gate from `products(k)`: gate k's matrix products, [rows, n_cell] each, in LiteRT's
    order."""
    k = GATES.index(name)
    bias = ops["bias"][k]
    terms = products(k)
    gate = np.zeros(terms[0].shape, np.float32) if p.layer_norm else \
        np.broadcast_to(bias, terms[0].shape).astype(np.float32)
    for term in terms:
        gate = (gate + term).astype(np.float32)
    if p.peephole and name != "cell":
        gate = gate + ops["peephole"][name] * c
    if p.layer_norm:
        mean = gate.sum(axis=-1, keepdims=True) / np.float32(p.shape.n_cell)
        diff = gate - mean
        variance = (diff * diff).sum(axis=-1, keepdims=True) / np.float32(p.shape.n_cell)
        gate = diff * (np.float32(1.0) / np.sqrt(variance + np.float32(1e-8)))
        gate = gate * ops["norm"][k] + bias
    return _float_activation(gate.astype(np.float32), activation)


def _float_products(ops: dict, x, a, h):
    def products(k: int) -> list[np.ndarray]:
        aux = [] if a is None else [a @ ops["w_aux"][k].T]
        return [x @ ops["w_in"][k].T, *aux, h @ ops["w_rec"][k].T]

    return products


def _float_projection(ops: dict, hidden: np.ndarray) -> np.ndarray:
    out = hidden @ ops["projection"].T
    return out if ops["projection_bias"] is None else out + ops["projection_bias"]


def _quantized_rows(p: LstmHybridParams, rows: np.ndarray):
    """The float rows as LiteRT's BatchQuantizeFloats leaves them: int8 values, scales and
    zero points."""
    quantize = quantize_asymmetric if p.asymmetric else quantize_symmetric
    q = [quantize(row.astype(np.float32)) for row in rows]
    return (np.stack([v for v, _, _ in q]), np.array([s for _, s, _ in q], np.float32),
            np.array([z for _, _, z in q], np.int64))


def _hybrid_product(rows, weights: np.ndarray, weight_scale: float, row_sums) -> np.ndarray:
    """float(q . w - zero_point * row_sum) * (row scale * weight scale), per row and unit."""
    q, scales, zero_points = rows
    acc = q @ weights.astype(np.int64).T
    if len(row_sums):
        acc = acc - zero_points[:, None] * np.asarray(row_sums, np.int64)[None, :]
    scale = (scales * np.float32(weight_scale)).astype(np.float32)
    return (wrap_int32(acc).astype(np.float32) * scale[:, None]).astype(np.float32)


def _hybrid_products(p: LstmHybridParams, ops: dict, x, a, h):
    qx, qh = _quantized_rows(p, x), _quantized_rows(p, h)
    qa = None if a is None else _quantized_rows(p, a)

    def products(k: int) -> list[np.ndarray]:
        aux = [] if qa is None else [_hybrid_product(
            qa, ops["w_aux"][k], p.aux_scales[k], p.aux_row_sums[k] if p.asymmetric else ())]
        return [_hybrid_product(qx, ops["w_in"][k], p.input_scales[k],
                                p.input_row_sums[k] if p.asymmetric else ()), *aux,
                _hybrid_product(qh, ops["w_rec"][k], p.recurrent_scales[k],
                                p.recurrent_row_sums[k] if p.asymmetric else ())]

    return products


def _hybrid_projection(p: LstmHybridParams, ops: dict, hidden: np.ndarray) -> np.ndarray:
    bias = ops["projection_bias"]
    out = np.zeros((hidden.shape[0], p.shape.n_output), np.float32) if bias is None else \
        np.broadcast_to(bias, (hidden.shape[0], p.shape.n_output)).astype(np.float32)
    return out + _hybrid_product(_quantized_rows(p, hidden), ops["projection"],
                                 p.projection_scale, p.projection_row_sums)


def _float_step(p: LstmFloatParams, ops: dict, products, project, c) -> np.ndarray:
    """One step of the float (or hybrid) cell from its gates' products and its projection."""
    input_gate = None if p.cifg else _float_gate(p, "input", ops, products, c, "SIGMOID")
    forget_gate = _float_gate(p, "forget", ops, products, c, "SIGMOID")
    cell_gate = _float_gate(p, "cell", ops, products, c, p.activation)
    if p.cifg:
        input_gate = np.float32(1.0) - forget_gate
    c[...] = forget_gate * c + input_gate * cell_gate
    if p.cell_clip > 0:
        c[...] = np.clip(c, -np.float32(p.cell_clip), np.float32(p.cell_clip))
    output_gate = _float_gate(p, "output", ops, products, c, "SIGMOID")
    out = output_gate * _float_activation(c, p.activation)
    if p.projection:
        out = project(out)
        if p.projection_clip > 0:
            out = np.clip(out, -np.float32(p.projection_clip), np.float32(p.projection_clip))
    return out.astype(np.float32)


def unidirectional_sequence_lstm(p, inputs, outputs) -> None:
    """One cell's sequence (any op's: p.wiring says where its tensors are)."""
    layout = p.wiring.layout
    if isinstance(p, LstmInt16Params):
        ops = _integer_operands(inputs, layout)
        _sequence(p.shape, p.wiring, lambda x, a, h, c: _int16_step(p, ops, x, h, c), inputs,
                  outputs, np.int64)
    elif isinstance(p, LstmIntegerParams):
        ops = _integer_operands(inputs, layout)
        _sequence(p.shape, p.wiring, lambda x, a, h, c: _integer_step(p, ops, x, h, c), inputs,
                  outputs, np.int64)
    elif isinstance(p, LstmHybridParams):
        ops = _gate_operands(inputs, layout)
        ops["peephole"] = {g: np.asarray(w, np.float32)
                           for g, w in zip(PEEPHOLE_GATES, p.peephole_weights, strict=True)}

        def hybrid_step(x, a, h, c):
            return _float_step(p, ops, _hybrid_products(p, ops, x, a, h),
                               lambda hidden: _hybrid_projection(p, ops, hidden), c)

        with np.errstate(all="ignore"):
            _sequence(p.shape, p.wiring, hybrid_step, inputs, outputs, np.float32)
    else:
        ops = _gate_operands(inputs, layout)

        def float_step(x, a, h, c):
            return _float_step(p, ops, _float_products(ops, x, a, h),
                               lambda hidden: _float_projection(ops, hidden), c)

        with np.errstate(all="ignore"):  # IEEE infinities and NaN, as in C
            _sequence(p.shape, p.wiring, float_step, inputs, outputs, np.float32)


def lstm_basic(p: LstmBasicParams, inputs, outputs) -> None:
    """The LSTM op's BASIC kernel: concatenation, one fully connected layer, the four gates;
    the new activation and state copied back into the state variables."""
    x, h, weights, bias, c = inputs
    activation, state, concat, gates = outputs
    one = np.float32(1.0)
    with np.errstate(all="ignore"):
        concat[...] = np.concatenate([x, h.reshape(p.batch, p.depth)], axis=1)
        gates[...] = (concat @ weights.T + bias).astype(np.float32)
        i, g, f, o = (gates[:, k * p.depth:(k + 1) * p.depth] for k in range(4))
        state[...] = (one / (one + np.exp(-i)) * np.tanh(g)
                      + one / (one + np.exp(-f)) * c.reshape(p.batch, p.depth))
        activation[...] = one / (one + np.exp(-o)) * np.tanh(state)
    h[...] = activation.reshape(h.shape)
    c[...] = state.reshape(c.shape)


def lstm(p, inputs, outputs) -> None:
    """The LSTM op: its BASIC kernel, or the unidirectional cell over one step (FULL)."""
    if isinstance(p, LstmBasicParams):
        lstm_basic(p, inputs, outputs)
    else:
        unidirectional_sequence_lstm(p, inputs, outputs)


def bidirectional_sequence_lstm(p: BidirectionalLstmParams, inputs, outputs) -> None:
    """The forward cell's sequence, then the backward cell's, as LiteRT runs them."""
    for cell in (p.forward, p.backward):
        unidirectional_sequence_lstm(cell, inputs, outputs)


KERNELS = {"UNIDIRECTIONAL_SEQUENCE_LSTM": unidirectional_sequence_lstm,
           "LSTM": lstm,
           "BIDIRECTIONAL_SEQUENCE_LSTM": bidirectional_sequence_lstm}
