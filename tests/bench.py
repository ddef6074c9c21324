"""`make bench`: figures measured side by side in one run, printed as ratios.

Not a test: timings vary from machine to machine, so nothing here asserts; it prints.
Usage: python -m tests.bench [plan] [tiling] [stream] [state] [scaling] [solve] [wide] [c] [quant]
       [runtime] [mcu] [speed] [MODEL.tflite ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from runtime_py.interpreter import ArenaInterpreter
from tests import engines
from tests.conftest import (
    ALLOCATION_PROBLEMS,
    RECURRENT_MODEL_FILES,
    SHARED_ALLOCATION,
    SHARED_MODEL_FILES,
)
from tests.engines import Engine
from tests.wide import wide_graph_timing
from toolchain.errors import ArenacError
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import TFLMOracle
from toolchain.lower.plan import (
    BEST,
    NO_TECHNIQUES,
    ModelPlan,
    Techniques,
    best_candidates,
    plan_model,
    planned_model,
)
from toolchain.lower.tiling import model_macs
from toolchain.ops import TFLM, oracle_of, unsupported_ops
from toolchain.planners import (
    Buffer,
    Deadline,
    Placement,
    canonical,
    lower_bound,
    make_plan,
    optimal,
    smallest_plan,
    verify,
)
from toolchain.planners.csvio import dump_buffers, load_buffers
from toolchain.text import table as text_table


def table(headers: list[str], rows: list[list]) -> str:
    """A text table as wide as its cells: the documents quote the benchmark's tables, so model
    names stay whole."""
    return text_table(headers, rows, width=200)


def try_backend(make: Callable[[], object]) -> object | None:
    try:
        return make()
    except (ArenacError, ValueError, RuntimeError, subprocess.CalledProcessError):
        return None


def peers(data: bytes, inputs: list, mp: ModelPlan) -> dict[str, Engine]:
    """TFLite's interpreters on the same inputs, each only where it runs the model. Not LiteRT
    where some kernel follows TFLite Micro because LiteRT's is wrong for its operands (on the
    keyword model's SVDF LiteRT writes past its buffers, and this process would share its heap)."""
    litert_runs = oracle_of(mp.program.bindings)[0] != TFLM
    made = {
        "tflm": try_backend(lambda: engines.tflm(data, inputs)),
        "litert": litert_runs and try_backend(lambda: engines.litert(data, inputs, False)),
        "litert-ref": litert_runs and try_backend(lambda: engines.litert(data, inputs, True)),
    }
    return {name: engine for name, engine in made.items() if engine}


def runtime_row(path: Path) -> list[object]:
    model = read_model(path)
    inputs = random_inputs(model.main, seed=0)
    mp = plan_model(model)
    runs = {"runtime_py": engines.runtime_py(mp, inputs), **peers(path.read_bytes(), inputs, mp)}
    median = {name: t.median for name, t in engines.interleaved(runs, rounds=3).items()}
    return [
        path.stem,
        *(fmt(median.get(name)) for name in ("runtime_py", "litert-ref", "litert", "tflm")),
        ratio(median["runtime_py"], median.get("litert-ref")),
        ratio(median["runtime_py"], median.get("litert")),
    ]


def object_size(backend: CBackend, name: str = "model") -> dict[str, int]:
    """text/data/bss of the generated model's object file, as `size` reports them."""
    directory = backend.directory
    subprocess.run(
        ["cc", "-std=c99", "-O2", "-c", f"{name}.c", "-o", f"{name}.o"], cwd=directory, check=True
    )
    out = (
        subprocess.run(
            ["size", f"{name}.o"], cwd=directory, check=True, capture_output=True, text=True
        )
        .stdout.splitlines()[1]
        .split()
    )
    return {"text": int(out[0]), "data": int(out[1]), "bss": int(out[2])}


C_ENGINES = ("c", "c-native", "tflm", "litert", "litert-ref")


def c_rows(path: Path) -> tuple[list[object], list[object]]:
    """The generated C at -O2 and at -O3 -march=native beside TFLite's interpreters, all
    timed alike (tests/engines.py): medians and ratios, then each engine's fastest and slowest
    round with the C's sizes."""
    model = read_model(path)
    data = path.read_bytes()
    inputs = random_inputs(model.main, seed=0)
    mp = plan_model(model)
    with CBackend(mp) as backend:
        sizes = object_size(backend)
    external = plan_model(model, external_io=True)  # the same kernels, inputs never overwritten
    with (engines.CLibrary(external, inputs, ["-O2"]) as portable,
          engines.CLibrary(external, inputs, engines.NATIVE_FLAGS) as native):
        expected = ArenaInterpreter(mp).invoke(inputs)  # a first invoke, as theirs
        for library, flags in ((portable, "-O2"), (native, " ".join(engines.NATIVE_FLAGS))):
            library.invoke()
            library.check(expected, f"{path.stem} at {flags}")
        ms = engines.interleaved({"c": portable.invoke, "c-native": native.invoke,
                                  **peers(data, inputs, mp)})
    median = {name: t.median for name, t in ms.items()}
    medians = [
        path.stem,
        *(fmt(median.get(name)) for name in C_ENGINES),
        ratio(median["c"], median.get("tflm")),
        ratio(median["c"], median.get("litert")),
        ratio(median["c-native"], median.get("litert")),
        mp.arena_bytes,
    ]
    spreads = [
        path.stem,
        *(f"{microseconds(ms[name].low)}-{microseconds(ms[name].high)}" if name in ms else "n/a"
          for name in C_ENGINES),
        sizes["text"],
        sizes["data"],
        sizes["bss"],
    ]
    return medians, spreads


