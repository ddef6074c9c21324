"""The options of `arenac`'s commands and the types of their values: the planning options
every planning command shares (and `planning`, which turns them into plan_model's arguments, so
the footprint and the benchmarks plan as the commands do), then each command's own.

Every value is checked here, as argparse parses it: a bad one is one usage line."""

from __future__ import annotations

import argparse

from toolchain.errors import ArenacError
from toolchain.front.validate import DEFAULT_MAX_BYTES, DEFAULT_MAX_ITERATIONS
from toolchain.ops.striping import DEFAULT_MAX_RECOMPUTE
from toolchain.planners import PLANNERS
from toolchain.planners.optimal import DEFAULT_NODES
from toolchain.planners.solve import SOLVE_NODES

BACKENDS = ("runtime_py", "c", "qemu", "device")


# --- value types ------------------------------------------------------------------------
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


def percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"percentage must be in [0, 100], got {text}")
    return value


def whole(text: str) -> int:
    """A count the compiled searches take as an int64."""
    if not text.isdigit() or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"expected a whole number below 2^63, got {text!r}")
    return int(text)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def wait_states(text: str) -> int:
    if not text.isdigit() or int(text) > 15:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 15, got {text!r}")
    return int(text)


def backend_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"backends are {', '.join(BACKENDS)}; got {text!r}")
    return names


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


