"""Jinja rendering: Python computes every value, the templates in templates/ only lay out text."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2


def template_dir() -> Path:
    """templates/ of a source checkout, or its installed copy inside the toolchain package."""
    installed = Path(str(resources.files("toolchain"))) / "templates"
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / "templates"


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=jinja2.select_autoescape(["svg.j2", "html.j2"]),
    )


def render(template: str, **values: Any) -> str:
    return environment().get_template(template).render(**values)
