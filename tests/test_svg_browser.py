"""The SVG memory map as a browser draws it: headless Chromium renders the map to PNG (it must
not be blank) and measures every label (each inside the canvas, axis labels never running
into one another, a rectangle's name inside its rectangle). Skipped where no browser is
installed, except under CI, which must have one (.ci/run installs it)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from tests.conftest import SHARED_MODELS
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lower.plan import plan_model
from toolchain.views.report import memory_map_svg

BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
if BROWSER is None and os.environ.get("CI"):
    raise RuntimeError(f"CI must have a headless browser ({', '.join(BROWSERS)})")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium or Chrome installed")

# Loaded with the map inline: every <text>'s box in the map's own pixels, grouped as the map
# groups them, into <pre id="result"> for --dump-dom to print.
MEASURE = """<!DOCTYPE html>
<html><body style="margin:0">%s
<pre id="result"></pre>
<script>
const svg = document.querySelector("svg");
const origin = svg.getBoundingClientRect();
function box(e) {
  const r = e.getBoundingClientRect();
  return [r.left - origin.left, r.top - origin.top, r.right - origin.left, r.bottom - origin.top];
}
const texts = [...svg.querySelectorAll("text")].map(e => ({
  text: e.textContent,
  group: e.parentElement.getAttribute("class") || "",
  box: box(e),
  rect: e.parentElement.getAttribute("class") === "buffer"
    ? box(e.parentElement.querySelector("rect")) : null,
}));
document.getElementById("result").textContent = JSON.stringify({
  width: origin.width, height: origin.height, texts: texts,
});
</script></body></html>
"""

MODELS = {
    "residual_cnn_int8": lambda: parse_model(EXAMPLES["residual_cnn_int8"](), "residual.tflite"),
    "tiny_cnn_int8": lambda: parse_model(EXAMPLES["tiny_cnn_int8"](), "tiny.tflite"),
    **{
        name: (lambda name=name: read_model(SHARED_MODELS / f"{name}.tflite"))
        for name in ("person_detect", "vww_96_int8")
        if (SHARED_MODELS / f"{name}.tflite").exists()
    },
}


def chromium(*args: str) -> str:
    result = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def png_pixels(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes) as rows x columns x
    channels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        chunks.setdefault(kind, []).append(data[at + 8 : at + 8 + length])
        at += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][0])
    assert depth == 8 and color in (2, 6) and interlace == 0
    channels = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(chunks[b"IDAT"])), np.uint8)
    raw = raw.reshape(height, 1 + width * channels).astype(np.int32)
    image = np.zeros((height, width * channels), np.int32)
    previous = np.zeros(width * channels, np.int32)
    for y in range(height):
        image[y] = previous = unfilter(raw[y, 0], raw[y, 1:], previous, channels)
    return image.reshape(height, width, channels)


def unfilter(kind: int, line: np.ndarray, up: np.ndarray, channels: int) -> np.ndarray:
    """One PNG row from its filtered bytes and the row above (filters 0-4 of the PNG spec)."""
    if kind in (0, 2):
        return (line + (up if kind == 2 else 0)) & 255
    if kind == 1:  # each byte adds the one a pixel to its left: a running sum per channel
        return (np.cumsum(line.reshape(-1, channels), axis=0).reshape(-1)) & 255
    row = np.zeros_like(line)
    for i in range(len(line)):
        left = row[i - channels] if i >= channels else 0
        corner = up[i - channels] if i >= channels else 0
        guess = left if kind == 1 else (left + up[i]) >> 1 if kind == 3 else paeth(left, up[i],
                                                                                 corner)
        row[i] = (line[i] + guess) & 255
    return row


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def overlap(a: list[float], b: list[float]) -> bool:
    slack = 0.5  # antialiased edges of neighbouring labels may touch
    return (a[0] < b[2] - slack and b[0] < a[2] - slack
            and a[1] < b[3] - slack and b[1] < a[3] - slack)


@pytest.fixture(params=sorted(MODELS), scope="module")
def svg_file(request, tmp_path_factory):
    """The model's memory map, planned once for both tests of it."""
    path = tmp_path_factory.mktemp("maps") / f"{request.param}.svg"
    path.write_text(memory_map_svg(plan_model(MODELS[request.param]())))
    return path


def test_the_map_renders_and_is_not_blank(svg_file, tmp_path):
    width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"',
                                               svg_file.read_text()).groups())
    png = tmp_path / "map.png"
    chromium(f"--window-size={width},{height}", f"--screenshot={png}", svg_file.as_uri())
    pixels = png_pixels(png.read_bytes())[..., :3]
    assert pixels.shape[:2] == (height, width)
    inked = (pixels < 250).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3) // 16, axis=0))
    assert inked > 0.05 and colours > 8, (inked, colours)


def test_every_label_is_inside_the_canvas_and_axis_labels_never_touch(svg_file, tmp_path):
    page = tmp_path / "measure.html"
    page.write_text(MEASURE % svg_file.read_text())
    dom = chromium("--dump-dom", page.as_uri())
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, re.DOTALL)
    assert found, dom[-2000:]
    measured = json.loads(html.unescape(found.group(1)))
    texts = measured["texts"]
    assert any(t["group"] == "x-axis" for t in texts) and any(t["group"] == "y-axis"
                                                             for t in texts)
    for t in texts:
        left, top, right, bottom = t["box"]
        assert right > left and bottom > top, t
        assert left >= 0 and top >= 0, t
        assert right <= measured["width"] and bottom <= measured["height"], t
        if t["rect"]:  # a rectangle's name lies within it
            r = t["rect"]
            assert r[0] <= left and right <= r[2] and r[1] <= top and bottom <= r[3], t
    apart = [t for t in texts if t["group"] != "buffer"]
    for i, a in enumerate(apart):
        for b in apart[i + 1 :]:
            assert not overlap(a["box"], b["box"]), (a, b)


def test_the_report_page_renders_with_its_map(tmp_path):
    from toolchain.views.html import report_html

    mp = plan_model(MODELS["residual_cnn_int8"]())
    page = tmp_path / "report.html"
    page.write_text(report_html(mp, b"", check=False, footprint=False))
    png = tmp_path / "report.png"
    chromium("--window-size=1100,1600", f"--screenshot={png}", page.as_uri())
    pixels = png_pixels(png.read_bytes())[..., :3]
    coloured = (pixels.max(axis=2) - pixels.min(axis=2) > 40).mean()  # the map's fills; text
    assert (pixels < 250).any(axis=2).mean() > 0.03 and coloured > 0.02, coloured  # is grey
