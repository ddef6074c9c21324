"""`arenac`: a thin command line over the library. Parse, call, print.

Every failure a user can cause ends in one line on stderr and exit status 2, before any output
file is written.
"""

from __future__ import annotations

import argparse
import contextlib
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
from toolchain.front.validate import DEFAULT_MAX_BYTES, DEFAULT_MAX_ITERATIONS
from toolchain.planners import PLANNERS
from toolchain.planners.optimal import DEFAULT_NODES
from toolchain.planners.solve import SOLVE_NODES

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def alignment(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"alignment must be a whole number, got {text!r}"
        ) from None
    if value < 1 or value > 4096 or value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"alignment must be a power of two from 1 to 4096, got {value}"
        )
    return value


def emit_json(data: Any) -> None:
    """Strict JSON: a NaN or infinite figure (a shape mismatch's difference) becomes null."""
    print(json.dumps(finite(data), indent=2, allow_nan=False))


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

    data = inspect_data(read_model(args.model, max_bytes=args.max_bytes))
    emit_json(data) if args.json else print(inspect_text(data))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from toolchain.planners.csvio import dump_buffers
    from toolchain.views.report import memory_map_svg, plan_data, plan_text

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


def planning(args: argparse.Namespace) -> dict:
    """plan_model's arguments from the planning options (`add_planning`): every command, the
    footprint too, plans the same way for the same options."""
    from toolchain.lower.plan import Techniques

    options = {"fit": args.fit} if args.planner == "freelist" else {}
    techniques = Techniques(
        inplace=not args.no_inplace, overlap=not args.no_overlap, schedule=args.schedule,
        fuse_padding=not args.no_fuse_padding,
        tiling=args.tiling,
    )
    pools, pins = memory_of(args)
    return dict(
        planner=args.planner,
        alignment=args.align,
        external_io=getattr(args, "external_io", False),
        techniques=techniques,
        offsets_csv=getattr(args, "load_offsets", None),
        time_limit=args.time_limit,
        nodes=args.nodes,
        target=getattr(args, "target", "generic"),
        portable=getattr(args, "portable", False),
        pools=pools,
        pins=pins,
        max_bytes=getattr(args, "max_bytes", DEFAULT_MAX_BYTES),
        **options,
    )