def host_c_ms(data: bytes, name: str) -> float:
    """Generated C (cc -O2) per inference on one random input set: the median round."""
    mp = plan_model(parse_model(data, f"{name}.tflite"), external_io=True)
    inputs = random_inputs(mp.graph, seed=0)
    expected = ArenaInterpreter(plan_model(mp.model)).invoke(inputs)  # its I/O in the arena
    with engines.CLibrary(mp, inputs, ["-O2"]) as library:
        library.invoke()
        library.check(expected, f"{name} at -O2")
        return engines.interleaved({"c": library.invoke})["c"].median


def quant_section() -> None:
    """One model in each quantization scheme, timed side by side in one run: the example CNNs
    and a fully connected layer, each in int8, uint8 and int16."""
    from tests.ops.test_fully_connected import (
        fully_connected_model,
        int16_fully_connected_model,
    )

    models = {
        **{model: {dtype: EXAMPLES[f"{model}_{dtype}"]() for dtype in ("int8", "uint8", "int16")}
           for model in ("tiny_cnn", "residual_cnn")},
        "fc 16x300->40": {**{dtype: fully_connected_model(dtype, (16, 300), 40, seed=3)
                             for dtype in ("int8", "uint8")},
                          "int16": int16_fully_connected_model((16, 300), 40, seed=3)},
    }
    rows = []
    for name, by_dtype in models.items():
        ms = {dtype: host_c_ms(data, f"{name}_{dtype}") for dtype, data in by_dtype.items()}
        rows.append([name, *(fmt(ms.get(d)) for d in ("int8", "uint8", "int16")),
                     ratio(ms.get("uint8"), ms["int8"]), ratio(ms.get("int16"), ms["int8"])])
    print("generated C (cc -O2, host) per inference (ms), one model in each scheme, same run")
    print(table(["model", "int8", "uint8", "int16", "uint8/int8", "int16/int8"], rows))


