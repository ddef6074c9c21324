"""C emitters for the LSTM family, from the same params as runtime_py (prepare.py);
templates/c/lstm.c.j2 lays them out.

One function per op runs the whole sequence: for each step (each batch row in turn when the input
is batch-major, all of them at once when time-major, as LiteRT steps), a static step function
computes the gates into arena scratch, updates the cell state and writes the output state and
the output row. The integer gates use gemmlowp's int16 fixed-point functions, written beside the
step once per op.
"""

from __future__ import annotations

from dataclasses import replace

from toolchain.ops.activations.prepare import Int16SigmoidParams
from toolchain.ops.emit import (
    COMMENT_WIDTH,
    LINE_LIMIT,
    MATH_H,
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_offset,
    c_pointer,
    c_sum,
    plus,
    render_macro,
    written_vars,
)
from toolchain.ops.hybrid import quantize_lines
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
    LstmBasicParams,
    LstmFloatParams,
    LstmHybridParams,
    LstmInt16Params,
    LstmIntegerParams,
    bidirectional_scratch,
    lstm_scratch,
    scratch_buffers,
)

TEMPLATE = "c/lstm.c.j2"

GATE_ACTIVATIONS = {"input": "sigmoid", "forget": "sigmoid", "cell": "tanh", "output": "sigmoid"}


def _wrapped(head: str, args: list[str], tail: str = "", indent: int = 2) -> list[str]:
    """`head(args)tail` as lines of at most COMMENT_WIDTH characters once indented by `indent`
    spaces (the template's): arguments that do not fit go on, aligned, to the next line."""
    lines, line = [], f"{head}("
    for k, arg in enumerate(args):
        piece = arg + (", " if k < len(args) - 1 else f"){tail}")
        if indent + len(line) + len(piece.rstrip()) > COMMENT_WIDTH and line.strip() != head + "(":
            lines.append(line.rstrip())
            line = " " * (len(head) + 1)
        line += piece
    return [*lines, line]


def _step_call(prefix: str, args: list[str], batch: ConstantLoop,
               time: ConstantLoop) -> list[str]:
    """The sequence's call of the step: one line after its loop's header when that fits, else
    wrapped inside the loop's block."""
    indent = 2 + 2 * batch.written
    call = f"{prefix}_step({', '.join(args)});"
    header = f"for ({time.header}) " if time.written else ""
    if indent + len(header) + len(call) <= LINE_LIMIT:
        return [call]
    return _wrapped(f"{prefix}_step", args, ";", indent + 2 * time.written)


def _signature(prefix: str, name: str, params: list[str]) -> str:
    return "\n".join(_wrapped(f"static void {prefix}_{name}", params, indent=0))


def _table(comment: str, ctype: str, name: str, values: tuple) -> dict:
    return {"comment": c_comment(comment), "ctype": ctype, "name": name,
            "length": len(values), "data": c_array(values)}


def _step_arguments(ctx: OpContext, batch: ConstantLoop, time: ConstantLoop, width: int
                    ) -> tuple[list[str], list[str], str]:
    """The step function's arguments at step (b, t) (the auxiliary input's alone too, if any),
    and the order the steps take, in words."""
    p = ctx.params
    s, w = p.shape, p.wiring

    def at_step(pointer: str, size: int) -> str:
        """`pointer` at the rows of step (b, t), `size` values a row."""
        per_step = s.batch * size if s.time_major else size
        terms = [] if s.time_major else [(batch, s.time * size)]
        if w.reverse:
            return c_offset(pointer, [*terms, (time, -per_step)], (s.time - 1) * per_step)
        return c_offset(pointer, [*terms, (time, per_step)])

    aux = [at_step("a", w.n_aux)] if w.aux_input is not None else []
    if s.time_major:
        args = [at_step("x", s.n_input), *aux, "h", "c", at_step("y", width)]
        order = (f"the {s.time} time steps in turn, each over all {s.batch} batch rows "
                 "(time-major)")
    else:
        args = [at_step("x", s.n_input), *aux, c_offset("h", [(batch, s.n_output)]),
                c_offset("c", [(batch, s.n_cell)]), at_step("y", width)]
        order = (f"each of the {s.batch} batch rows through its {s.time} time steps "
                 "(batch-major)" if s.batch > 1 else f"the {s.time} time steps in turn")
    if w.reverse:
        order += ", from the last time step to the first"
    return args, aux, order


