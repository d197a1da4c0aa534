"""``fracpilot report``'s HTML in a real browser: headless Chromium (Debian's ``chromium``,
installed by scripts/install-servers.sh) opens it without errors and its screenshot shows the
charts.

The browser is driven over the DevTools protocol (a WebSocket): console errors, uncaught
exceptions and failed loads are collected while the page loads, every image must have
decoded, and a full-page screenshot is taken. Inside the box of each chart the screenshot must
not be blank: a share of non-white pixels, many colours, and the red of the fraction line.
Without chromium the test is skipped with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websocket
from PIL import Image
from typer.testing import CliRunner

from fracpilot_cli.main import app
from helpers import reset_nats
from support.operator_scenario import namespace_policy, operator_fleet, publish, record

pytestmark = pytest.mark.integration
FRACTION_RED = (0xD6, 0x27, 0x28)  # plots.ALLOCATION: the fraction line and markers
WINDOW = (1280, 1000)


def chromium_binary() -> str:
    configured = os.environ.get("FRACPILOT_CHROMIUM_BIN")
    found = configured or shutil.which("chromium") or shutil.which("chromium-browser")
    if found and Path(found).exists():
        return found
    reason = "chromium is not installed: scripts/install-servers.sh (make servers) installs it"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: required)")
    pytest.skip(reason)


class Browser:
    """A headless Chromium and a DevTools session on its one page."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # we run as root
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                f"--user-data-dir={profile}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its helper processes share its process group
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self.events: list[dict[str, Any]] = []
        self._id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result
            self.events.append(message)

    def wait_for(self, event: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == event for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout_s} s")
            self.events.append(json.loads(self.ws.recv()))

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads)."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(f"console.{params['type']}: {params['args']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        return found

    def open(self, url: str) -> None:
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return reply["result"]["value"]

    def screenshot(self) -> Image.Image:
        """The whole page (up to 12,000 px tall), at one device pixel per CSS pixel."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {
            "x": 0,
            "y": 0,
            "width": size["width"],
            "height": min(size["height"], 12_000),
            "scale": 1,
        }
        shot = self.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
        )
        return Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")

    def close(self) -> None:
        """Stop the browser and its helper processes (its process group)."""
        try:
            self.ws.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until its helpers are gone too
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    binary = chromium_binary()
    profile = tmp_path / "chromium-profile"  # pytest's, kept a few runs: helpers may still write
    profile.mkdir()
    b = Browser(binary, profile)
    try:
        yield b
    finally:
        b.close()


def drawn(region: Image.Image) -> tuple[float, int, int]:
    """(share of non-white pixels, distinct colours, pixels of the fraction red)."""
    pixels = np.asarray(region, dtype=np.int16).reshape(-1, 3)
    ink = float((pixels.min(axis=1) < 235).mean())
    colours = len(np.unique(pixels, axis=0))
    red = int((np.abs(pixels - np.array(FRACTION_RED)).max(axis=1) <= 40).sum())
    return ink, colours, red


def test_the_error_check_catches_errors(browser: Browser, tmp_path: Path) -> None:
    """The harness would see a broken page: a console error and a missing image."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><img src="missing.png"><script>console.error("boom")</script></body></html>'
    )
    browser.open(page.as_uri())
    errors = browser.errors()
    assert any("boom" in e for e in errors), errors
    assert any("missing.png" in e for e in errors), errors


async def test_the_report_opens_without_errors_and_shows_its_charts(
    nats_url: str, browser: Browser, tmp_path: Path
) -> None:
    await reset_nats(nats_url)
    await publish(nats_url, record(operator_fleet(), namespace_policy("inference", 3)))
    out = tmp_path / "report"
    result = await asyncio.to_thread(  # the command runs its own event loop
        CliRunner().invoke,
        app,
        ["report", "--since", "1h", "--out", str(out)],
        env={"FRACPILOT_NATS_URL": nats_url},
    )
    assert result.exit_code == 0, result.output
    page = out / "report.html"

    browser.open(page.as_uri())
    assert browser.errors() == []
    assert browser.evaluate("document.title") == "fracpilot report"
    images = browser.evaluate(
        "Array.from(document.images).map(i => {const r = i.getBoundingClientRect();"
        " return {alt: i.alt, ok: i.complete && i.naturalWidth > 0,"
        " x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height}})"
    )
    assert len(images) == 6  # the fleet and the five workloads
    assert all(i["ok"] for i in images), images

    shot = browser.screenshot()
    shot.save(tmp_path / "report.png")
    print(f"screenshot: {tmp_path / 'report.png'} {shot.size}")
    ink, colours, _ = drawn(shot)
    assert ink > 0.05, ink
    assert colours > 50, colours
    for image in images:
        if image["y"] + image["h"] > shot.size[1]:
            continue  # below the part captured
        box = (
            int(image["x"]),
            int(image["y"]),
            int(image["x"] + image["w"]),
            int(image["y"] + image["h"]),
        )
        ink, colours, red = drawn(shot.crop(box))
        assert ink > 0.03, (image["alt"], ink)
        assert colours > 20, (image["alt"], colours)
        assert red > 200, (image["alt"], red)  # the fraction held is drawn
