"""A real uvicorn server on a free loopback port, in a thread, for the tests that talk HTTP."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(app: Any, *, port: int | None = None) -> Iterator[str]:
    """Serve ``app`` (a FastAPI app) on 127.0.0.1 until the block ends; yields its URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start within 30 s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def chromium() -> tuple[str, str] | None:
    """``(browser, chromedriver)`` paths of the system Chromium (Debian's ``chromium`` and
    ``chromium-driver``), or ``None`` when either is missing (the browser tests then skip)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


NO_CHROMIUM = "needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)"


def headless_chrome(webdriver: Any, *args: str) -> Any:
    """A headless Chrome session on the system Chromium (``webdriver``: ``selenium.webdriver``),
    with ``args`` added to the usual headless flags; the caller quits it."""
    from selenium.webdriver.chrome.service import Service

    found = chromium()
    if found is None:
        raise RuntimeError(NO_CHROMIUM)
    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *args):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=found[1]), options=opts)