def memory_of(args: argparse.Namespace) -> tuple[list, dict[str, str]]:
    """The pools (a --memory file's, then each --pool) and the pins (--pin after the file's)."""
    from toolchain.lower.memory import load_memory

    memory = load_memory(args.memory) if args.memory else None
    pools = [*(memory.pools if memory else ()), *args.pool]
    pins = {**dict(memory.pins if memory else ()), **dict(args.pin)}
    if pins and not pools:
        raise ArenacError("--pin places tensors in pools: give --pool or --memory too",
                          args.model)
    return pools, pins


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
    outputs = [np.stack([r[i] for r in results]) if stacked else results[0][i]
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
                "outputs": saved,
            }
        )
    else:
        if stacked:
            print(f"{len(steps)} steps, state kept from one to the next")
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
    for i, (t, value, path) in enumerate(zip(graph.inputs, arrays, paths)):
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
    from toolchain.c.fragments import build_fragments
    from toolchain.c.generate import generate, generate_shared

    models = [args.model, *args.more_models]
    names = args.name or [os.path.splitext(os.path.basename(m))[0] for m in models]
    if len(names) != len(models):
        raise ArenacError(f"{len(models)} models take {len(models)} --name options (one per "
                          f"model, in order), not {len(names)}", args.model)
    if len(models) == 1:
        plans = [planned(args)]
        files = generate(plans[0], names[0], external_io=args.external_io, arena=args.arena)
    else:  # one arena for all, each model planned with the same options
        plans = [planned(argparse.Namespace(**{**vars(args), "model": m})) for m in models]
        files = generate_shared(list(zip(plans, names)), args.external_io, args.arena)
    for plan, name in zip(plans, names):
        files.update(build_fragments(plan, name, files))
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
                               for m, n, p in zip(models, names, plans)]}
                   if len(models) > 1 else {}),
            }
        )
    elif len(models) > 1:
        each = ", ".join(f"{n} {p.arena_bytes}" for n, p in zip(names, plans))
        print(f"shared arena {mp.arena_bytes} bytes ({each}); wrote " + ", ".join(paths))
    else:
        print(f"arena {mp.arena_bytes} bytes ({mp.plan.planner}); wrote " + ", ".join(paths))
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
    mp = planned(args)
    model_bytes = read_bounded(args.model, args.max_bytes)
    data = user_data(mp.graph, args)
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
    with contextlib.ExitStack() as stack:
        extra = []
        if "c" in args.backends:
            c = stack.enter_context(CBackend(mp, sanitize=args.sanitize))
            extra.append(("c", c.invoke_many))
        if "qemu" in args.backends:
            from toolchain.lab.qemu_backend import QemuBackend

            extra.append(("qemu", stack.enter_context(QemuBackend(mp)).invoke_many))
        report = check_plan(
            mp, model_bytes, args.inputs, args.seed, extra,
            runtime_py="runtime_py" in args.backends, oracle_timeout=args.oracle_timeout,
            sequence=args.sequence, data=data, max_iterations=args.max_iterations,
        )
        edges = compare_edges(mp, c.invoke_many, args.max_iterations) if args.sanitize else []
    if args.json:
        emit_json({**report.as_dict(), **({"edge_differences": edges} if args.sanitize else {}),
                   "ok": report.ok and not edges})
    else:
        print(check_text(report, args.inputs))
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
        return args.input, load_samples(graph, args.input)
    if args.dataset:
        return args.dataset, load_dataset(graph, args.dataset)
    return None


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
    with open(args.model, "rb") as f:
        model_bytes = f.read()
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

    result = bench(planned(args), optimization=f"-{args.optimize}")
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
    from toolchain.views.report import table

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
            "verdict: " + ("all backends agree" if report.ok else "MISMATCH"),
        ]
    )