def _shared_values(ctx: OpContext, ctype: str, gate_ctype: str) -> dict:
    """What both dtypes' C lays out alike: the sequence loops, the step's row and value loops,
    the matrix-product helper's indices and the scratch buffers."""
    p = ctx.params
    s, w = p.shape, p.wiring
    prefix = ctx.prefix
    rows, cells = ConstantLoop("r", s.rows), ConstantLoop("u", s.n_cell)
    outputs, values = ConstantLoop("u", s.n_output), ConstantLoop("j", s.rows * s.n_cell)
    width = w.output_width or s.n_output
    batch = ConstantLoop("b", 1 if s.time_major else s.batch)
    time = ConstantLoop("t", s.time)
    args, aux, order = _step_arguments(ctx, batch, time, width)
    strided = width != s.n_output and s.rows > 1
    copy_rows = rows if strided else ConstantLoop("r", 1)
    row_bytes = s.n_output if strided else s.rows * s.n_output
    output_copy = (f"memcpy({c_offset('y', [(copy_rows, width)])}, "
                   f"{c_offset('h', [(copy_rows, s.n_output)])}, "
                   + (f"{row_bytes});" if ctype == "int8_t" else
                      f"{row_bytes} * sizeof({ctype}));"))
    buffers = [f"{b.ctype} *{b.name} = ({b.ctype} *){at};"
               for b, at in zip(scratch_buffers(p), ctx.scratch, strict=True)]
    buffers.append(f"{gate_ctype} *output_gate = forget_gate; /* the cell update consumes the "
                   "forget gate first */")
    row_pointers = []
    if rows.written:
        row_pointers = [f"const {ctype} *vr = v + r * depth;",
                        f"{gate_ctype} *g = gate + r * {s.n_cell};"]
    gate_u = f"g[{cells.index}]" if rows.written else f"gate[{cells.index}]"
    x, y = ctx.inputs[w.input], ctx.outputs[w.output]
    step_vars = [values, *([rows, outputs] if p.projection else []), copy_rows]
    return {
        "fn": ctx.fn, "prefix": prefix, "ctype": ctype, "cell_ctype": gate_ctype,
        "x": x.ptr, "y": c_offset(y.ptr, [], w.output_offset),
        "aux": ctx.inputs[w.aux_input].ptr if aux else "", "n_aux": w.n_aux,
        "h": ctx.inputs[w.layout.output_state].ptr, "c": ctx.inputs[w.layout.cell_state].ptr,
        "batch": batch, "time": time, "step_call": _step_call(prefix, args, batch, time),
        "counters": written_vars([batch, time]),
        "order": (" The output state and the cell state carry over from invoke to invoke."
                  if w.one_step else
                  f" The sequence: {order}, the output state and the cell state carried from "
                  "step to step and from invoke to invoke."),
        "rows": rows, "cells": cells, "outputs": outputs, "elements": values,
        "row_index": "r" if rows.written else "0",
        "row_pointers": row_pointers, "vk": "vr[k]" if rows.written else "v[k]",
        "gate_u": gate_u, "weights_row": "w + u * depth" if cells.written else "w",
        "accumulate_counters": ", ".join(filter(None, [written_vars([rows, cells]), "k"])),
        "buffers": buffers,
        "step_counters": ", ".join(filter(None, [written_vars(step_vars),
                                                 "k" if p.projection else ""])),
        "n_input": s.n_input, "n_output": s.n_output, "n_cell": s.n_cell,
        "gate_bytes": f"{s.rows * s.n_cell} * sizeof({gate_ctype})",
        "projection": p.projection,
        "projection_row": c_offset(ctx.inputs[w.layout.projection].ptr,
                                   [(outputs, s.n_cell)])
        if p.projection else "",
        "hidden_k": f"hidden[{c_sum([(rows, s.n_cell), ('k', 1)])}]",
        "output_at": c_sum([(rows, s.n_output), (outputs, 1)]),
        "layer_norm": p.layer_norm,
        "norm_row": c_offset("gate", [(rows, s.n_cell)]),
        "norm_counters": ", ".join(filter(None, [written_vars([rows]), "j"])),
        "step_comment": c_comment(
            f"One step of {s.rows} batch row{'s' if s.rows > 1 else ''}: x [{s.rows}]"
            f"[{s.n_input}] in" + (f" with the auxiliary input a [{s.rows}][{w.n_aux}]"
                                   if aux else "")
            + f", the output state h [{s.rows}][{s.n_output}] and the cell state "
            f"c [{s.rows}][{s.n_cell}] updated in place, y [{s.rows}][{s.n_output}] a copy of "
            "the new output state" + (f" (in rows {width} wide)" if strided else "")
            + ". The gates live in the arena's scratch."),
        "step_aux": f"const {ctype} *a, " if aux else "",
        "copy_rows": copy_rows, "output_copy": output_copy,
    }


def _title(ctx: OpContext) -> str:
    """The op (and its cell, when it has two) as comments name it."""
    wiring = ctx.params.wiring
    name = ctx.outputs[wiring.output].name
    return f"{ctx.op.opcode} '{name}'" + (f", {wiring.what}" if wiring.what else "")


def _extent(p) -> str:
    s = p.shape
    rows = f"{s.batch} batch row{'s' if s.batch > 1 else ''}"
    return f"one step of {rows} per invoke" if p.wiring.one_step else f"{s.time} steps of {rows}"


def _variants(p) -> str:
    found = [name for name, on in (("CIFG (the input gate is 1 - forget)", p.cifg),
                                   ("peephole", p.peephole), ("layer norm", p.layer_norm),
                                   (f"projection to {p.shape.n_output} outputs", p.projection))
             if on]
    return ", with " + ", ".join(found) if found else ""