def timed(make: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    value = make()
    return value, (time.perf_counter() - start) * 1000.0


def cpu_ms(make: Callable[[], object]) -> float:
    start = time.process_time()
    make()
    return (time.process_time() - start) * 1000.0


def plan_row(path: Path) -> list[object]:
    """The arena as each technique is added, beside TFLM's head measured on the same file."""
    model = read_model(path)
    classic = NO_TECHNIQUES
    steps = [
        ("naive", "naive", classic),
        ("freelist", "freelist", classic),
        ("greedy", "greedy", classic),
        ("optimal", "optimal", classic),
        ("+inplace", "best", replace(classic, inplace=True)),
        ("+overlap", "best", replace(classic, inplace=True, overlap=True)),
        ("+order", "best", Techniques(tiling="off")),
        ("+tiling", "best", Techniques()),
    ]
    cells, times, lower, overlap_bound = [], [], 0, 0
    for _, planner, techniques in steps:
        mp, ms = timed(lambda p=planner, t=techniques: plan_model(model, p, techniques=t))
        cells.append(mp.arena_bytes)
        times.append(ms)
        lower, overlap_bound = mp.lower_bound_bytes, mp.overlap_bound_bytes
    data = path.read_bytes()
    tflm = try_backend(lambda: TFLMOracle(data, len(model.main.outputs), arena_size=4 << 20))
    head = tflm.allocations()["head"] if tflm else None
    return [path.stem, lower, overlap_bound, *cells, head if head is not None else "n/a",
            ratio(cells[-1], head), f"{max(times):.0f}"]


def plan_section(paths: list[Path]) -> None:
    rows = [plan_row(p) for p in paths]
    print("arena bytes per technique (each column adds to the one before), TFLM head measured; "
          "lower: no two live tensors share a byte, ovl: the bound when declared overlaps may "
          "share (of the last plan's order)")
    print(table(["model", "lower", "ovl", "naive", "freelist", "greedy", "optimal", "+inplace",
                 "+overlap", "+order", "+tiling", "tflm head", "ours/tflm", "max ms"], rows))
    ours = sum(r[10] for r in rows)
    heads = sum(r[11] for r in rows if isinstance(r[11], int))
    print(f"sum: ours {ours} bytes, TFLM heads {heads} bytes, ratio {ours / heads:.3f}")
    held = sum(plan_model(read_model(p), target="cortex-m4").arena_bytes for p in paths)
    print(f"sum: on cortex-m4 (the default plans, held to the generic arena) ours {held} bytes, "
          f"ratio {held / heads:.3f}")


def tiling_row(path: Path, count: bool) -> list[object]:
    """The arena without and with striped segments, the bound each technique reaches, and
    (with the Arm toolchain, `count`) the instructions striping adds on a Cortex-M4, its
    kernels at their fastest (the hold would change kernels between the two plans)."""
    from toolchain.lab.bench import bench

    model = read_model(path)
    off = plan_model(model, techniques=Techniques(tiling="off"))
    on = plan_model(model)
    segments = on.tiling.segments
    row = [path.stem, off.lower_bound_bytes, off.overlap_bound_bytes,
           on.overlap_bound_bytes if segments else "-", off.arena_bytes, on.arena_bytes,
           sum(len(s.stripes) for s in segments), sum(s.moved_bytes for s in segments)]
    if not count or not segments:
        return [*row, "-", "-", "-"]
    m4 = [every_kernel(model, "cortex-m4", t) for t in ("off", "auto")]
    if not m4[1].tiling.segments:
        return [*row, m4[0].arena_bytes, m4[1].arena_bytes, "none"]
    plain, striped = (bench(mp, check=False).instructions for mp in m4)
    return [*row, m4[0].arena_bytes, m4[1].arena_bytes, f"{(striped - plain) / plain:+.2%}"]


def every_kernel(model, target: str, tiling: str) -> ModelPlan:
    """The model on `target` with every target kernel keeping its scratch (no hold, no limit),
    striped where that lowers the arena (`tiling` auto; without the extra stripes, as under
    --max-arena) or not (off): what striping alone changes, the kernels the same."""
    return planned_model(model, target=target,
                         techniques=Techniques(tiling=tiling, extra_stripes=False))


def tiling_section(paths: list[Path]) -> None:
    from toolchain.lab.qemu_backend import missing

    count = not missing()
    print("striped segments (--tiling): arena bytes without and with, the bound each technique "
          "reaches (lower: classic; ovl: outputs over their inputs; tiled: with the segments "
          "striped, the most bytes that must coexist), the stripes' row moves (no MAC is "
          "recomputed), and on a Cortex-M4 (QEMU, every kernel keeping its scratch) the arena "
          "and the instructions striping adds"
          + ("" if count else " (skipped: no Arm toolchain or QEMU)"))
    print(table(["model", "lower", "ovl", "tiled", "off", "auto", "stripes", "moved", "m4 off",
                 "m4 auto", "m4 instr"], [tiling_row(p, count) for p in paths]))


def stream_row(path: Path) -> list[object]:
    """The arena holding the input and streaming it (--stream-input), generic and cortex-m4,
    with the input's bytes, the rows its stripe buffer keeps, the column tiles its segment runs
    in and the share of the model's MACs they compute twice (generic); "-" where it cannot
    stream."""
    model = read_model(path)
    x = model.main.tensors[model.main.inputs[0]]
    row = [path.stem, x.nbytes, plan_model(model).arena_bytes]
    try:
        streamed = plan_model(model, stream_input=True)
    except ArenacError:
        return [*row, "-", "-", "-", "-", "-", "-"]
    (segment,) = [s for s in streamed.tiling.segments if s.streamed]
    m4 = plan_model(model, stream_input=True, target="cortex-m4").arena_bytes
    kept = f"{segment.buffers[0].rows} of {x.shape[1]}"
    share = segment.recomputed / model_macs(streamed.graph, streamed.program.bindings)
    return [*row, streamed.arena_bytes, m4, kept, len(segment.tiles) or 1, f"{share:.1%}",
            f"{streamed.arena_bytes / row[2]:.2f}x"]


def stream_section(paths: list[Path]) -> None:
    print("streamed input (--stream-input): the arena holding the input whole and streaming it "
          "(its rows fetched by the first segment, in the C through NAME_input_rows()), on "
          "generic and cortex-m4, the input rows the stripe buffer keeps, the column tiles the "
          "segment runs in and the share of the model's MACs they compute twice (at most "
          "--max-recompute, 10 by default); - where no chain of windowed ops reads the input "
          "alone")
    print(table(["model", "input", "whole", "streamed", "m4 streamed", "rows kept", "tiles",
                 "twice", "ratio"], [stream_row(p) for p in paths]))


def stream_output_rows() -> list[list[object]]:
    """Streamed outputs on a built dense-prediction head (the shared models are classifiers,
    whose outputs are a few bytes): the arena holding the output whole, streaming it, and
    streaming both ends, on generic and cortex-m4."""
    from tests.test_streaming_output import dense_head

    model = parse_model(dense_head(), "dense_head.tflite")
    y = model.main.tensors[model.main.outputs[0]]
    rows = []
    for target in ("generic", "cortex-m4"):
        whole = plan_model(model, target=target).arena_bytes
        out = plan_model(model, target=target, stream_output=True).arena_bytes
        both = plan_model(model, target=target, stream_input=True,
                          stream_output=True).arena_bytes
        rows.append([f"dense_head ({target})", y.nbytes, whole, out, both, ratio(both, whole)])
    return rows


def stream_output_section() -> None:
    """The dense-prediction head's streamed outputs (stream_output_rows) as a table."""
    rows = stream_output_rows()
    print("streamed output (--stream-output): the arena holding the output whole, streaming it "
          "(its rows handed on by the last segment, in the C through NAME_output_rows()), and "
          "streaming the input too, for tests/test_streaming_output.py's dense-prediction head "
          "(input 1x24x20x4, output 1x12x10x24, int8)")
    print(table(["model", "output", "whole", "out streamed", "both streamed", "ratio"], rows))


def state_section(paths: list[Path]) -> None:
    """Models with state: our arena and state block beside TFLM's whole arena (head: planned
    activations, tail: persistent state and the interpreter's bookkeeping) on the same file."""
    rows = []
    for path in paths:
        model = read_model(path)
        mp = plan_model(model)
        state = mp.state_layout()[1]
        data = path.read_bytes()
        tflm = try_backend(lambda d=data, m=model: TFLMOracle(d, len(m.main.outputs),
                                                                arena_size=4 << 20))
        figures = tflm.allocations() if tflm else {}
        runs = "yes" if not unsupported_ops(model.main) else "no (refused ops)"
        rows.append([path.stem, mp.arena_bytes, state, mp.arena_bytes + state,
                     figures.get("head", "n/a"), figures.get("tail", "n/a"),
                     figures.get("total", "n/a"), ratio(mp.arena_bytes + state,
                                                        figures.get("total")), runs])
    print("models with state: arena + state block (bytes) beside TFLM's total arena, same file")
    print(table(["model", "arena", "state", "arena+state", "tflm head", "tflm tail",
                 "tflm total", "ours/tflm", "runs"], rows))


def random_buffers(count: int, seed: int) -> list[Buffer]:
    """Lives of a random schedule: sizes from 16 B to 64 KiB, lives up to 1/20 of the ops."""
    rng = np.random.default_rng(seed)
    steps = max(count // 4, 1)
    first = rng.integers(0, steps, count)
    length = rng.integers(0, max(steps // 20, 1) + 1, count)
    sizes = (2 ** rng.uniform(4, 16, count)).astype(int)
    return [Buffer(i, int(s), int(f), int(min(f + n, steps - 1)))
            for i, (s, f, n) in enumerate(zip(sizes, first, length, strict=True))]


def scaling_section() -> None:
    rows = []
    for count in (100, 1_000, 10_000):
        buffers = random_buffers(count, seed=count)
        bound = lower_bound(buffers, 16)
        for planner in ("freelist", "greedy", "optimal"):
            plan, ms = timed(lambda p=planner, b=buffers: make_plan(b, p, 16))
            rows.append([count, planner, f"{ms:.0f}", plan.arena_bytes, bound,
                         f"{plan.arena_bytes / bound:.3f}", plan.proven_optimal])
    print("random instances: planning time (ms, verify included) and arena / lower bound")
    print(table(["buffers", "planner", "ms", "arena", "lower bound", "ratio", "proven"], rows))
    print()
    growth_table()


GROWTH_COUNTS = (1_000, 10_000, 100_000)


def growth_table() -> None:
    """How each fast planner's time grows with the buffers: the ratio of each tenfold step,
    beside n log n's (13.3, then 12.5) and n^2's (100). On these buffers the number alive at
    once grows with n too (25 to 2,500), and so do the gaps below each greedy placement."""
    instances = [random_buffers(n, seed=n) for n in GROWTH_COUNTS]
    rows = []
    for planner, options in (("freelist", {"fit": "first"}), ("freelist", {"fit": "best"}),
                             ("greedy", {}), ("tflm", {})):
        ms = [cpu_ms(lambda b=b, p=planner, o=options: make_plan(b, p, 16, **o))
              for b in instances]
        label = f"{planner} {options['fit']}" if options else planner
        rows.append([label, *(f"{t:.0f}" for t in ms),
                     *(f"{b / a:.1f}" for a, b in pairwise(ms))])
    nlogn = [f"{(b * np.log(b)) / (a * np.log(a)):.1f}"
             for a, b in pairwise(GROWTH_COUNTS)]
    rows.append(["n log n", "", "", "", *nlogn])
    print("growth: planning CPU time (ms, verify included; CPU, so that others sharing the "
          "cores do not skew it) on random buffers, and its ratio per tenfold step")
    steps = [f"x {b // a} ({b:,})" for a, b in pairwise(GROWTH_COUNTS)]
    print(table(["planner", *(f"{n:,}" for n in GROWTH_COUNTS), *steps], rows))


def limit_section(count: int = 100_000, time_limit: float = 2.0) -> None:
    """Each planner held to `--time-limit 2` on a large random instance, as plan_model calls it
    (smallest_plan with the limit as deadline): wall-clock seconds to the verified plan."""
    buffers = random_buffers(count, seed=count)
    bound = lower_bound(buffers, 16)
    rows = []
    for planner in ("best", "optimal", "greedy", "freelist", "tflm"):
        candidates = best_candidates() if planner == BEST else ((planner, {}),)
        start, cpu = time.perf_counter(), time.process_time()
        plan = smallest_plan(buffers, candidates, 16, (), Deadline.after(time_limit))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows.append([count, planner, time_limit, f"{seconds:.2f}", f"{cpu:.2f}", plan.planner,
                     plan.arena_bytes, f"{plan.arena_bytes / bound:.3f}"])
    print(f"--planner P --time-limit {time_limit:g} on {count:,} random buffers: seconds to a "
          "verified plan (planning and verify; the CPU seconds this process got of them), the "
          "planner whose plan it is, arena / bound")
    print(table(["buffers", "planner", "limit s", "seconds", "cpu s", "plan by", "arena",
                 "ratio"], rows))


def solve_scale_section() -> None:
    """`arenac solve` (whole command, reading the CSV included) on the random buffers of the
    scaling table written as MiniMalloc's CSV: 10,000 with the work budgets alone, 100,000
    with `--time-limit 2`."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for count, limit in ((10_000, None), (100_000, 2.0)):
            path = Path(folder) / f"random_{count}.csv"
            dump_buffers(random_buffers(count, seed=count), path)
            command = [sys.executable, "-m", "toolchain.cli", "solve", str(path), "--json"]
            if limit is not None:
                command += ["--time-limit", str(limit)]
            started = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                  check=True)
            seconds = time.monotonic() - started
            solved = json.loads(done.stdout)
            rows.append([f"{count:,}", "-" if limit is None else f"{limit:g}", f"{seconds:.2f}",
                         f"{solved['arena_bytes']:,}", f"{solved['lower_bound']:,}",
                         f"{solved['arena_bytes'] / solved['lower_bound']:.3f}"])
    print("arenac solve on the random buffers above (MiniMalloc's CSV, alignment 1): wall "
          "seconds of the whole command, reading included, and arena / lower bound")
    print(table(["buffers", "limit s", "seconds", "arena", "lower bound", "ratio"], rows))


def minimalloc_seconds() -> dict[str, float]:
    """MiniMalloc's C++ solver's time per problem, from ../shared/allocation/README.md's table
    (measured on this machine; it cannot be rerun here, as it is not installed)."""
    figures = {}
    readme = SHARED_ALLOCATION.parent / "README.md"
    for line in readme.read_text().splitlines() if readme.exists() else []:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].endswith(" s") and cells[1].isdigit():
            figures[cells[0]] = float(cells[2][:-2])
    return figures


def solve_section() -> None:
    """`arenac solve` at each published problem's capacity: seconds to a verified solution."""
    published = minimalloc_seconds()
    rows = []
    for path in ALLOCATION_PROBLEMS:
        name, capacity = path.name.split(".")[0], int(path.name.split(".")[1])
        buffers = load_buffers(path)
        started = time.monotonic()
        answer = optimal.fits(buffers, capacity, 1, deadline=Deadline.after(60.0))
        seconds = time.monotonic() - started
        if answer.offsets is not None:
            verify(Placement.from_offsets("optimal", 1, buffers, answer.offsets))
        greedy = make_plan(buffers, "greedy", 1).arena_bytes
        theirs = published.get(name)
        rows.append([name, len(buffers), answer.status, f"{seconds:.2f}", f"{answer.nodes:,}",
                     "-" if theirs is None else f"{theirs:.1f}",
                     "-" if theirs is None else f"{seconds / theirs:.2f}x",
                     f"{greedy / capacity:.3f}"])
    search = "compiled" if canonical.compiled_available() else "Python"
    print(f"arenac solve at capacity ({search} search, 60 s limit): seconds to a verified "
          "solution, beside MiniMalloc's C++ solver (../shared/allocation/README.md, this machine)")
    print(table(["problem", "buffers", "status", "s", "nodes", "minimalloc s", "ratio",
                 "greedy/capacity"], rows))


def mcu_section(paths: list[Path]) -> None:
    """Cortex-M4 footprint (arm-none-eabi-gcc -Os) beside TFLM, and TFLM's head with our plan;
    the footprint is skipped, in one line, without the Arm toolchain."""
    from toolchain.lab.firmware import TOOL_PREFIX
    from toolchain.lab.footprint import footprint
    from toolchain.lab.qemu_backend import missing
    from toolchain.tflm.embed import embed_plan

    absent = [program for program in missing() if program.startswith(TOOL_PREFIX)]
    rows, heads = [], []
    for path in paths:
        model = read_model(path)
        rows.append({} if absent else {**footprint(plan_model(model)), "model": path.stem})
        data = path.read_bytes()
        before = try_backend(lambda d=data, m=model: TFLMOracle(d, len(m.main.outputs),
                                                                  arena_size=4 << 20))
        exported = plan_model(model, techniques=NO_TECHNIQUES)
        after = try_backend(lambda d=data, m=model, e=exported: TFLMOracle(
            embed_plan(d, e), len(m.main.outputs), arena_size=4 << 20))
        total = before.allocations()["total"] if before else None
        rows[-1]["tflm_total"] = total
        heads.append([path.stem, before.allocations()["head"] if before else "n/a",
                      exported.arena_bytes, after.allocations()["head"] if after else "n/a"])
    if absent:
        print(f"Cortex-M4 footprint: skipped, the Arm toolchain is not on PATH "
              f"({', '.join(absent)})")
    else:
        print("Cortex-M4 footprint of the generated C (bytes), beside TFLM's total arena")
        print(table(
            ["model", "flash", "weights", "kernel w", "code", "ram", "arena", "state", "stack",
             "tflm total", "ram/tflm"],
            [[r["model"], r["flash"], r["weights"], r["kernel_weights"], r["code"], r["ram"],
              r["arena"], r["state"],
              r["stack"], r["tflm_total"] or "n/a", ratio(r["ram"], r["tflm_total"])]
             for r in rows],
        ))
    print()
    print("TFLM head before and after `arenac embed` (the plan without in-place or overlap)")
    print(table(["model", "tflm head", "exported arena", "tflm head with plan"], heads))


@dataclass(frozen=True)
class Published:
    """The best published MLPerf Tiny latency of one model on one core: the board, its clock,
    the latency in cycles (ms x MHz x 1000) and where it was published."""

    benchmark: str
    board: str
    mhz: int
    cycles: int
    source: str


def _m4(benchmark: str, ms: float, source: str) -> Published:
    return Published(benchmark, "NUCLEO-L4R5ZI", 120, round(ms * 120_000), source)


# The best published MLPerf Tiny results per core, by target and model. Cortex-M4 latencies are
# published in ms (NUCLEO-L4R5ZI, 120 MHz); the Cortex-M7 (NUCLEO-H7A3ZI-Q, 280 MHz) and
# Cortex-M33 (NUCLEO-U575ZI-Q, 160 MHz) figures are their latencies times the clock, to three
# figures.
MLPERF_BEST = {
    ("cortex-m4", "vww_96_int8"): _m4("VWW", 88.93, "X-CUBE-AI 9.0, v1.2"),
    ("cortex-m4", "kws_ref_model"): _m4("KWS", 43.19, "X-CUBE-AI 9.0, v1.2"),
    ("cortex-m4", "pretrainedResnet_quant"): _m4("IC", 165.13, "X-CUBE-AI 9.0, v1.2"),
    ("cortex-m4", "ad01_int8"): _m4("AD", 4.05, "Plumerai 2023.05, v1.1"),
    ("cortex-m7", "vww_96_int8"): Published("VWW", "NUCLEO-H7A3ZI-Q", 280, 6_660_000,
                                            "X-CUBE-AI 9.0, v1.2"),
    ("cortex-m7", "kws_ref_model"): Published("KWS", "NUCLEO-H7A3ZI-Q", 280, 3_170_000,
                                              "X-CUBE-AI 9.0, v1.2"),
    ("cortex-m7", "pretrainedResnet_quant"): Published("IC", "NUCLEO-H7A3ZI-Q", 280, 11_440_000,
                                                       "X-CUBE-AI 9.0, v1.2"),
    ("cortex-m33", "vww_96_int8"): Published("VWW", "NUCLEO-U575ZI-Q", 160, 9_480_000,
                                             "X-CUBE-AI 10.2, v1.3"),
    ("cortex-m33", "kws_ref_model"): Published("KWS", "NUCLEO-U575ZI-Q", 160, 4_640_000,
                                               "X-CUBE-AI 10.2, v1.3"),
    ("cortex-m33", "pretrainedResnet_quant"): Published("IC", "NUCLEO-U575ZI-Q", 160, 17_520_000,
                                                        "X-CUBE-AI 10.2, v1.3"),
}
# The reference submission (MLPerf Tiny v0.5: TFLite Micro with CMSIS-NN) on the Cortex-M4
# board, in ms.
MLPERF_REFERENCE_M4_MS = {"vww_96_int8": 600.6, "kws_ref_model": 181.9,
                          "pretrainedResnet_quant": 704.2, "ad01_int8": 10.05}


# --max-arena above any arena: no target kernel gives its scratch up and no op runs in stripes,
# the fastest plan. The speed tables run it (the published results chose their own memory); the
# default plan, held to the portable kernels' arena, is the `hold` section's.
NO_ARENA_LIMIT = 1 << 30


def fastest_plan(path: Path, target: str):
    return plan_model(read_model(path), target=target, max_arena=NO_ARENA_LIMIT)


def mlperf_rows(path: Path, target: str, own=None) -> tuple[list[str], list[str]]:
    """Two rows of the MLPerf Tiny comparison on one core: our instructions and estimated
    cycles (`arenac bench --target TARGET --max-arena` above any arena, zero wait states), and
    the nominal estimate beside the best published cycles with the board they ran on."""
    from toolchain.lab.bench import bench

    if own is None:
        own = bench(fastest_plan(path, target))
    best = MLPERF_BEST[target, path.stem]
    reference_ms = MLPERF_REFERENCE_M4_MS.get(path.stem) if target == "cortex-m4" else None
    reference = "-" if reference_ms is None else f"{round(reference_ms * 120_000):,}"
    c = own.cycles
    estimate = [path.stem, best.benchmark, target, f"{own.instructions:,}", f"{c.optimistic:,}",
                f"{c.nominal:,}", f"{c.pessimistic:,}", f"{c.nominal / own.instructions:.2f}"]
    beside = [path.stem, target, f"{c.nominal:,}", reference, f"{best.cycles:,}",
              f"{best.board} {best.mhz} MHz", best.source, ratio(c.nominal, best.cycles)]
    return estimate, beside


ESTIMATE_HEADER = ["model", "benchmark", "target", "instructions", "optimistic", "nominal",
                   "pessimistic", "cycles/instr"]
MLPERF_HEADER = ["model", "target", "est. cycles", "reference (v0.5)", "best", "board",
                 "best: source, version", "est./best"]


def speed_section(paths: list[Path]) -> None:
    """Instructions per inference of the generated C on every Cortex-M target under QEMU
    (arm-none-eabi-gcc -O2, `arenac bench`), the target's kernels beside its portable ones, and
    on the Cortex-M4 our estimated cycles beside MLPerf Tiny's published ones. Deterministic
    counts: no timing involved."""
    from toolchain.lab.bench import bench
    from toolchain.lab.qemu_backend import missing
    from toolchain.ops import VARIANTS
    from toolchain.targets import TARGETS

    if missing():
        print(f"speed: skipped, not on PATH: {', '.join(missing())}")
        return
    targets = [t for t in TARGETS.values() if t.board is not None]
    rows, references = [], []
    for path in paths:
        model = read_model(path)
        for target in targets:
            has_own = any(v.runs_on(target.name) for vs in VARIANTS.values() for v in vs)
            own = bench(fastest_plan(path, target.name))
            base = (bench(plan_model(model, target=target.name, portable=True,
                                     max_arena=NO_ARENA_LIMIT)) if has_own else own)
            rows.append([path.stem, target.name, f"{own.instructions:,}",
                         f"{base.instructions:,}", ratio(base.instructions, own.instructions),
                         own.flash, base.flash, own.ram, own.arena_bytes,
                         "ok" if own.outputs_match and base.outputs_match else "DIFFERS"])
            if (target.name, path.stem) in MLPERF_BEST:
                references.append(mlperf_rows(path, target.name, own))
    print("instructions per inference under QEMU (-icount), arm-none-eabi-gcc -O2: the target's "
          "own kernels at their fastest (--max-arena above any arena: whole ops) beside its "
          "portable kernels (same target, same limit), flash and RAM in bytes")
    print(table(["model", "target", "instructions", "portable", "portable/own", "flash",
                 "flash portable", "ram", "arena", "outputs"], rows))
    if references:
        print()
        print("estimated cycles (`arenac bench`: nominal, and optimistic to pessimistic; zero "
              "wait states) beside the best published MLPerf Tiny cycles on the same core "
              "(cycles = ms x MHz x 1000; the reference submission is v0.5, TFLM + CMSIS-NN, "
              "on the Cortex-M4 board); est./best below 1 is faster than the best")
        print(table(ESTIMATE_HEADER, [estimate for estimate, _ in references]))
        print()
        print(table(MLPERF_HEADER, [beside for _, beside in references]))


def hold_row(path: Path) -> list[object]:
    """One model on cortex-m4: the generic arena, the default plan's (held to it through the
    target kernels' forms without scratch) and the fastest plan's, with their estimated cycles
    (a QEMU run each, one where the two plans are one)."""
    from toolchain.lab.bench import bench

    model = read_model(path)
    held = plan_model(model, target="cortex-m4")
    fast = fastest_plan(path, "cortex-m4")
    held_cycles = bench(held).cycles.nominal
    fast_cycles = (held_cycles if held.program.given_up == fast.program.given_up
                   else bench(fast).cycles.nominal)
    return [path.stem, plan_model(model).arena_bytes, held.arena_bytes, f"{held_cycles:,}",
            fast.arena_bytes, f"{fast_cycles:,}", ratio(held_cycles, fast_cycles),
            len(held.program.given_up) - len(fast.program.given_up)]


def hold_section(paths: list[Path]) -> None:
    from toolchain.lab.qemu_backend import missing

    if missing():
        print(f"hold: skipped, not on PATH: {', '.join(missing())}")
        return
    print("cortex-m4, the default plan held to the generic arena (its target kernels with scratch "
          "at the peak run their forms without it, or narrower) beside the fastest plan "
          "(--max-arena above any arena): arena bytes, estimated cycles (nominal, zero wait "
          "states) and the ops whose kernel the hold changed")
    print(table(["model", "generic", "held", "held cycles", "fastest", "fastest cycles",
                 "held/fastest", "ops"], [hold_row(p) for p in paths]))


# Layers of the built chain the `replans` section plans (tests/deep.py).
DEEP_LAYERS = 100


def replans_section(paths: list[Path]) -> None:
    """How often the hold plans a model on cortex-m4, and the CPU that takes: the shared int8
    models and a deep chain of alike layers, whose arena peaks in many segments at once."""
    from tests.deep import alike_layers, held_plan_figures

    print("cortex-m4, the default plan (held to the generic arena): how many times the model "
          "is planned (the first plan, the generic one and each replan of the hold) and the "
          "CPU seconds of the whole plan, in this process")
    models = [(p.stem, p.read_bytes()) for p in paths]
    models.append((f"alike_layers({DEEP_LAYERS})", alike_layers(DEEP_LAYERS)))
    rows = []
    for name, data in models:
        f = held_plan_figures(data, name)
        rows.append([name, f["ops"], f["generic"], f["held"], f["plans"], f"{f['cpu_s']:.1f}"])
    print(table(["model", "ops", "generic", "held", "plans", "CPU s"], rows))


def wide_section() -> None:
    """`arenac plan --time-limit 2` on 10,000 and 100,000 parallel branches, whole command."""
    print("arenac plan --json --time-limit 2 on wide graphs (one process each, reading included)")
    rows = []
    for branches in (10_000, 100_000):
        figures = wide_graph_timing(branches)
        rows.append([figures["operators"], figures["seconds"], figures["planner"],
                     figures["arena_bytes"], figures["lower_bound_bytes"]])
    print(table(["operators", "seconds", "planner", "arena", "lower bound"], rows))


def runs(path: Path) -> bool:
    """Whether every operator of the model has a kernel."""
    return try_backend(lambda: plan_model(read_model(path)).program.params()) is not None


def fmt(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.3g}"


def microseconds(ms: float) -> str:
    us = ms * 1000.0
    return f"{us:.0f}" if us >= 100 else f"{us:.3g}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def main(argv: list[str]) -> int:
    sections = [a for a in argv if not a.endswith(".tflite")] or [
        "plan", "tiling", "stream", "state", "scaling", "solve", "wide", "c", "quant", "runtime",
        "mcu", "hold", "replans", "speed"]
    paths = [Path(a) for a in argv if a.endswith(".tflite")] or SHARED_MODEL_FILES
    if not paths:
        print("no models: pass .tflite paths or provide ../shared/models", file=sys.stderr)
        return 2
    if "plan" in sections:
        plan_section(paths)
        print()
    if "tiling" in sections:
        tiling_section(paths)
        print()
    if "stream" in sections:
        stream_section(paths)
        print()
        stream_output_section()
        print()
    if "state" in sections and RECURRENT_MODEL_FILES:
        state_section(RECURRENT_MODEL_FILES)
        print()
    if "scaling" in sections:
        scaling_section()
        print()
        limit_section()
        print()
        solve_scale_section()
        print()
    if "solve" in sections and ALLOCATION_PROBLEMS:
        solve_section()
        print()
    if "wide" in sections:
        wide_section()
        print()
    if "c" in sections:
        rows = [c_rows(p) for p in paths]
        print("host, ms per inference: median of 7 interleaved rounds, every engine in this "
              "process on inputs set once, no copies timed (tests/engines.py); c: cc -O2, "
              "c-native: -O3 -march=native; litert: its default kernels (XNNPACK)")
        print(table(["model", *C_ENGINES, "c/tflm", "c/litert", "native/litert", "arena"],
                    [medians for medians, _ in rows]))
        print("the same rounds: fastest-slowest (microseconds), and the generated C's sizes "
              "(cc -O2)")
        print(table(["model", *C_ENGINES, "text", "data", "bss"],
                    [spreads for _, spreads in rows]))
        print()
    if "quant" in sections:
        quant_section()
        print()
    if "runtime" in sections:
        print("runtime_py per inference (ms: median of 3 interleaved rounds) beside TFLite's "
              "interpreters, timed alike (tests/engines.py)")
        print(
            table(
                ["model", "runtime_py", "litert-ref", "litert", "tflm", "py/ref", "py/litert"],
                [runtime_row(p) for p in paths],
            )
        )
        print()
    int8 = [p for p in paths if read_model(p).main.tensors[read_model(p).main.inputs[0]].dtype
            == "int8"]
    if "mcu" in sections:
        mcu_section(int8)
        print()
    if "hold" in sections:
        hold_section([p for p in int8 if runs(p)])
        print()
    if "replans" in sections:
        replans_section([p for p in int8 if runs(p)])
        print()
    if "speed" in sections:
        speed_section([p for p in int8 if runs(p)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