def format_diff(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def middle_cut(text: str, limit: int = 40) -> str:
    """A long name as its start and its end, which tell tensors apart best."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return text[:half] + "..." + text[-(limit - 3 - half):]


def layer_data(graph, layer) -> dict:
    return {"op": layer.op, "opcode": layer.opcode, "tensor": layer.tensor,
            "tensor_name": graph.tensors[layer.tensor].name,
            "max_abs_diff": layer.output.max_abs_diff, "mismatches": layer.output.mismatches}


def layers_data(graph, layers: dict) -> list[dict]:
    """One entry per op: its worst output tensor in each backend."""
    return [{"op": same[0].op, "opcode": same[0].opcode,
             "backends": {name: layer_data(graph, x) for name, x in zip(layers, same)}}
            for same in zip(*layers.values())]


def striped_ops(mp) -> list[tuple[tuple[int, ...], int]]:
    """Per striped segment, the ops whose outputs exist only as stripe rows (so no per-layer
    check can see them whole) and the op whose output, whole, stands for them."""
    return [(s.ops[:-1], s.ops[-1]) for s in mp.tiling.segments if len(s.ops) > 1]


def layers_text(graph, layers: dict, first_bad: dict,
                striped: list[tuple[tuple[int, ...], int]] = ()) -> str:
    from toolchain.views.report import table

    rows = [
        [same[0].op, same[0].opcode, middle_cut(graph.tensors[same[0].tensor].name)]
        + [f"{format_diff(x.output.max_abs_diff)} ({x.output.mismatches})" for x in same]
        for same in zip(*layers.values())
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


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to a .tflite file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (shown only when stderr is a terminal)")
    p.add_argument("--max-bytes", type=byte_count, default=DEFAULT_MAX_BYTES, metavar="N",
                   help="refuse a model with a tensor, or activations and state together, "
                        f"larger than N bytes (default: {DEFAULT_MAX_BYTES >> 20} MiB)")


def add_planning(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planner", choices=["best", *sorted(PLANNERS)], default="best",
                   help="arena planner (default: best = the smallest verified plan of all; "
                        "tflm = TFLite Micro's own)")
    p.add_argument("--fit", choices=["first", "best"], default="first",
                   help="free-block choice of the freelist planner (default: first)")
    p.add_argument("--align", type=alignment, default=16, metavar="N",
                   help="offset alignment in bytes, a power of two (default: 16)")
    p.add_argument("--nodes", type=whole, default=DEFAULT_NODES, metavar="N",
                   help="work budget of the exact planner, in search nodes: the same plan on "
                        f"any machine (default: {DEFAULT_NODES:,})")
    p.add_argument("--time-limit", type=seconds, default=None, metavar="S",
                   help="also stop the plan search (schedule and planners) after S seconds; "
                        "the plan may then depend on the machine and its load (default: none)")
    p.add_argument("--no-inplace", action="store_true",
                   help="no output over a dying input (aliases, elementwise ops)")
    p.add_argument("--no-overlap", action="store_true",
                   help="no convolution or pooling output over the rows it has consumed")
    p.add_argument("--no-fuse-padding", action="store_true",
                   help="keep each PAD in front of a convolution or max pool as its own op "
                        "(fused, its padded tensor never exists)")
    p.add_argument("--schedule", choices=["auto", "model"], default="auto",
                   help="operator order: memory-aware (auto, default) or the file's (model)")
    p.add_argument("--tiling", choices=["auto", "off"], default="auto",
                   help="run chains of convolutions and pooling stripe by stripe where that "
                        "lowers the arena (auto, default) or never (off)")
    p.add_argument("--pool", action="append", type=pool_spec, default=[],
                   metavar="NAME:SIZE[:SECTION]",
                   help="a memory pool instead of one arena, SIZE in bytes, K or M; repeat "
                        "fastest first (buffers fill the fastest pool first)")
    p.add_argument("--memory", metavar="FILE",
                   help="pools and pins from a TOML or JSON file (see docs/cortex-m.md)")
    p.add_argument("--pin", action="append", type=pin_spec, default=[], metavar="TENSOR=POOL",
                   help="put a tensor (index or name), or the state block (state=POOL), in a "
                        "pool")


def pool_spec(text: str):
    from toolchain.lower.memory import parse_pool

    try:
        return parse_pool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pin_spec(text: str) -> tuple[str, str]:
    from toolchain.lower.memory import parse_pin

    try:
        return parse_pin(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_target(p: argparse.ArgumentParser, default: str = "generic") -> None:
    from toolchain.targets import TARGETS

    p.add_argument("--target", type=target_name, default=default, metavar="T",
                   help=f"what the C is made for: {', '.join(TARGETS)}; it picks the kernels "
                        f"(default: {default})")


def target_name(text: str) -> str:
    from toolchain.targets import TARGETS

    if text not in TARGETS:
        raise argparse.ArgumentTypeError(
            f"unknown target {text!r}; the targets are {', '.join(TARGETS)}")
    return text


def c_name(text: str) -> str:
    from toolchain.text import name_refusal

    refusal = name_refusal(text)
    if refusal:
        raise argparse.ArgumentTypeError(f"{text!r} {refusal}")
    return text


def byte_count(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes, got {text!r}")
    return int(text)


def seed(text: str) -> int:
    """numpy's random generators take seeds of 0 to 2^32 - 1 only."""
    if not text.isdigit() or int(text) >= 2**32:
        raise argparse.ArgumentTypeError(f"seed must be a whole number from 0 to 2^32 - 1, "
                                         f"got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"time limit must be in (0, 3600] seconds, got {value}")
    return value


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int], list[Callable]]] = {
    "inspect": ("show operators, tensors and totals of a model", cmd_inspect, [add_model]),
    "plan": (
        "plan the activation arena and show where every tensor lives",
        cmd_plan,
        [add_model, add_planning],
    ),
    "run": (
        "run the model in runtime_py inside its planned arena and save the outputs",
        cmd_run,
        [add_model, add_planning],
    ),
    "gen": (
        "generate C: static arena, offset table, const weights, kernels",
        cmd_gen,
        [add_model, add_planning],
    ),
    "check": (
        "compare TFLite's reference kernels, runtime_py and the compiled C",
        cmd_check,
        [add_model, add_planning],
    ),
    "bench": (
        "count the instructions the C executes per inference on a Cortex-M under QEMU",
        cmd_bench,
        [add_model, add_planning],
    ),
    "embed": (
        "write a copy of the model carrying the plan for TFLite Micro (OfflineMemoryAllocation)",
        cmd_embed,
        [add_model, add_planning],
    ),
    "report": (
        "one self-contained HTML page: inspect, plan, memory map, footprint and check",
        cmd_report,
        [add_model, add_planning],
    ),
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
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        for add in adders:
            add(p)
        p.set_defaults(handler=handler)
    for command in ("plan", "run", "gen", "check", "report"):
        add_target(sub.choices[command])
    bench = sub.choices["bench"]
    add_target(bench, "cortex-m4")
    bench.add_argument("--portable", action="store_true",
                       help="the portable kernels only, built for the target (the baseline its "
                            "own kernels are measured against)")
    bench.add_argument("--optimize", choices=["O2", "Os", "O3"], default="O2",
                       help="arm-none-eabi-gcc's optimization level (default: O2)")
    plan = sub.choices["plan"]
    plan.add_argument("--svg", metavar="FILE", help="write the memory map as SVG")
    plan.add_argument(
        "--dump-buffers",
        metavar="FILE.csv",
        help="write the allocation problem as MiniMalloc CSV (id,lower,upper,size)",
    )
    plan.add_argument(
        "--load-offsets",
        metavar="FILE.csv",
        help="take offsets from an external solver (id,offset or MiniMalloc's solution); verified",
    )
    run = sub.choices["run"]
    for runs_py in (run, sub.choices["check"]):
        runs_py.add_argument(
            "--max-iterations", type=positive, default=DEFAULT_MAX_ITERATIONS, metavar="N",
            help="refuse a WHILE that runs its body more than N times in one invoke of "
                 f"runtime_py (default: {DEFAULT_MAX_ITERATIONS:,})",
        )
    run.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="FILE.npy",
        help="one .npy file per model input, in order (repeat the option); a file of shape "
             "[T, *input shape] runs T invokes in a row, state kept",
    )
    run.add_argument(
        "--output-dir",
        default=".",
        metavar="DIR",
        help="where output_<i>.npy files go, stacked [T, *shape] for stacked inputs "
             "(default: .)",
    )
    check = sub.choices["check"]
    data = check.add_mutually_exclusive_group()  # random inputs, or the user's data
    data.add_argument(
        "--inputs",
        type=positive,
        default=None,  # 3, set by cmd_check: so that argparse sees `--inputs 3` beside --input
        metavar="N",
        help="number of random input sets, each a sequence of --sequence invokes (default: 3)",
    )
    check.add_argument(
        "--sequence",
        type=positive,
        default=None,
        metavar="N",
        help="invokes per input set, in a row with the state kept; every backend is reset "
             "between sets (default: 3 for a model with state, else 1)",
    )
    check.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    data.add_argument(
        "--input",
        metavar="FILE",
        help="check on this data instead of random inputs: a .npy (one-input model), a .npz "
             "with one array per input (named by input name or index), a directory of such "
             "per-input .npy files, or a CSV of values; a leading [N, ...] axis is N samples",
    )
    data.add_argument("--dataset", metavar="DIR",
                      help="check on every sample in DIR: each file or folder as --input takes")
    check.add_argument(
        "--backends",
        type=backend_list,
        default=None,
        metavar="LIST",
        help="comma-separated: runtime_py, c (this host), qemu (the target's QEMU machine, a "
             "Cortex-M4 for generic); default: runtime_py,c, or runtime_py,qemu with a --target",
    )
    check.add_argument(
        "--sanitize", action="store_true",
        help="build the host C with ASan and UBSan (float-to-int overflow included) and also "
             "run it and runtime_py on edge inputs (NaN, +-inf, denormals, +-max of each input "
             "dtype), which the oracle is not asked about: TFLite leaves them undefined")
    check.add_argument("--oracle-timeout", type=seconds, default=120.0, metavar="S",
                       help="time each TFLite interpreter may take, in its child process "
                            "(default: 120)")
    check.add_argument(
        "--per-layer",
        action="store_true",
        help="compare every intermediate tensor and name the first op that differs",
    )
    gen = sub.choices["gen"]
    gen.add_argument("-o", "--output-dir", required=True, metavar="DIR", help="where files go")
    gen.add_argument("more_models", nargs="*", metavar="MODEL",
                     help="more models, generated to share one arena (run one at a time)")
    gen.add_argument("--name", action="append", type=c_name,
                     help="C identifier prefix and file name (default: model's name); once per "
                          "model")
    gen.add_argument("--arena", choices=["static", "extern"], default="static",
                     help="static: an array of the generated file (default); extern: the "
                          "caller's memory, given to NAME_init(arena, bytes)")
    gen.add_argument(
        "--external-io",
        action="store_true",
        help="inputs and outputs are the caller's buffers, outside the arena",
    )
    report = sub.choices["report"]
    report.add_argument("-o", "--output", required=True, metavar="FILE.html",
                        help="where the page goes")
    report.add_argument("--inputs", type=positive, default=3, metavar="N",
                        help="random input sets the check runs (default: 3)")
    report.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    report.add_argument("--no-check", action="store_true",
                        help="leave out the check (the oracle, runtime_py and the C)")
    report.add_argument("--no-footprint", action="store_true",
                        help="leave out the footprint (built with arm-none-eabi-gcc)")
    solve = sub.add_parser(
        "solve",
        help="solve an allocation problem in MiniMalloc's CSV form (id,lower,upper,size)",
        description="Solve an allocation problem in MiniMalloc's CSV form (id,lower,upper,size; "
                    "lives half-open): within --capacity bytes, as MiniMalloc does, or as small "
                    "as the exact planner can find and prove. Exit status 1 if no plan was found.",
        allow_abbrev=False,
    )
    solve.add_argument("problem", metavar="PROBLEM.csv", help="the allocation problem")
    solve.add_argument("--capacity", type=positive, metavar="BYTES",
                       help="find a plan within this many bytes (default: the smallest found)")
    solve.add_argument("-o", "--output", metavar="SOLUTION.csv",
                       help="write the solution: the problem's columns and an offset column")
    solve.add_argument("--nodes", type=whole, default=SOLVE_NODES, metavar="N",
                       help="search nodes the search may visit: the same solution on any "
                            f"machine (default: {SOLVE_NODES:,})")
    solve.add_argument("--time-limit", type=seconds, default=None, metavar="S",
                       help="also stop the search after S seconds (default: none)")
    solve.add_argument("--align", type=alignment, default=1,
                       help="every offset a multiple of this power of two (default: 1)")
    solve.add_argument("--json", action="store_true", help="machine-readable output")
    solve.add_argument("--quiet", action="store_true", help="no progress on stderr")
    solve.set_defaults(handler=cmd_solve)
    embed = sub.choices["embed"]
    embed.add_argument("-o", "--output", required=True, metavar="OUT.tflite",
                       help="the model with the plan in its metadata")
    return parser


BACKENDS = ("runtime_py", "c", "qemu")


def backend_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"backends are {', '.join(BACKENDS)}; got {text!r}")
    return names


def whole(text: str) -> int:
    """A count the compiled searches take as an int64."""
    if not text.isdigit() or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"expected a whole number below 2^63, got {text!r}")
    return int(text)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def one_line(text: str, limit: int = 400) -> str:
    """The error as one line of bounded length, whatever the message carried."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
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