def _integer_gate(ctx: OpContext, gate, j: str) -> tuple[dict, list[dict]]:
    """One gate of the integer kernel: its lines (the input and recurrent products, the
    peephole and the layer norm), its activation, and the tables of its folded biases."""
    p: LstmIntegerParams = ctx.params
    s, layout = p.shape, p.wiring.layout
    prefix, name = ctx.prefix, ctx.outputs[0].name
    tables = []
    k = GATES.index(gate.name)
    buffer = f"{gate.name}_gate"
    input_bias = recurrent_bias = "NULL"
    if any(gate.input_bias):
        input_bias = f"{prefix}_{gate.name}_gate_bias"
        what = ("the input zero point times each row of its input weights, negated (layer "
                "norm adds the bias after normalizing)" if p.layer_norm else
                "its bias less the input zero point times each row of its input weights")
        tables.append(_table(f"{ctx.op.opcode} '{name}': the {gate.name} gate's input "
                             f"product starts from {what}", "int32_t", input_bias,
                             gate.input_bias))
    if any(gate.recurrent_bias):
        recurrent_bias = f"{prefix}_{gate.name}_gate_recurrent_bias"
        tables.append(_table(f"{ctx.op.opcode} '{name}': the {gate.name} gate's recurrent "
                             "product starts from minus the output state's zero point "
                             "times each row of its recurrent weights", "int32_t",
                             recurrent_bias, gate.recurrent_bias))
    function = (f"{prefix}_tanh({buffer}[{j}], {GATE_INTEGER_BITS})"
                if gate.name == "cell" else f"{prefix}_logistic({buffer}[{j}])")
    scale = "its layer norm's scale" if p.layer_norm else "Q3.12"
    lines = [f"memset({buffer}, 0, {s.rows * s.n_cell} * sizeof(int16_t));",
             *_wrapped(f"{prefix}_accumulate",
                       [buffer, "x", str(s.n_input), ctx.inputs[layout.input_weights[k]].ptr,
                        input_bias, str(gate.input_multiplier), str(gate.input_shift)], ";"),
             *_wrapped(f"{prefix}_accumulate",
                       [buffer, "h", str(s.n_output),
                        ctx.inputs[layout.recurrent_weights[k]].ptr, recurrent_bias,
                        str(gate.recurrent_multiplier),
                        str(gate.recurrent_shift)], ";")]
    if gate.peephole_multiplier:
        lines += _wrapped(f"{prefix}_peephole",
                          [buffer, ctx.inputs[layout.peephole_of[gate.name]].ptr, "c",
                           str(gate.peephole_multiplier), str(gate.peephole_shift)], ";")
    if p.layer_norm:
        lines += _wrapped(f"{prefix}_layer_norm",
                          [buffer, ctx.inputs[layout.layer_norm[k]].ptr,
                           ctx.inputs[layout.biases[k]].ptr, str(gate.norm_multiplier),
                           str(gate.norm_shift), str(gate.variance_guard)], ";")
    return {
        "name": gate.name, "lines": lines,
        "comment": f"/* {gate.name} gate: the {GATE_ACTIVATIONS[gate.name]} of its "
                   f"pre-activation at {scale} */",
        "activation": f"{buffer}[{j}] = (int16_t){function};",
    }, tables


def _integer_hidden(p: LstmIntegerParams, j: str) -> tuple[str, str]:
    """The store of a hidden value (o * tanh(c) requantized to int8) and its comment."""
    bits = p.cell_integer_bits
    hidden = f"arenac_mbqm(product, {p.hidden_multiplier}, {p.hidden_shift})"
    if p.projection:
        return (f"hidden[{j}] = (int8_t)arenac_clamp({hidden}"
                f"{plus(-p.hidden_zero_point)}, -128, 127);",
                f"output state: o * tanh(c), c read as Q{bits}.{15 - bits}, "
                "requantized to int8 hidden values (less their zero point, as LiteRT), "
                "then projected")
    return (f"h[{j}] = (int8_t)arenac_clamp({hidden}{plus(p.hidden_zero_point)}, "
            "-128, 127);",
            f"output state: o * tanh(c), c read as Q{bits}.{15 - bits}, requantized to int8")


def _exp_barrel(used_bits: set[int]) -> list[str]:
    """gemmlowp's exp_on_negative_values barrel shifter, down to the bits `used_bits` reach:
    beyond them -a is below 2^(integer bits) and its bit for 2^exponent is clear."""
    barrel = []
    for bit, (exponent, multiplier) in enumerate(EXP_BARREL_SHIFTER16):
        if exponent >= max(used_bits):
            break
        power = f"1/{2**-exponent}" if exponent < 0 else str(2**exponent)
        factor = (f"result = arenac_srdhm16(result, {multiplier}); /* exp(-{power}) */"
                  if multiplier else f"result = 0; /* exp(-{power}) rounds to 0 */")
        barrel.append(f"if (quarters & {1 << bit}) {factor}")
    return barrel


def lstm_integer_values(ctx: OpContext) -> dict:
    p: LstmIntegerParams = ctx.params
    s = p.shape
    v = _shared_values(ctx, "int8_t", "int16_t")
    prefix, name = ctx.prefix, ctx.outputs[0].name
    layout = p.wiring.layout
    j = v["elements"].index
    tables, gates = [], []
    for gate in p.gates:
        values, gate_tables = _integer_gate(ctx, gate, j)
        gates.append(values)
        tables += gate_tables
    if p.projection and any(p.projection_bias):
        what = ("its bias plus" if ctx.inputs[layout.projection_bias] is not None else "")
        tables.append(_table(f"{ctx.op.opcode} '{name}': the projection starts from {what} "
                             "the hidden zero point times each row of its weights", "int32_t",
                             f"{prefix}_projection_bias", p.projection_bias))
    clip = p.cell_clip
    cell_min, cell_max = (-clip, clip) if clip > 0 else (-32768, 32767)
    output_min, output_max = (-p.projection_clip, p.projection_clip) if p.projection_clip > 0 \
        else (-128, 127)
    bits = p.cell_integer_bits
    hidden_store, hidden_comment = _integer_hidden(p, j)
    used_bits = {GATE_INTEGER_BITS, GATE_INTEGER_BITS + 1, bits + 1}
    peephole_comment = "/* Adds the peephole terms mbqm(w[u] * c[u]) to one gate */"
    if s.n_output < s.n_cell:
        peephole_comment = c_comment(
            f"Adds the peephole terms mbqm(w[u] * c[u]) to one gate. As LiteRT, over "
            f"n_output = {s.n_output} values (not the {s.n_cell} cells), flat over the step's "
            "rows: row r's terms land at r * n_output.")
    comment = (f"{_title(ctx)} (int8, int16 cell state at 2^{p.cell_shift - 30}): "
               f"{_extent(p)}, {s.n_input} inputs, {s.n_cell} cells{_variants(p)}. As LiteRT's "
               "integer "
               "kernel computes it: each gate's input and recurrent products requantized to "
               "int16 and saturated in turn, gemmlowp's int16 logistic and tanh, the cell "
               "update's products each rounded once, the hidden values at the scale of the "
               "op's fifth intermediate tensor. The zero points are folded into the biases.")
    return {
        **v, "sequence_comment": c_comment(comment + v["order"]), "tables": tables,
        "gates": gates,
        "one_eighth": ONE_EIGHTH16, "one_third": ONE_THIRD16,
        "exp_eighth": EXP_MINUS_ONE_EIGHTH16, "barrel": _exp_barrel(used_bits),
        "exp_clamp": max(used_bits) > 5,
        "forty_eight_over_seventeen": FORTY_EIGHT_OVER_SEVENTEEN16,
        "minus_thirty_two_over_seventeen": MINUS_THIRTY_TWO_OVER_SEVENTEEN16,
        "one_q2": ONE_Q2,
        "accumulate_signature": _signature(prefix, "accumulate", [
            "int16_t *gate", "const int8_t *v", "int depth", "const int8_t *w",
            "const int32_t *bias", "int32_t multiplier", "int shift"]),
        "peephole": p.peephole, "peephole_comment": peephole_comment,
        "peephole_signature": _signature(prefix, "peephole", [
            "int16_t *gate", "const int16_t *weights", "const int16_t *c", "int32_t multiplier",
            "int shift"]),
        "peephole_counters": written_vars([v["rows"], v["outputs"]]),
        "peephole_at": c_sum([(v["rows"], s.n_output), (v["outputs"], 1)]),
        "norm_signature": _signature(prefix, "layer_norm", [
            "int16_t *gate", "const int16_t *coefficients", "const int32_t *bias",
            "int32_t multiplier", "int shift", "int32_t variance_guard"]),
        "norm_step": (1 << 20) // s.n_cell,
        "update_comment": c_comment(
            f"cell state: f * c / 2^15 + i * g / 2^{p.cell_shift}, each product rounded once, "
            "saturated" + (f" and clipped to +-{clip}" if clip > 0 else "")
            + (" (CIFG: i = 32767 - f)" if p.cifg else ""), "  "),
        "input_gate_value": f"(32767 - forget_gate[{j}])" if p.cifg else f"input_gate[{j}]",
        "cell_shift": p.cell_shift, "cell_min": cell_min, "cell_max": cell_max,
        "cell_integer_bits": bits,
        "hidden_comment": c_comment(hidden_comment, "  "), "hidden_store": hidden_store,
        "projection_start": f"{prefix}_projection_bias[{v['outputs'].index}]"
        if p.projection and any(p.projection_bias) else "0",
        "projection_multiplier": p.projection_multiplier,
        "projection_shift": p.projection_shift,
        "output_zp": plus(p.output_zero_point), "output_min": output_min,
        "output_max": output_max,
    }


