"""`arenac`: a thin command line over the library. Parse, call, print.

Every failure a user can cause ends in one line on stderr and exit status 2, before any output
file is written.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from toolchain.errors import ArenacError
from toolchain.planners import PLANNERS

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


def write_atomic(path: str, text: str) -> None:
    """Write the whole file or nothing: a failed run leaves no partial output behind."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".arenac-")
    except OSError as e:
        raise ArenacError(f"cannot write ({e.strerror})", path) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


# --- commands ---------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from toolchain.reader import read_model
    from toolchain.report import inspect_data, inspect_text

    data = inspect_data(read_model(args.model))
    emit_json(data) if args.json else print(inspect_text(data))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from toolchain.plan import plan_model
    from toolchain.planners.csvio import dump_buffers
    from toolchain.reader import read_model
    from toolchain.report import memory_map_svg, plan_data, plan_text

    options = {"fit": args.fit} if args.planner == "freelist" else {}
    mp = plan_model(read_model(args.model), args.planner, args.align, **options)
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


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to a .tflite file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_planning(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--planner",
        choices=sorted(PLANNERS),
        default="greedy",
        help="arena planner (default: greedy)",
    )
    p.add_argument(
        "--fit",
        choices=["first", "best"],
        default="first",
        help="free-block choice of the freelist planner (default: first)",
    )
    p.add_argument(
        "--align",
        type=alignment,
        default=16,
        metavar="N",
        help="offset alignment in bytes, a power of two (default: 16)",
    )


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int], list[Callable]]] = {
    "inspect": ("show operators, tensors and totals of a model", cmd_inspect, [add_model]),
    "plan": (
        "plan the activation arena and show where every tensor lives",
        cmd_plan,
        [add_model, add_planning],
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="arenac",
        description="Offline arena planning and C generation for TensorFlow Lite models.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, handler, adders) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        for add in adders:
            add(p)
        p.set_defaults(handler=handler)
    plan = sub.choices["plan"]
    plan.add_argument("--svg", metavar="FILE", help="write the memory map as SVG")
    plan.add_argument(
        "--dump-buffers",
        metavar="FILE.csv",
        help="write the allocation problem as MiniMalloc CSV (id,lower,upper,size)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ArenacError as e:
        print(f"arenac: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
