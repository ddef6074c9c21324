"""Build fragments beside the generated C: NAME.cmake and NAME.mk, for a firmware project to
include rather than copy the sources, include directory, flags and libm need by hand.

Both list only the model's own file (NAME.c; NAME_main.c is the host harness and has a main)
and locate it relative to the fragment itself, so the generated folder can live anywhere in
the firmware tree; models generated together list their shared arena's file once, whichever
of their fragments comes first. arenac's C flags (C99) reach arenac's files only: the Make
fragment builds its objects with a rule of its own, the CMake one sets them on its libraries.
The target's flags are what arenac builds, checks and measures that C with
(the CPU's and toolchain.targets.CODE_FLAGS); they are offered, not applied, since a firmware's
toolchain file already chooses its CPU.
"""

from __future__ import annotations

from toolchain import __version__
from toolchain.c.module import SHARED_NAME
from toolchain.lower.plan import ModelPlan
from toolchain.render import render
from toolchain.targets import CODE_FLAGS, get_target
from toolchain.text import c_identifier

C_FLAGS = ("-std=c99",)


def build_fragments(mp: ModelPlan, name: str, libm: bool, shared_source: bool) -> dict[str, str]:
    """NAME.cmake and NAME.mk for the files `generate` made under `name`: `libm` when its
    kernels call <math.h> functions, `shared_source` when arenac_shared.c defines its arena."""
    name = c_identifier(name)
    target = get_target(mp.program.target, mp.model.source)
    values = {
        "version": __version__,
        "sha256": mp.model.sha256,
        "name": name,
        "prefix": name.upper(),
        # models generated together also need the file that defines their shared arena, once
        "shared": SHARED_NAME if shared_source else None,
        "c_flags": " ".join(C_FLAGS),
        "target": target.name,
        # a Cortex-M target's C is built with arm-none-eabi-gcc and these flags; portable C with
        # any C99 compiler, so no compiler's own flags
        "target_flags": " ".join((*target.flags, *CODE_FLAGS) if target.flags else ()),
        "libm": libm,
        "arena_bytes": mp.arena_bytes,
        "state_bytes": mp.state_bytes,
        # CMake's references to the fragment's variables, spelled here: ${...} is no template text
        "ref": {key: f"${{{name.upper()}_{key.upper()}}}"
                for key in ("dir", "sources", "include_dirs", "libraries")},
    }
    return {
        f"{name}.cmake": render("fragments/model.cmake.j2", **values),
        f"{name}.mk": render("fragments/model.mk.j2", **values),
    }