def _float_activation(activation: str, value: str) -> str:
    if activation == "TANH":
        return f"tanhf({value})"
    if activation == "SIGMOID":
        return f"1.0f / (1.0f + expf(-{value}))"
    if activation == "RELU":
        return f"({value} > 0.0f ? {value} : 0.0f)"
    if activation == "RELU6":
        return f"arenac_clampf({value}, 0.0f, 6.0f)"
    return f"arenac_clampf({value}, -1.0f, 1.0f)"  # RELU_N1_TO_1


def lstm_float_values(ctx: OpContext, helpers: str = "") -> dict:
    """The float cell's values; its step calls the matrix-product (and layer norm) functions
    of prefix `helpers`, which another cell of the op defined, or defines its own."""
    p: LstmFloatParams = ctx.params
    s = p.shape
    layout = p.wiring.layout
    v = _shared_values(ctx, "float", "float")
    v["helpers"] = helpers or ctx.prefix
    values, rows, cells = v["elements"], v["rows"], v["cells"]
    j = values.index
    gates = []
    for gate in GATES:
        if gate == "input" and p.cifg:
            continue
        k = GATES.index(gate)
        buffer = f"{gate}_gate"
        activation = p.activation if gate == "cell" else "SIGMOID"
        at = c_sum([(rows, s.n_cell), (cells, 1)])
        peephole = ""
        if p.peephole and gate != "cell":
            # a hybrid cell's int8 weights are recovered into a float table
            weights = (f"{ctx.prefix}_{gate}_peephole" if isinstance(p, LstmHybridParams)
                       else ctx.inputs[layout.peephole_of[gate]].ptr)
            peephole = f"{buffer}[{at}] += {weights}[{cells.index}] * c[{at}];"
        bias = ctx.inputs[layout.biases[k]].ptr
        aux = [] if not v["aux"] else [
            f"{v['helpers']}_accumulate({buffer}, a, {v['n_aux']}, "
            f"{ctx.inputs[layout.aux_weights[k]].ptr});"]
        products = [
            f"{v['helpers']}_accumulate({buffer}, x, {s.n_input}, "
            f"{ctx.inputs[layout.input_weights[k]].ptr});", *aux,
            f"{v['helpers']}_accumulate({buffer}, h, {s.n_output}, "
            f"{ctx.inputs[layout.recurrent_weights[k]].ptr});"]
        gates.append({
            "name": gate, "buffer": buffer, "products": products,
            "comment": f"/* {gate} gate: {activation.lower()} of "
                       + ("its normalized sum */" if p.layer_norm else "its sum */"),
            "bias": bias, "bias_rows": "" if p.layer_norm else c_offset(buffer,
                                                                        [(rows, s.n_cell)]),
            "peephole": bool(peephole), "peephole_step": peephole,
            "layer_norm": ctx.inputs[layout.layer_norm[k]].ptr if p.layer_norm else "",
            "activation": f"{buffer}[{j}] = {_float_activation(activation, f'{buffer}[{j}]')};",
        })
    input_gate = f"(1.0f - forget_gate[{j}])" if p.cifg else f"input_gate[{j}]"
    update = [f"c[{j}] = forget_gate[{j}] * c[{j}] + {input_gate} * cell_gate[{j}];"]
    if p.cell_clip > 0:
        update.append(f"c[{j}] = arenac_clampf(c[{j}], {c_float(-p.cell_clip)}, "
                      f"{c_float(p.cell_clip)});")
    target = "hidden" if p.projection else "h"
    hidden_store = (f"{target}[{j}] = output_gate[{j}] * "
                    f"{_float_activation(p.activation, f'c[{j}]')};")
    projected = "dot"
    if p.projection_bias:
        projected = f"dot + {ctx.inputs[layout.projection_bias].ptr}[{v['outputs'].index}]"
    if p.projection_clip > 0:
        projected = (f"arenac_clampf({projected}, {c_float(-p.projection_clip)}, "
                     f"{c_float(p.projection_clip)})")
    comment = (f"{_title(ctx)} (float32): {_extent(p)}, {s.n_input} inputs, {s.n_cell} "
               f"cells{_variants(p)}; {p.activation.lower()} on the cell gate and the cell, "
               "sigmoid on the others, in LiteRT's order of operations (its matrix products "
               "and activations may round differently).")
    return {
        **v, "sequence_comment": c_comment(comment + v["order"]), "gates": gates,
        "row_bytes": f"{s.n_cell} * sizeof(float)",
        "define_helpers": not helpers, "hybrid": False, "tables": [], "quantize_calls": [],
        "n_cell_float": f"{s.n_cell}.0f",
        "update_comment": "/* cell state: f * c + i * g"
                          + (f", clipped to +-{p.cell_clip:g}" if p.cell_clip > 0 else "")
                          + (" (CIFG: i = 1 - f)" if p.cifg else "") + " */",
        "cell_update": update,
        "step_counters": ", ".join(filter(None, [
            written_vars([values, *([rows] if p.peephole or not p.layer_norm else []),
                          *([cells] if p.peephole else []),
                          *([rows, v["outputs"]] if p.projection else []),
                          v["copy_rows"]]),
            "k" if p.projection else ""])),
        "hidden_comment": f"/* output state: o * {p.activation.lower()}(c)"
                          + (", then projected */" if p.projection else " */"),
        "hidden_store": hidden_store, "projection_value": projected,
    }


