"""A real headless browser for the tests: Debian's Chromium driven by chromium-driver over the
W3C WebDriver protocol (plain JSON over HTTP, spoken with httpx, already in the lock: no
Selenium to add for the handful of calls a page test needs). `make browser-install` installs
both as root, as `make slurm-install` installs Slurm; without them the tests skip, saying why.

The endpoints are W3C WebDriver's (https://www.w3.org/TR/webdriver2/): new session, navigate
to, find element(s), element click, element send keys, is element displayed, execute script,
take screenshot, delete session."""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C web element identifier key
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "as root: make browser-install (apt-get install chromium chromium-driver)"


def missing_browser() -> str | None:
    """Why no browser test can run here, or None when Chromium and its driver are installed."""
    if not any(shutil.which(name) for name in CHROMIUM):
        return f"Chromium is not installed ({INSTALL_HINT})"
    if not shutil.which("chromedriver"):
        return f"chromium-driver is not installed ({INSTALL_HINT})"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Browser:
    """One WebDriver session: the few calls a page test needs."""

    def __init__(self, client: httpx.Client, session: str) -> None:
        self.client = client
        self.session = session

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        reply = self.client.request(method, f"/session/{self.session}{path}", json=body)
        value = reply.json().get("value")
        if reply.status_code != 200:
            raise RuntimeError(f"WebDriver {method} {path}: {reply.status_code} {value}")
        return value

    def open(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def find_all(self, css: str) -> list[str]:
        found = self._call("POST", "/elements", {"using": "css selector", "value": css})
        return [item[ELEMENT] for item in found]

    def find(self, css: str) -> str:
        found = self.find_all(css)
        if not found:
            raise AssertionError(f"no element matches {css!r}")
        return found[0]

    def click(self, element: str) -> None:
        self._call("POST", f"/element/{element}/click", {})

    def type(self, element: str, text: str) -> None:
        self._call("POST", f"/element/{element}/value", {"text": text})

    def displayed(self, element: str) -> bool:
        return bool(self._call("GET", f"/element/{element}/displayed"))

    def script(self, source: str, *arguments: Any) -> Any:
        return self._call("POST", "/execute/sync", {"script": source, "args": list(arguments)})

    def screenshot(self, target: Path) -> None:
        target.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))

    def resize(self, width: int, height: int) -> None:
        self._call("POST", "/window/rect", {"width": width, "height": height})


@contextmanager
def headless_chromium(log: Path, timeout_s: float = 60.0) -> Iterator[Browser]:
    """chromedriver on a free loopback port and one headless Chromium session under it."""
    port = _free_port()
    with log.open("wb") as output:
        driver = subprocess.Popen(
            ["chromedriver", f"--port={port}", f"--log-path={log}.driver"],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as client:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if client.get("/status").json()["value"]["ready"]:
                        break
                except (httpx.TransportError, ValueError, KeyError):
                    pass
                if driver.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromedriver did not start (see {log})")
                time.sleep(0.1)
            binary = next(path for name in CHROMIUM if (path := shutil.which(name)))
            options = {
                "binary": binary,
                # --no-sandbox: the tests run as root in CI, where Chromium's sandbox refuses
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                ],
            }
            reply = client.post(
                "/session",
                json={"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}},
            )
            value = reply.json()["value"]
            if reply.status_code != 200:
                raise RuntimeError(f"Chromium did not start a session: {value}")
            browser = Browser(client, value["sessionId"])
            try:
                yield browser
            finally:
                client.delete(f"/session/{browser.session}")
    finally:
        driver.terminate()
        driver.wait(timeout=20)
