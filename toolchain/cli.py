"""`arenac`: a thin command line over the library. Parse, call, print.

Every failure a user can cause ends in one line on stderr and exit status 2, before any output
file is written.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from toolchain import __version__, progress
from toolchain.errors import ArenacError
from toolchain.files import read_bounded, write_atomic, write_files_atomic
from toolchain.options import (
    add_bench_options,
    add_check_options,
    add_embed_options,
    add_gen_options,
    add_inspect_options,
    add_model,
    add_plan_options,
    add_planning,
    add_project_options,
    add_report_options,
    add_run_options,
    add_solve_options,
    planning,
)
from toolchain.text import middle_cut

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def emit_json(data: Any) -> None:
    """Strict JSON: a NaN or infinite figure (a shape mismatch's difference) becomes null
    (the walk that finds them only when the encoder met one: a large plan has none)."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(finite(data), indent=2, allow_nan=False)
    print(text)


def finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


# --- commands ---------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from toolchain.front.reader import read_model
    from toolchain.views.report import inspect_data, inspect_text

    if args.ops:
        from toolchain.views.support import support_rows, support_table

        if args.model is not None:
            raise ArenacError("inspect takes a model or --ops, not both", args.model)
        emit_json(support_rows()) if args.json else print(support_table())
        return 0
    if args.model is None:
        raise ArenacError("inspect needs a model (a .tflite file), or --ops")
    data = inspect_data(read_model(args.model, max_bytes=args.max_bytes))
    emit_json(data) if args.json else print(inspect_text(data))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from toolchain.planners.csvio import dump_buffers
    from toolchain.targets import BOARDS, PARTS
    from toolchain.views.report import memory_map_svg, plan_data, plan_text

    if (args.measure or args.board) and not args.layers:
        raise ArenacError("--measure and --board go with --layers", args.model)
    if args.board and not args.measure:
        raise ArenacError("--board gives the limits --measure holds the firmware to: give "
                          "--measure too", args.model)
    if args.board is not None and args.board not in {*BOARDS, *PARTS}:
        raise ArenacError(f"no board {args.board!r}; the boards are "
                          f"{', '.join(sorted({*BOARDS, *PARTS}))}", args.model)
    mp = planned(args)
    outputs = {}
    if args.svg:
        outputs[args.svg] = memory_map_svg(mp)
    if args.dump_buffers:
        text = io.StringIO()
        dump_buffers(mp.lifetimes.buffers, text)
        outputs[args.dump_buffers] = text.getvalue()
    for path, text in outputs.items():
        write_atomic(path, text)
    if args.layers:
        from toolchain.views.layers import board_limits, layers_data, layers_text

        measured = limits = None
        if args.measure:
            from toolchain.lab.bench import bench

            limits = board_limits(mp, args.board)
            measured = bench(mp)
        emit_json(layers_data(mp, measured, limits)) if args.json \
            else print(layers_text(mp, measured, limits))
        return 0
    emit_json(plan_data(mp)) if args.json else print(plan_text(mp))
    return 0


def planned(args: argparse.Namespace):
    """Read the model and plan it as the planning options say."""
    from toolchain.front.reader import read_model
    from toolchain.lower.plan import plan_model

    model_plan = plan_model(read_model(args.model, max_bytes=args.max_bytes), **planning(args))
    if model_plan.clock_cut and args.command != "plan":  # `plan` says it in its report
        from toolchain.views.report import CLOCK_CUT

        print(f"arenac: warning: {args.model}: --time-limit {args.time_limit:g} s {CLOCK_CUT}",
              file=sys.stderr)
    return model_plan


def load_input(path: str):
    from toolchain.files import load_arrays

    value = load_arrays(path)
    if isinstance(value, dict):
        raise ArenacError("an .npz archive: --input takes one .npy array per model input "
                          "(check --input reads archives)", path)
    return value


def make_directory(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ArenacError(f"cannot create directory ({e.strerror})", path) from None


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from runtime_py.interpreter import ArenaInterpreter

    mp = planned(args)
    runtime = ArenaInterpreter(mp, max_iterations=args.max_iterations)
    arrays = [load_input(p) for p in args.input]
    steps, stacked = input_steps(mp.graph, arrays, args.input, args.model)
    results = [runtime.invoke(values) for values in steps]  # state carries from step to step
    ran = [r for r in results if r]  # an invoke a CIRCULAR_BUFFER ended early gives none
    if not ran:
        raise ArenacError(f"{'every' if stacked else 'the'} invoke ended early (a "
                          "CIRCULAR_BUFFER still gathering frames): no outputs; give more "
                          "steps ([T, *shape] inputs)", args.model)
    outputs = [np.stack([r[i] for r in ran]) if stacked else ran[0][i]
               for i in range(len(mp.graph.outputs))]
    make_directory(args.output_dir)
    saved = []
    for i, value in enumerate(outputs):
        path = os.path.join(args.output_dir, f"output_{i}.npy")
        buffer = io.BytesIO()
        np.save(buffer, value)
        write_atomic(path, buffer.getvalue())
        saved.append(
            {"index": i, "path": path, "dtype": str(value.dtype), "shape": list(value.shape)}
        )
    if args.json:
        emit_json(
            {
                "model": args.model,
                "planner": args.planner,
                "arena_bytes": mp.arena_bytes,
                "state_bytes": mp.state_bytes,
                "steps": len(steps) if stacked else None,
                "ended_early": len(results) - len(ran),
                "outputs": saved,
            }
        )
    else:
        if stacked:
            print(f"{len(steps)} steps, state kept from one to the next")
        if len(ran) < len(results):
            print(f"{len(results) - len(ran)} of them ended early (a CIRCULAR_BUFFER gathering "
                  f"frames): the outputs stack the other {len(ran)}")
        for o in saved:
            print(f"output {o['index']}: {o['dtype']}{o['shape']} -> {o['path']}")
    return 0


def input_steps(graph, arrays: list, paths: list[str], model: str):
    """The input sets of a run, and whether the files stack them: a file holding one input's
    shape runs once; one of shape [T, *shape] holds that input for T consecutive invokes.
    Every input's file must be of the same kind, and stacked ones of the same T."""
    import numpy as np

    if len(arrays) != len(graph.inputs):
        raise ArenacError(f"model takes {len(graph.inputs)} inputs, got {len(arrays)} "
                          "(one --input per model input)", model)
    kinds = []
    for i, (t, value, path) in enumerate(zip(graph.inputs, arrays, paths, strict=True)):
        tensor = graph.tensors[t]
        shape = tuple(value.shape)
        if value.dtype == np.dtype(tensor.dtype) and shape == tensor.shape:
            kinds.append(None)
        elif value.dtype == np.dtype(tensor.dtype) and shape[1:] == tensor.shape and shape[0]:
            kinds.append(shape[0])
        else:
            dims = list(tensor.shape)
            raise ArenacError(
                f"input {i} ({tensor.name!r}) must be {tensor.dtype}{dims} (one invoke) or "
                f"{tensor.dtype}{['T', *dims]} (T invokes in a row); the file holds "
                f"{value.dtype}{list(shape)}".replace("'T'", "T"),
                path,
            )
    if len(set(kinds)) > 1:
        said = ", ".join("one value" if k is None else f"{k} steps" for k in kinds)
        raise ArenacError(f"the input files must hold as many steps each; they hold {said}",
                          model)
    steps = kinds[0] if kinds else None
    if steps is None:
        return [arrays], False
    return [[a[k] for a in arrays] for k in range(steps)], True


def cmd_gen(args: argparse.Namespace) -> int:
    from toolchain.c.generate import generate, generate_shared

    models = [args.model, *args.more_models]
    names = args.name or [os.path.splitext(os.path.basename(m))[0] for m in models]
    if len(names) != len(models):
        raise ArenacError(f"{len(models)} models take {len(models)} --name options (one per "
                          f"model, in order), not {len(names)}", args.model)
    if len(models) == 1:
        plans = [planned(args)]
        files = generate(plans[0], names[0], external_io=args.external_io, arena=args.arena,
                         fragments=True)
    else:  # one arena for all, each model planned with the same options
        plans = [planned(argparse.Namespace(**{**vars(args), "model": m})) for m in models]
        files = generate_shared(list(zip(plans, names, strict=True)), args.external_io, args.arena,
                                fragments=True)
    paths = write_files_atomic(args.output_dir, files)
    mp = max(plans, key=lambda p: p.arena_bytes)
    if args.json:
        emit_json(
            {
                "model": args.model,
                "planner": mp.plan.planner,
                "arena_bytes": mp.arena_bytes,
                "files": paths,
                **({"models": [{"model": m, "name": n, "arena_bytes": p.arena_bytes,
                                "state_bytes": p.state_bytes}
                               for m, n, p in zip(models, names, plans, strict=True)]}
                   if len(models) > 1 else {}),
            }
        )
    elif len(models) > 1:
        each = ", ".join(f"{n} {p.arena_bytes}" for n, p in zip(names, plans, strict=True))
        print(f"shared arena {mp.arena_bytes} bytes ({each}); wrote " + ", ".join(paths))
    else:
        print(f"arena {mp.arena_bytes} bytes ({mp.plan.planner}); wrote " + ", ".join(paths))
    return 0


def cmd_project(args: argparse.Namespace) -> int:
    from toolchain.lab.project import board_target, default_inputs, project_files, write_project
    from toolchain.lower.memory import load_memory
    from toolchain.targets import DEFAULT_BOARD, PARTS

    described = load_memory(args.memory).part if args.memory else None
    if described is not None and args.board is not None:
        raise ArenacError("--board and a [part] in --memory both name the board: give one",
                          args.memory)
    args.board = described.name if described else args.board or DEFAULT_BOARD
    part = described or PARTS.get(args.board)
    args.target = part.target if part else board_target(args.board).name
    mp = planned(args)
    if args.input:
        arrays = [load_input(p) for p in args.input]
        steps, stacked = input_steps(mp.graph, arrays, args.input, args.model)
        if stacked:
            raise ArenacError("--input holds one invoke's values for main.c", args.input[0])
        inputs = steps[0]
    else:
        inputs = default_inputs(mp)
    name = args.name or os.path.splitext(os.path.basename(args.model))[0]
    paths = write_project(args.output_dir, project_files(mp, name, inputs, args.serial, part),
                          args.force)
    if args.json:
        emit_json({"model": args.model, "board": args.board, "target": args.target,
                   "arena_bytes": mp.arena_bytes, "files": paths})
    else:
        how = ", then load the ELF with a probe as its Makefile says" if part else " run"
        print(f"{args.board} ({args.target}) project, arena {mp.arena_bytes} bytes: "
              f"make -C {args.output_dir}{how} (or CMake with arm-none-eabi.cmake)")
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    """TFLite Micro's kernels were not written for shared buffers: export a plan without
    in-place or overlapping tensors, in the file's operator order."""
    from toolchain.tflm.embed import embed_file, measure_tflm_arena

    args.no_inplace = args.no_overlap = args.no_fuse_padding = True
    args.schedule, args.tiling = "model", "off"
    if args.pool or args.memory:
        raise ArenacError("TFLite Micro plans one arena: embed takes no pools", args.model)
    mp = planned(args)
    embed_file(args.model, args.output, mp)
    with open(args.output, "rb") as f:
        embedded = f.read()
    room = 2 * mp.arena_bytes + len(embedded) + (4 << 20)
    arena = measure_tflm_arena(embedded, room, args.output)
    # TFLM's own plan of the file as it was: an offline plan that needs more is worth a word
    own = None if arena is None else measure_tflm_arena(read_bounded(args.model, args.max_bytes),
                                                        room, args.model)
    if own is not None and arena.head > own.head:
        print(f"arenac: warning: {args.output}: with this plan TFLite Micro's head is "
              f"{arena.head} bytes, above the {own.head} of its own plan of {args.model} "
              "(TFLM places its kernels' scratch around an offline plan): the original file needs "
              "less", file=sys.stderr)
    if args.json:
        emit_json({"model": args.model, "output": args.output, "planner": mp.plan.planner,
                   "arena_bytes": mp.arena_bytes, "measured": arena is not None,
                   "head_bytes": arena and arena.head, "tail_bytes": arena and arena.tail,
                   "total_bytes": arena and arena.total,
                   "own_head_bytes": own and own.head})
    elif arena is None:
        print(f"{args.output}: TFLite Micro's head will be {mp.arena_bytes} bytes "
              f"({mp.plan.planner} plan) plus any scratch its kernels request, and its tail "
              "(its own records) comes on top; install tflite-micro to measure the whole arena")
    else:
        print(f"{args.output}: allocate {arena.total} bytes for TFLite Micro with this plan: "
              f"head {arena.head} (the {mp.plan.planner} plan's {mp.arena_bytes} and any scratch "
              f"of its kernels) + tail {arena.tail} (its own records), as measured in the "
              "tflite-micro interpreter on this host")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from toolchain.lab.c_backend import CBackend
    from toolchain.lab.check import check_layers, check_plan, compare_edges, edge_inputs

    if args.inputs is None:
        args.inputs = 3
    if args.backends is None:  # portable C on the host; a target's C on its QEMU machine
        args.backends = ("runtime_py", "c") if args.target == "generic" else ("runtime_py", "qemu")
    if "c" in args.backends and args.target != "generic":
        raise ArenacError(f"the c backend builds for this host; C made for --target "
                          f"{args.target} runs under --backends runtime_py,qemu", args.model)
    if ("device" in args.backends) != (args.device is not None):
        raise ArenacError("the device backend and --device go together: give both or neither",
                          args.model)
    mp = planned(args)
    model_bytes = read_bounded(args.model, args.max_bytes)
    data = user_data(mp.graph, args)
    if args.per_layer and "device" in args.backends:
        raise ArenacError("--per-layer traces runtime_py, c and qemu; the device's self-test "
                          "firmware gives outputs only", args.model)
    if args.per_layer and mp.streamed_outputs:
        raise ArenacError("--per-layer traces each layer's output whole, and a streamed output "
                          "never is: check it without --per-layer (the outputs are compared "
                          "whole) or trace the plan without --stream-output", args.model)
    if args.per_layer:
        with contextlib.ExitStack() as stack:
            layers = check_layers(mp, model_bytes, args.seed, oracle_timeout=args.oracle_timeout,
                                  tracers=tracers(mp, args.backends, stack,
                                                  args.max_iterations),
                                  values=data[1][0] if data else None)
        first_bad = {name: next((x for x in rows if x.output.mismatches), None)
                     for name, rows in layers.items()}
        ok = all(bad is None for bad in first_bad.values())
        if args.json:
            emit_json({"model": args.model, "ok": ok, "backends": list(layers),
                       "layers": layers_data(mp.graph, layers),
                       "striped": [{"ops": list(inner), "compared_at": at}
                                   for inner, at in striped_ops(mp)],
                       "first_divergence": {name: None if bad is None else layer_data(
                           mp.graph, bad) for name, bad in first_bad.items()}})
        else:
            print(layers_text(mp.graph, layers, first_bad, striped_ops(mp)))
        return 0 if ok else 1
    if args.sanitize and "c" not in args.backends:
        raise ArenacError("--sanitize builds the host C: give --backends with c", args.model)
    device = None
    with contextlib.ExitStack() as stack:
        extra = []
        if "c" in args.backends:
            c = stack.enter_context(CBackend(mp, sanitize=args.sanitize))
            extra.append(("c", c.invoke_many))
        if "qemu" in args.backends:
            from toolchain.lab.qemu_backend import QemuBackend

            extra.append(("qemu", stack.enter_context(QemuBackend(mp)).invoke_many))
        if "device" in args.backends:
            from toolchain.lab.device import DeviceBackend

            device = stack.enter_context(DeviceBackend(mp, args.device, args.baud,
                                                       args.device_timeout))
            extra.append(("device", device.invoke_many))
        report = check_plan(
            mp, model_bytes, args.inputs, args.seed, extra,
            runtime_py="runtime_py" in args.backends, oracle_timeout=args.oracle_timeout,
            sequence=args.sequence, data=data, max_iterations=args.max_iterations,
            labels=read_labels(args.labels, len(data[1])) if args.labels else None,
        )
        edges = compare_edges(mp, c.invoke_many, args.max_iterations) if args.sanitize else []
    ticks = {"device_ticks": device.ticks, "device_counter_hz": device.counter_hz} \
        if device else {}
    if args.json:
        emit_json({**report.as_dict(), **({"edge_differences": edges} if args.sanitize else {}),
                   **ticks, "ok": report.ok and not edges})
    else:
        print(check_text(report, args.inputs))
        if device and device.ticks:
            print(f"device {args.device}: each invoke {min(device.ticks):,} to "
                  f"{max(device.ticks):,} ticks of its counter at {device.counter_hz:,} Hz")
        if args.sanitize:
            print(edges_text(edges, len(edge_inputs(mp.graph))))
    return 0 if report.ok and not edges else 1


def edges_text(differences: list[str], sets: int) -> str:
    from toolchain.text import display_text

    if not differences:
        return (f"edge inputs (NaN, +-inf, denormals, +-max): runtime_py and the C built with "
                f"ASan and UBSan agree on all {sets} sets")
    return "\n".join(["edge inputs: runtime_py and the sanitized C differ:",
                      *(f"  {display_text(d)}" for d in differences)])


def user_data(graph, args: argparse.Namespace):
    """(where from, input sets) of --input or --dataset; None for random inputs."""
    from toolchain.lab.samples import load_dataset, load_samples

    if args.input:
        return args.input, load_samples(graph, args.input, args.quantize_inputs)
    if args.dataset:
        return args.dataset, load_dataset(graph, args.dataset, args.quantize_inputs)
    if args.quantize_inputs or args.labels:
        raise ArenacError("--quantize-inputs and --labels go with --input or --dataset")
    return None


def read_labels(path: str, samples: int) -> list[int]:
    """The class of each of `samples` samples: a .npy of integers, or integers in text."""
    import numpy as np

    from toolchain.files import load_arrays

    if path.lower().endswith(".npy"):
        values = load_arrays(path)
        if not isinstance(values, np.ndarray) or values.dtype.kind not in "iu":
            raise ArenacError("labels must be an .npy array of integers", path)
        labels = [int(v) for v in values.ravel()]
    else:
        words = read_bounded(path).decode(errors="replace").replace(",", " ").split()
        try:
            labels = [int(w) for w in words]
        except ValueError:
            raise ArenacError("labels must be integers, one per sample", path) from None
    if len(labels) != samples:
        raise ArenacError(f"{len(labels)} labels for {samples} samples", path)
    return labels


def tracers(mp, backends: tuple[str, ...], stack: contextlib.ExitStack,
            max_iterations: int) -> list:
    """What --per-layer compares with the oracle: each backend asked for, as a tracer."""
    from toolchain.lab.c_backend import CBackend
    from toolchain.lab.check import runtime_py_tracer

    made = []
    for name in backends:
        if name == "runtime_py":
            made.append((name, runtime_py_tracer(mp, max_iterations)))
        elif name == "c":
            made.append((name, stack.enter_context(CBackend(mp, trace=True)).trace))
        else:
            from toolchain.lab.qemu_backend import QemuBackend

            made.append((name, stack.enter_context(QemuBackend(mp, trace=True)).trace))
    return made


def cmd_report(args: argparse.Namespace) -> int:
    from toolchain.views.html import report_html

    mp = planned(args)
    model_bytes = read_bounded(args.model, args.max_bytes)
    write_atomic(args.output, report_html(mp, model_bytes, args.inputs, args.seed,
                                          check=not args.no_check,
                                          footprint=not args.no_footprint))
    if args.json:
        emit_json({"model": args.model, "output": args.output, "arena_bytes": mp.arena_bytes})
    else:
        print(f"wrote {args.output}: arena {mp.arena_bytes} bytes ({mp.plan.planner})")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from toolchain.lab.bench import bench, bench_text

    result = bench(planned(args), optimization=f"-{args.optimize}",
                   wait_states=args.wait_states)
    emit_json(result.as_dict()) if args.json else print(bench_text(result))
    return 0 if result.outputs_match is not False else 1


def cmd_solve(args: argparse.Namespace) -> int:
    from toolchain.planners.solve import solution_csv, solve, solved_text

    solved = solve(args.problem, args.capacity, args.time_limit, args.align, args.nodes)
    if args.output and solved.plan is not None:
        write_atomic(args.output, solution_csv(solved))
    emit_json(solved.as_dict()) if args.json else print(solved_text(solved))
    return 0 if solved.plan is not None else 1


def check_text(report, inputs: int) -> str:
    from toolchain.text import table

    rows = [
        [
            o.name,
            o.dtype,
            format_diff(o.max_abs_diff),
            o.mismatches,
            "ok" if o.mismatches == 0 else "DIFFERS",
            "-" if o.top1_agree is None else f"{o.top1_agree}/{o.invokes}",
            "-" if o.first_mismatch is None
            else f"sequence {o.first_mismatch[0]} invoke {o.first_mismatch[1]}",
        ]
        for o in report.outputs
    ]
    if report.data is not None:
        count = report.outputs[0].invokes if report.outputs else 0
        said = f"{count} input set(s) from {report.data}"
        if report.sequence > 1:
            said += f", in sequences of {report.sequence} invokes, state kept"
    elif report.sequence > 1 or report.state_bytes:
        said = (f"{inputs} random sequence(s) of {report.sequence} invokes; state kept within "
                "a sequence, reset between")
    else:
        said = f"{inputs} random input set(s)"
    if report.ended:
        said += (f"; {report.ended} invoke(s) ended early in the oracle (a CIRCULAR_BUFFER "
                 "gathering frames), compared by that alone")
    state = f", state {report.state_bytes} bytes" if report.state_bytes else ""
    return "\n".join(
        [
            f"model     {report.model}",
            f"plan      {report.planner}, arena {report.arena_bytes} bytes{state}",
            f"backends  {report.backends[0]} (oracle) vs {', '.join(report.backends[1:])}",
            f"inputs    {said}",
            "",
            table(["output", "dtype", "max |diff|", "mismatches", "verdict", "top-1 agree",
                   "first differs"], rows),
            "",
            *agreement_lines(report),
            "verdict: " + ("all backends agree" if report.ok else "MISMATCH"),
        ]
    )


def agreement_lines(report) -> list[str]:
    """Float outputs' RMSE and cosine similarity, and the accuracy on labels, each a line,
    then a blank line; nothing when there are neither."""
    lines = [f"{o.name}: rmse {o.rmse:.3g}, cosine similarity {o.cosine:.9f}"
             for o in report.outputs if o.rmse is not None]
    for a in report.accuracy:
        k = f", top-{a['k']} {a['topk']}/{a['samples']}" if a["k"] else ""
        differs = a["differs_from_oracle"]
        said = (f"; top-1 differs from the oracle's on {len(differs)} sample(s): "
                + ", ".join(map(str, differs[:10])) + (" ..." if len(differs) > 10 else "")
                if differs else "")
        lines.append(f"labels {a['engine']}: top-1 {a['top1']}/{a['samples']}{k}{said}")
    return [*lines, ""] if lines else []


def format_diff(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def layer_data(graph, layer) -> dict:
    return {"op": layer.op, "opcode": layer.opcode, "tensor": layer.tensor,
            "tensor_name": graph.tensors[layer.tensor].name,
            "max_abs_diff": layer.output.max_abs_diff, "mismatches": layer.output.mismatches}


def layers_data(graph, layers: dict) -> list[dict]:
    """One entry per op: its worst output tensor in each backend."""
    return [{"op": same[0].op, "opcode": same[0].opcode,
             "backends": {name: layer_data(graph, x) for name, x in zip(layers, same, strict=True)}}
            for same in zip(*layers.values(), strict=True)]


def striped_ops(mp) -> list[tuple[tuple[int, ...], int]]:
    """Per striped segment, the ops whose outputs exist only as stripe rows (so no per-layer
    check can see them whole) and the op whose output, whole, stands for them."""
    return [(s.ops[:-1], s.ops[-1]) for s in mp.tiling.segments if len(s.ops) > 1]


def layers_text(graph, layers: dict, first_bad: dict,
                striped: list[tuple[tuple[int, ...], int]] = ()) -> str:
    from toolchain.text import table

    rows = [
        [same[0].op, same[0].opcode, middle_cut(graph.tensors[same[0].tensor].name, 40)]
        + [f"{format_diff(x.output.max_abs_diff)} ({x.output.mismatches})" for x in same]
        for same in zip(*layers.values(), strict=True)
    ]
    lines = [table(["op", "type", "tensor", *layers], rows),
             "(per backend: largest |diff| from the oracle, and in brackets the elements that "
             "differ)", ""]
    for inner, at in striped:
        lines.append(f"ops {', '.join(map(str, inner))} run in stripes: their outputs exist only "
                     f"as stripe rows, so op {at}'s output checks them (--tiling off checks each)")
    if striped:
        lines.append("")
    for name, bad in first_bad.items():
        if bad is None:
            lines.append(f"{name}: every layer agrees with the oracle")
            continue
        worst_in = max((d.max_abs_diff for d in bad.inputs), default=0.0)
        lines.append(
            f"{name}: first divergence at op {bad.op} ({bad.opcode}), tensor {bad.tensor} "
            f"{graph.tensors[bad.tensor].name!r}: inputs differ by at most "
            f"{format_diff(worst_in)}, output by {format_diff(bad.output.max_abs_diff)} "
            f"({bad.output.mismatches} elements)"
        )
    return "\n".join(lines)


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int], list[Callable]]] = {
    "inspect": ("show operators, tensors and totals of a model, or (--ops) what runs here",
                cmd_inspect, [add_inspect_options]),
    "plan": ("plan the activation arena and show where every tensor lives", cmd_plan,
             [add_model, add_planning, add_plan_options]),
    "run": ("run the model in runtime_py inside its planned arena and save the outputs", cmd_run,
            [add_model, add_planning, add_run_options]),
    "gen": ("generate C: static arena, offset table, const weights, kernels", cmd_gen,
            [add_model, add_planning, add_gen_options]),
    "check": ("compare TFLite's reference kernels, runtime_py and the compiled C", cmd_check,
              [add_model, add_planning, add_check_options]),
    "bench": ("count the instructions the C executes per inference on a Cortex-M under QEMU, "
              "and estimate their cycles",
              cmd_bench, [add_model, add_planning, add_bench_options]),
    "project": ("write a firmware project for a QEMU Arm board: startup code, linker script, a "
                "main.c that runs the model on a test input, a Makefile and a CMakeLists.txt",
                cmd_project, [add_model, add_planning, add_project_options]),
    "embed": ("write a copy of the model carrying the plan for TFLite Micro "
              "(OfflineMemoryAllocation)", cmd_embed, [add_model, add_planning, add_embed_options]),
    "report": ("one self-contained HTML page: inspect, plan, memory map, footprint and check",
               cmd_report, [add_model, add_planning, add_report_options]),
    "solve": ("solve an allocation problem in MiniMalloc's CSV form (id,lower,upper,size)",
              cmd_solve, [add_solve_options]),
}
# What --help says of a command beyond its one line, where there is more to say.
DESCRIPTIONS = {
    "solve": "Solve an allocation problem in MiniMalloc's CSV form (id,lower,upper,size; lives "
             "half-open): within --capacity bytes, as MiniMalloc does, or as small as the exact "
             "planner can find and prove. Exit status 1 if no plan was found.",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="arenac",
        allow_abbrev=False,
        description="Offline arena planning and C generation for TensorFlow Lite models.",
    )
    parser.add_argument("--version", action="version", version=f"arenac {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, handler, adders) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=DESCRIPTIONS.get(name, help_text),
                           allow_abbrev=False)
        for add in adders:
            add(p)
        p.set_defaults(handler=handler)
    return parser


def one_line(text: str, limit: int = 400) -> str:
    """The error as one line of bounded length, whatever the message carried."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# Collections per allocations: a command builds its graph, plan and text once and holds them
# until it exits, with few cycles among them, so CPython's default (a collection each 700
# allocations, and every object scanned again each tenth) only rescans them: a
# 100,000-operator graph spends a sixth of its planning there.
GC_THRESHOLDS = (50_000, 20, 100)


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    args = build_parser().parse_args(argv)
    progress.enable(progress.wanted(args.quiet))
    try:
        return args.handler(args)
    except ArenacError as e:
        if e.source is None:  # every line names the file it is about
            e.source = getattr(args, "model", None) or getattr(args, "problem", None)
        print(f"arenac: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