def _row_sums(ctx: OpContext, tables: list[dict], what: str, key: str,
              sums: tuple[int, ...]) -> list[str]:
    """The name of a table of weight row sums, added to `tables`, for asymmetric rows only
    (their zero points times the row sums are taken off the products)."""
    p: LstmHybridParams = ctx.params
    if not p.asymmetric:
        return []
    table = f"{ctx.prefix}_{key}_row_sums"
    tables.append(_table(f"{ctx.op.opcode} '{ctx.outputs[0].name}': the row sums of {what}, "
                         "for the input zero points", "int32_t", table, sums))
    return [table]


def _hybrid_product(p: LstmHybridParams, functions: str, target: str, units: int,
                    quantized: str, rows_of: str, depth: int, weights: str, scale: float,
                    sums: list[str]) -> list[str]:
    """target += the product of the `quantized` rows (at the scales of `rows_of`)."""
    zero_points = [f"{rows_of}_zero_points"] if p.asymmetric else []
    return _wrapped(f"{functions}_accumulate",
                    [target, str(units), quantized, f"{rows_of}_scales", *zero_points,
                     str(depth), weights, *sums, c_float(scale)], ";")


def _hybrid_quantize(p: LstmHybridParams, functions: str, depth: int, source: str,
                     target: str, rows_of: str) -> list[str]:
    """The call quantizing the `source` rows into `target` at the scales of `rows_of`."""
    zero_points = [f"{rows_of}_zero_points"] if p.asymmetric else []
    return _wrapped(f"{functions}_quantize_{depth}",
                    [source, target, f"{rows_of}_scales", *zero_points], ";")


def _hybrid_gates(ctx: OpContext, v: dict, functions: str, tables: list[dict]) -> None:
    """Each gate's products (input, auxiliary, recurrent) into the float cell's gate values,
    and the tables they read (row sums, peephole weights) into `tables`."""
    p: LstmHybridParams = ctx.params
    s, layout, asymmetric = p.shape, p.wiring.layout, p.asymmetric
    for gate in v["gates"]:
        k = GATES.index(gate["name"])
        buffer = gate["buffer"]
        what = gate["name"]
        input_sums = _row_sums(ctx, tables, f"the {what} gate's input weights",
                               f"{what}_input", p.input_row_sums[k] if asymmetric else ())
        recurrent_sums = _row_sums(ctx, tables, f"the {what} gate's recurrent weights",
                                   f"{what}_recurrent",
                                   p.recurrent_row_sums[k] if asymmetric else ())
        aux = []
        if p.aux_scales:
            aux = _hybrid_product(p, functions, buffer, s.n_cell, "qa", "a", p.wiring.n_aux,
                                  ctx.inputs[layout.aux_weights[k]].ptr, p.aux_scales[k],
                                  _row_sums(ctx, tables, f"the {what} gate's auxiliary weights",
                                            f"{what}_aux",
                                            p.aux_row_sums[k] if asymmetric else ()))
        gate["products"] = [
            *_hybrid_product(p, functions, buffer, s.n_cell, "qx", "x", s.n_input,
                             ctx.inputs[layout.input_weights[k]].ptr, p.input_scales[k],
                             input_sums),
            *aux,
            *_hybrid_product(p, functions, buffer, s.n_cell, "qh", "h", s.n_output,
                             ctx.inputs[layout.recurrent_weights[k]].ptr, p.recurrent_scales[k],
                             recurrent_sums)]
        if gate["peephole"]:
            weights = p.peephole_weights[tuple(PEEPHOLE_WEIGHTS).index(gate["name"])]
            tables.append(_table(f"{ctx.op.opcode} '{ctx.outputs[0].name}': the "
                                 f"{gate['name']} gate's peephole weights, float32(w) * scale",
                                 "float", f"{ctx.prefix}_{gate['name']}_peephole", weights))