# --- the options every planning command shares ------------------------------------------
def add_model(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("model", help="path to a .tflite file", nargs="?" if optional else None)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (shown only when stderr is a terminal)")
    p.add_argument("--max-bytes", type=byte_count, default=DEFAULT_MAX_BYTES, metavar="N",
                   help="refuse a model with a tensor, or activations and state together, "
                        f"larger than N bytes (default: {DEFAULT_MAX_BYTES >> 20} MiB)")


def add_inspect_options(p: argparse.ArgumentParser) -> None:
    """`inspect` reads a model, or with --ops none."""
    add_model(p, optional=True)
    p.add_argument("--ops", action="store_true",
                   help="instead of a model, list every operator with the dtypes and targets its "
                        "kernels run here, and the TFLite Micro resolver method that registers it")


def add_planning(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planner", choices=["best", *sorted(PLANNERS)], default="best",
                   help="arena planner (default: best = the smallest verified plan of all; "
                        "tflm = TFLite Micro's own)")
    p.add_argument("--fit", choices=["first", "best"], default="first",
                   help="free-block choice of the freelist planner (default: first)")
    p.add_argument("--align", type=alignment, default=16, metavar="N",
                   help="alignment in bytes of every buffer's offset, and of the state block "
                        "and each piece of it (at least 16), a power of two (default: 16)")
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
    p.add_argument("--stream-input", action="store_true",
                   help="never hold the inputs whole: the first stripes fetch each input's rows "
                        "as they need them, in the C through NAME_input_rows(), which the "
                        "firmware defines (a camera's line buffer, DMA or flash behind it)")
    p.add_argument("--stream-output", action="store_true",
                   help="never hold the outputs whole: the last stripes hand each output's rows "
                        "on as they are final, in the C through NAME_output_rows(), which the "
                        "firmware defines (a display, a UART or a DMA out behind it)")
    p.add_argument("--max-recompute", type=percent, default=DEFAULT_MAX_RECOMPUTE, metavar="P",
                   help="with --stream-input, the most MACs column tiles may compute twice, in "
                        "percent of the model's: a streamed segment runs in column tiles where "
                        "that lowers the arena within this cap; 0 for whole rows only "
                        f"(default: {DEFAULT_MAX_RECOMPUTE:g})")
    p.add_argument("--max-arena", type=byte_count, default=None, metavar="N",
                   help="fit the arena in N bytes, as fast as that allows: on a DSP core "
                        "whole ops where they fit, else striped; while it is larger, the target "
                        "kernel whose scratch is the largest where the arena peaks runs the next "
                        "kernel that takes the op, or its portable one; refused when no such "
                        "kernel is left (default: the generic arena, held through narrow kernels "
                        "only)")
    p.add_argument("--pool", action="append", type=pool_spec, default=[],
                   metavar="NAME:SIZE[:SECTION]",
                   help="a memory pool instead of one arena, SIZE in bytes, K or M; repeat "
                        "fastest first (buffers fill the fastest pool first)")
    p.add_argument("--memory", metavar="FILE",
                   help="pools and pins from a TOML or JSON file (see docs/cortex-m.md)")
    p.add_argument("--pin", action="append", type=pin_spec, default=[], metavar="TENSOR=POOL",
                   help="put a tensor (index or name), or the state block (state=POOL), in a "
                        "pool")


def add_target(p: argparse.ArgumentParser, default: str = "generic") -> None:
    from toolchain.targets import TARGETS

    p.add_argument("--target", type=target_name, default=default, metavar="T",
                   help=f"what the C is made for: {', '.join(TARGETS)}; it picks the kernels "
                        f"(default: {default})")


def planning(args: argparse.Namespace) -> dict:
    """plan_model's arguments from the planning options (`add_planning`): every command, the
    footprint too, plans the same way for the same options."""
    from toolchain.lower.plan import Techniques

    options = {"fit": args.fit} if args.planner == "freelist" else {}
    techniques = Techniques(
        inplace=not args.no_inplace, overlap=not args.no_overlap, schedule=args.schedule,
        fuse_padding=not args.no_fuse_padding,
        tiling=args.tiling,
        max_recompute=args.max_recompute,
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
        max_arena=getattr(args, "max_arena", None),
        stream_input=getattr(args, "stream_input", False),
        stream_output=getattr(args, "stream_output", False),
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


# --- each command's own options ---------------------------------------------------------
def add_plan_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    p.add_argument("--svg", metavar="FILE", help="write the memory map as SVG")
    p.add_argument("--layers", action="store_true",
                   help="instead of the buffers, each step's cost: MACs, arena bytes live and "
                        "the arena's top while it runs, kernel scratch, weights it reads first")
    p.add_argument("--measure", action="store_true",
                   help="with --layers: build the firmware for the target and run it under QEMU "
                        "(`arenac bench`): each step's code, instructions and estimated cycles, "
                        "and the flash and RAM against a board's")
    p.add_argument("--board", default=None, metavar="BOARD",
                   help="with --measure: the board whose flash and RAM limit the firmware: a "
                        "QEMU machine or an MLPerf Tiny reference part (nucleo-l4r5zi, "
                        "nucleo-h7a3zi-q, nucleo-u575zi-q); default: the target's QEMU machine")
    p.add_argument("--dump-buffers", metavar="FILE.csv",
                   help="write the allocation problem as MiniMalloc CSV (id,lower,upper,size)")
    p.add_argument("--load-offsets", metavar="FILE.csv",
                   help="take offsets from an external solver (id,offset or MiniMalloc's "
                        "solution); verified")


def add_loop_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-iterations", type=positive, default=DEFAULT_MAX_ITERATIONS,
                   metavar="N",
                   help="refuse a WHILE that runs its body more than N times in one invoke of "
                        f"runtime_py (default: {DEFAULT_MAX_ITERATIONS:,})")


def add_run_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_loop_limit(p)
    p.add_argument("--input", action="append", required=True, metavar="FILE.npy",
                   help="one .npy file per model input, in order (repeat the option); a file of "
                        "shape [T, *input shape] runs T invokes in a row, state kept")
    p.add_argument("--output-dir", default=".", metavar="DIR",
                   help="where output_<i>.npy files go, stacked [T, *shape] for stacked inputs "
                        "(default: .)")


def add_gen_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    p.add_argument("-o", "--output-dir", required=True, metavar="DIR", help="where files go")
    p.add_argument("more_models", nargs="*", metavar="MODEL",
                   help="more models, generated to share one arena (run one at a time)")
    p.add_argument("--name", action="append", type=c_name,
                   help="C identifier prefix and file name (default: model's name); once per "
                        "model")
    p.add_argument("--arena", choices=["static", "extern"], default="static",
                   help="static: an array of the generated file (default); extern: the "
                        "caller's memory, given to NAME_init(arena, bytes)")
    p.add_argument("--external-io", action="store_true",
                   help="inputs and outputs are the caller's buffers, outside the arena")


def add_check_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_loop_limit(p)
    data = p.add_mutually_exclusive_group()  # random inputs, or the user's data
    # default 3, set by the command, so that argparse sees `--inputs 3` beside --input
    data.add_argument("--inputs", type=positive, default=None, metavar="N",
                      help="number of random input sets, each a sequence of --sequence invokes "
                           "(default: 3)")
    p.add_argument("--sequence", type=positive, default=None, metavar="N",
                   help="invokes per input set, in a row with the state kept; every backend is "
                        "reset between sets (default: 3 for a model with state, else 1)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    data.add_argument("--input", metavar="FILE",
                      help="check on this data instead of random inputs: a .npy (one-input "
                           "model), a .npz with one array per input (named by input name or "
                           "index), a directory of such per-input .npy files, or a CSV of "
                           "values; a leading [N, ...] axis is N samples")
    data.add_argument("--dataset", metavar="DIR",
                      help="check on every sample in DIR: each file or folder as --input takes")
    p.add_argument("--labels", metavar="FILE",
                   help="with --input or --dataset: the class of each sample in order (a .npy "
                        "of integers, or integers in text), to report the top-1 and top-5 "
                        "accuracy of the oracle and of each backend")
    p.add_argument("--quantize-inputs", action="store_true",
                   help="with --input or --dataset: quantize real values into a quantized "
                        "integer input's scale and zero point, as TFLite's QUANTIZE does")
    p.add_argument("--backends", type=backend_list, default=None, metavar="LIST",
                   help="comma-separated: runtime_py, c (this host), qemu (the target's QEMU "
                        "machine, a Cortex-M4 for generic), device (a board running `arenac "
                        "project --serial`'s firmware, on --device); default: runtime_py,c, or "
                        "runtime_py,qemu with a --target")
    p.add_argument("--device", metavar="PORT",
                   help="the serial port of the device backend (/dev/ttyACM0, COM3, or the "
                        "pseudo-terminal QEMU prints)")
    p.add_argument("--baud", type=positive, default=115200, metavar="N",
                   help="the device's baud rate (default: 115200)")
    p.add_argument("--device-timeout", type=seconds, default=30.0, metavar="S",
                   help="time the device may take to answer one frame (default: 30)")
    p.add_argument("--sanitize", action="store_true",
                   help="build the host C with ASan and UBSan (float-to-int overflow included) "
                        "and also run it and runtime_py on edge inputs (NaN, +-inf, denormals, "
                        "+-max of each input dtype), which the oracle is not asked about: "
                        "TFLite leaves them undefined")
    p.add_argument("--oracle-timeout", type=seconds, default=120.0, metavar="S",
                   help="time each TFLite interpreter may take, in its child process "
                        "(default: 120)")
    p.add_argument("--per-layer", action="store_true",
                   help="compare every intermediate tensor and name the first op that differs")


def add_bench_options(p: argparse.ArgumentParser) -> None:
    add_target(p, "cortex-m4")
    p.add_argument("--portable", action="store_true",
                   help="the portable kernels only, built for the target (the baseline its own "
                        "kernels are measured against)")
    p.add_argument("--optimize", choices=["O2", "Os", "O3"], default="O2",
                   help="arm-none-eabi-gcc's optimization level (default: O2)")
    p.add_argument("--wait-states", type=wait_states, default=0, metavar="N",
                   help="flash wait states the cycle estimate assumes: N cycles more for every "
                        "data read from flash and every pipeline refill (default: 0)")


def add_project_options(p: argparse.ArgumentParser) -> None:
    from toolchain.targets import BOARDS, DEFAULT_BOARD, PARTS

    p.add_argument("-o", "--output-dir", required=True, metavar="DIR",
                   help="where the project goes")
    p.add_argument("--board", choices=sorted({*BOARDS, *PARTS}), default=None,
                   help="the QEMU machine the firmware runs on, or an MLPerf Tiny reference "
                        "board (its memory map, the core's cycle counter; built, not run "
                        "here), or a [part] of --memory FILE; its core picks the kernels "
                        f"(default: {DEFAULT_BOARD}, a Cortex-M4)")
    p.add_argument("--name", type=c_name, default=None, metavar="NAME",
                   help="the model's C name (default: the file's)")
    p.add_argument("--input", metavar="FILE.npy", action="append", default=None,
                   help="the test input main.c embeds, one per model input (default: check's "
                        "random input of seed 0)")
    p.add_argument("--serial", action="store_true",
                   help="main.c is the self-test firmware `check --backends device` talks to "
                        "over the board's UART0 (inputs in, outputs and ticks out), not a run "
                        "on the embedded input")
    p.add_argument("--force", action="store_true",
                   help="replace files edited since arenac wrote them")


def add_embed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, metavar="OUT.tflite",
                   help="the model with the plan in its metadata")


def add_report_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="where the page goes")
    p.add_argument("--inputs", type=positive, default=3, metavar="N",
                   help="random input sets the check runs (default: 3)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    p.add_argument("--no-check", action="store_true",
                   help="leave out the check (the oracle, runtime_py and the C)")
    p.add_argument("--no-footprint", action="store_true",
                   help="leave out the footprint (built with arm-none-eabi-gcc)")


def add_solve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("problem", metavar="PROBLEM.csv", help="the allocation problem")
    p.add_argument("--capacity", type=positive, metavar="BYTES",
                   help="find a plan within this many bytes (default: the smallest found)")
    p.add_argument("-o", "--output", metavar="SOLUTION.csv",
                   help="write the solution: the problem's columns and an offset column")
    p.add_argument("--nodes", type=whole, default=SOLVE_NODES, metavar="N",
                   help="search nodes the search may visit: the same solution on any machine "
                        f"(default: {SOLVE_NODES:,})")
    p.add_argument("--time-limit", type=seconds, default=None, metavar="S",
                   help="also stop the search after S seconds (default: none)")
    p.add_argument("--align", type=alignment, default=1,
                   help="every offset a multiple of this power of two (default: 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