def _hybrid_quantizers(p: LstmHybridParams, prefix: str, rows: ConstantLoop) -> list[dict]:
    """One function per depth of rows the cell quantizes: the input's, the output state's, the
    hidden values' (projection) and the auxiliary input's."""
    s = p.shape
    depths = sorted({s.n_input, s.n_output, *([s.n_cell] if p.projection else []),
                     *([p.wiring.n_aux] if p.aux_scales else [])})
    quantizers = []
    for depth in depths:
        k = ConstantLoop("k", depth)
        src, dst = ("vr", "qr") if rows.written else ("v", "q")
        params = ["const float *v", "int8_t *q", "float *scales",
                  *(["int32_t *zero_points"] if p.asymmetric else [])]
        quantizers.append({
            "depth": depth, "signature": _signature(prefix, f"quantize_{depth}", params),
            "counters": written_vars([rows, k]) or "k",
            "row_pointers": [f"const float *vr = v + r * {depth};",
                             f"int8_t *qr = q + r * {depth};"] if rows.written else [],
            "lines": quantize_lines(depth, p.asymmetric, k, src, dst)})
    return quantizers


def _hybrid_projection(ctx: OpContext, rows: ConstantLoop, functions: str,
                       tables: list[dict]) -> dict:
    """The projection's lines: its bias, plus the hidden values quantized to int8 rows times
    its weights; and its clip."""
    p: LstmHybridParams = ctx.params
    s, layout = p.shape, p.wiring.layout
    projected = ConstantLoop("j", s.rows * s.n_output)
    bias = ([f"memcpy({c_offset('h', [(rows, s.n_output)])}, "
             f"{ctx.inputs[layout.projection_bias].ptr}, {s.n_output} * sizeof(float));"]
            if p.projection_bias else
            [f"memset(h, 0, {s.rows * s.n_output} * sizeof(float));"])
    if rows.written and p.projection_bias:
        bias = [f"for ({rows.header}) {bias[0]}"]
    clip = ""
    if p.projection_clip > 0:
        clip = (f"h[{projected.index}] = arenac_clampf(h[{projected.index}], "
                f"{c_float(-p.projection_clip)}, {c_float(p.projection_clip)});")
    return {
        "projection_lines": [
            c_comment("the projection: its bias, plus the hidden values quantized to int8 "
                      "rows (at the input's scales, as LiteRT) times its weights", "  "),
            *bias,
            *_hybrid_quantize(p, functions, s.n_cell, "hidden", "qhidden", "x"),
            *_hybrid_product(p, functions, "h", s.n_output, "qhidden", "x", s.n_cell,
                             ctx.inputs[layout.projection].ptr, p.projection_scale,
                             _row_sums(ctx, tables, "the projection weights", "projection",
                                       p.projection_row_sums))],
        "projection_clip": clip, "projected": projected}


def lstm_hybrid_values(ctx: OpContext, helpers: str = "") -> dict:
    """The float cell's values with int8 matrix products: the rows quantized once a step into
    scratch, each product by the shared hybrid accumulate, the peephole weights as float
    tables (float32(w) * scale, as LiteRT recovers them) and the row sums as int32 tables.
    The functions are those of prefix `helpers` when another cell of the op defined them."""
    p: LstmHybridParams = ctx.params
    s, prefix = p.shape, ctx.prefix
    functions = helpers or prefix
    v = lstm_float_values(ctx, helpers)
    rows, values = v["rows"], v["elements"]
    asymmetric = p.asymmetric
    tables = []
    cells = v["cells"]
    _hybrid_gates(ctx, v, functions, tables)
    quantizers = _hybrid_quantizers(p, prefix, rows)
    extra = _hybrid_projection(ctx, rows, functions, tables) if p.projection else {}
    step_vars = [values, *([rows] if p.peephole or not p.layer_norm else []),
                 *([cells] if p.peephole else []), v["copy_rows"],
                 *([extra["projected"]] if extra.get("projection_clip") else [])]
    comment = (f"{_title(ctx)} (hybrid: float32, int8 weights): {_extent(p)}, {s.n_input} "
               f"inputs, {s.n_cell} cells{_variants(p)}; as LiteRT's hybrid kernel on this "
               "build: every step quantizes the input and the output state to int8 rows "
               f"({'asymmetric' if asymmetric else 'symmetric'}), takes int32 products and "
               "rescales them in float32; the gates, the cell and the hidden values in float as "
               "the float kernel does.")
    rows_counter = written_vars([rows])
    return {
        **v, **extra, "hybrid": True, "asymmetric": asymmetric, "tables": tables,
        "sequence_comment": c_comment(comment + v["order"]),
        "quantizers": quantizers,
        "quantize_calls": [*_hybrid_quantize(p, functions, s.n_input, "x", "qx", "x"),
                           *(_hybrid_quantize(p, functions, p.wiring.n_aux, "a", "qa", "a")
                             if p.aux_scales else []),
                           *_hybrid_quantize(p, functions, s.n_output, "h", "qh", "h")],
        "accumulate_comment": c_comment(
            "Adds an int8 matrix product to each row: gate[r][u] += float(q[r] . w[u]"
            + (" - zero_points[r] * row_sums[u]" if asymmetric else "")
            + ") * (scales[r] * weight_scale), the rows quantized from floats."),
        "accumulate_signature": _signature(prefix, "accumulate", [
            "float *gate", "int units", "const int8_t *q", "const float *scales",
            *(["const int32_t *zero_points"] if asymmetric else []), "int depth",
            "const int8_t *w", *(["const int32_t *row_sums"] if asymmetric else []),
            "float weight_scale"]),
        "hybrid_counters": ", ".join(filter(None, [rows_counter, "u", "k"])),
        "hybrid_row_pointers": ["const int8_t *qr = q + r * depth;",
                                "float *g = gate + r * units;"] if rows.written else [],
        "qk": "qr[k]" if rows.written else "q[k]",
        "hybrid_gate_u": "g[u]" if rows.written else "gate[u]",
        "step_counters": written_vars(step_vars),
    }


def lstm_basic_values(ctx: OpContext) -> dict:
    p: LstmBasicParams = ctx.params
    x, h, w, bias, c = ctx.inputs
    total = p.n_input + p.depth
    batch = ConstantLoop("b", p.batch)
    units, gates = ConstantLoop("u", p.depth), ConstantLoop("u", 4 * p.depth)
    at = c_sum([(batch, p.depth), (units, 1)])
    row, row_decl = c_pointer("row", "float", "concat", [(batch, total)])
    g, g_decl = c_pointer("g", "float", "gates", [(batch, 4 * p.depth)])

    def sigmoid(value: str) -> str:
        return _float_activation("SIGMOID", value)

    def gate(k: int) -> str:
        """Gate k's pre-activation for unit u (input, new input, forget, output)."""
        return f"{g}[{c_sum([(units, 1)], k * p.depth)}]"

    comment = (f"LSTM '{ctx.outputs[0].name}' (BASIC kernel, float32): {p.batch} batch "
               f"row{'s' if p.batch > 1 else ''}, {p.n_input} inputs, {p.depth} units, one step "
               "per invoke. The input and the previous activation are concatenated, one fully "
               "connected layer gives the input, new input, forget and output gates' "
               "pre-activations, then state = sigmoid(i) * tanh(g) + sigmoid(f) * previous "
               "state and activation = sigmoid(o) * tanh(state), copied back into the state "
               "variables as LiteRT does (its matrix product and activations may round "
               "differently).")
    return {
        "fn": ctx.fn, "comment": c_comment(comment), "x": x.ptr, "h": h.ptr, "w": w.ptr,
        "bias": bias.ptr, "c": c.ptr,
        "outputs": [o.ptr for o in ctx.outputs], "batch": batch, "gates_loop": gates,
        "units": units,
        "counters": ", ".join(filter(None, [written_vars([batch, gates, units]) or "u", "k"])),
        "row_pointers": row_decl + g_decl,
        "concat_x": f"memcpy({row}, {c_offset('x', [(batch, p.n_input)])}, "
                    f"{p.n_input} * sizeof(float));",
        "concat_h": f"memcpy({c_offset(row, [], p.n_input)}, "
                    f"{c_offset('h', [(batch, p.depth)])}, {p.depth} * sizeof(float));",
        "row": row, "total": total,
        "gate_store": f"{g}[{gates.index}] = sum + bias[{gates.index}];",
        "weights_row": c_offset("w", [(gates, total)]),
        "cell": [
            f"const float input_gate = {sigmoid(gate(0))};",
            f"const float forget_gate = {sigmoid(gate(2))};",
            f"const float output_gate = {sigmoid(gate(3))};",
            f"state[{at}] = input_gate * tanhf({gate(1)}) + forget_gate * c[{at}];",
            f"activation[{at}] = output_gate * tanhf(state[{at}]);"],
        "bytes": f"{p.batch * p.depth} * sizeof(float)",
    }


def _int16_sigmoid_function(name: str, p: Int16SigmoidParams) -> dict:
    """One of the int16x8 cell's activations, as the int16 LOGISTIC or TANH op's function
    (templates/c/activations.c.j2) named `name`_op."""
    product = f"x * {p.multiplier}"
    rescaled = f"({product} + {p.rounding}) >> {p.shift}" if p.shift else product
    return {"prefix": name, "rescaled": rescaled, "logistic": p.function == "LOGISTIC"}


def lstm_int16_values(ctx: OpContext) -> dict:
    p: LstmInt16Params = ctx.params
    s = p.shape
    v = _shared_values(ctx, "int16_t", "int16_t")
    prefix, name = ctx.prefix, ctx.outputs[0].name
    layout = p.wiring.layout
    j = v["elements"].index
    functions = {INT16_SIGMOID: f"{prefix}_sigmoid", INT16_GATE_TANH: f"{prefix}_tanh"}
    functions.setdefault(p.cell_tanh, f"{prefix}_cell_tanh")
    tables, gates = [], []
    for gate in p.gates:
        k = GATES.index(gate.name)
        buffer = f"{gate.name}_gate"
        biases = []
        for values, what, key in (
                (gate.input_bias, "its bias less the input zero point times each row of its "
                                  "input weights", "bias"),
                (gate.recurrent_bias, "minus the output state's zero point times each row of "
                                      "its recurrent weights", "recurrent_bias")):
            if not any(values):
                biases.append("NULL")
                continue
            table = f"{prefix}_{gate.name}_gate_{key}"
            product = "input" if key == "bias" else "recurrent"
            tables.append(_table(f"{ctx.op.opcode} '{name}': the {gate.name} gate's {product} "
                                 f"product starts from {what}", "int64_t", table, values))
            biases.append(table)
        activation = INT16_GATE_TANH if gate.name == "cell" else INT16_SIGMOID
        lines = [f"memset({buffer}, 0, {s.rows * s.n_cell} * sizeof(int16_t));",
                 *_wrapped(f"{prefix}_accumulate",
                           [buffer, "x", str(s.n_input), ctx.inputs[layout.input_weights[k]].ptr,
                            biases[0], str(gate.input_multiplier), str(gate.input_shift)], ";"),
                 *_wrapped(f"{prefix}_accumulate",
                           [buffer, "h", str(s.n_output),
                            ctx.inputs[layout.recurrent_weights[k]].ptr, biases[1],
                            str(gate.recurrent_multiplier), str(gate.recurrent_shift)], ";")]
        gates.append({
            "name": gate.name, "lines": lines,
            "comment": f"/* {gate.name} gate: the {GATE_ACTIVATIONS[gate.name]} of its "
                       "pre-activation at Q3.12 */",
            "activation": f"{buffer}[{j}] = {functions[activation]}_op({buffer}[{j}]);",
        })
    clip = p.cell_clip
    cell_min, cell_max = (-clip, clip) if clip is not None else (-32768, 32767)
    comment = (f"{_title(ctx)} (int16 activations, int8 weights, int16 cell state): "
               f"{_extent(p)}, {s.n_input} inputs, {s.n_cell} cells. As TFLite Micro's kernel "
               "computes it: each gate's input and recurrent products summed in int64, "
               "requantized by the 64-bit MultiplyByQuantizedMultiplier and saturated to int16 "
               "each, then added; the int16 LOGISTIC and TANH's table for the gates and the "
               "cell; the cell update and the hidden values as int16 elementwise products, each "
               "requantized and saturated. The zero points are folded into the biases.")
    return {
        **v, "sequence_comment": c_comment(comment + v["order"]), "tables": tables,
        "gates": gates,
        "functions": [_int16_sigmoid_function(f, a) for a, f in functions.items()],
        "accumulate_signature": _signature(prefix, "accumulate", [
            "int16_t *gate", "const int16_t *v", "int depth", "const int8_t *w",
            "const int64_t *bias", "int32_t multiplier", "int shift"]),
        "update_comment": c_comment(
            "cell state: f * c and i * g each requantized and saturated to int16, their sum "
            "saturated" + (f" and clipped to +-{clip}" if clip is not None else ""), "  "),
        "kept": f"arenac_mbqm((int32_t)forget_gate[{j}] * c[{j}], {p.forget_multiplier}, "
                f"{p.forget_shift})",
        "added": f"arenac_mbqm((int32_t)input_gate[{j}] * cell_gate[{j}], {p.update_multiplier}, "
                 f"{p.update_shift})",
        "cell_min": cell_min, "cell_max": cell_max,
        "hidden_comment": c_comment(
            "output state: tanh(c) * o requantized to int16"
            + (f", plus its zero point {p.hidden_zero_point}" if p.hidden_zero_point else ""),
            "  "),
        "tanh_c": f"{functions[p.cell_tanh]}_op(c[{j}])",
        "hidden_store": f"h[{j}] = (int16_t)arenac_clamp(arenac_mbqm(product, "
                        f"{p.hidden_multiplier}, {p.hidden_shift}){plus(p.hidden_zero_point)}, "
                        "-32768, 32767);",
    }


def emit_lstm(ctx: OpContext) -> Kernel:
    if isinstance(ctx.params, LstmBasicParams):
        return Kernel(render_macro(TEMPLATE, "lstm_basic", lstm_basic_values(ctx)),
                      includes=(MATH_H,))
    if isinstance(ctx.params, LstmHybridParams):
        return Kernel(render_macro(TEMPLATE, "lstm_float", lstm_hybrid_values(ctx)),
                      includes=(MATH_H,))
    if isinstance(ctx.params, LstmFloatParams):
        return Kernel(render_macro(TEMPLATE, "lstm_float", lstm_float_values(ctx)),
                      includes=(MATH_H,))
    if isinstance(ctx.params, LstmInt16Params):
        return Kernel(render_macro(TEMPLATE, "lstm_int16", lstm_int16_values(ctx)),
                      ("int16_sigmoid_table", "mbqm", "clamp"))
    helpers = ("int16", "mbqm", "clamp", *(("gemmlowp_inv_sqrt",) if ctx.params.layer_norm
                                          else ()))
    return Kernel(render_macro(TEMPLATE, "lstm_integer", lstm_integer_values(ctx)), helpers)


def emit_bidirectional_lstm(ctx: OpContext) -> Kernel:
    """Each cell as the unidirectional op's float C (its own functions, on the shared scratch),
    and the op's function running the forward cell, then the backward one."""
    p: BidirectionalLstmParams = ctx.params
    purposes = [r.purpose for r in bidirectional_scratch(p)]
    values = {"fn": ctx.fn, "prefix": ctx.prefix}
    helpers = ""  # the backward cell's step calls the forward cell's (identical) helpers
    for cell, key, short in ((p.forward, "forward", "fw"), (p.backward, "backward", "bw")):
        scratch = tuple(ctx.scratch[purposes.index(r.purpose)] for r in lstm_scratch(cell))
        cell_ctx = replace(ctx, fn=f"{ctx.prefix}_{key}", prefix=f"{ctx.prefix}_{short}",
                           params=cell, scratch=scratch)
        cell_values = (lstm_hybrid_values if isinstance(cell, LstmHybridParams)
                       else lstm_float_values)(cell_ctx, helpers)
        values[key] = render_macro(TEMPLATE, "lstm_float", cell_values)
        values[f"{key}_fn"] = cell_ctx.fn
        helpers = helpers or cell_ctx.prefix
    outputs = (f"both into '{ctx.outputs[0].name}', the forward cell's outputs first in each "
               "row" if p.merge_outputs else "each into its own output")
    values["comment"] = c_comment(
        f"{ctx.op.opcode} '{ctx.outputs[0].name}': the forward cell over the sequence, then "
        f"the backward cell from its last step to its first, {outputs}.")
    return Kernel(render_macro(TEMPLATE, "bidirectional", values), includes=(MATH_H,))


def cell_form(dtype: str) -> str:
    """One cell's 17 inputs in a signature: the input gate, peepholes and projection optional."""
    optional, required = f"{dtype}?", dtype
    return ", ".join([optional, *[required] * 3, optional, *[required] * 3, *[optional] * 4,
                      *[required] * 3, optional, optional])


# The hybrid cell: int8 weights, float32 biases (and projection bias).
HYBRID_CELL = ("int8?, int8, int8, int8, int8?, int8, int8, int8, int8?, int8?, int8?, "
                "float32?, float32, float32, float32, int8?, float32?")
