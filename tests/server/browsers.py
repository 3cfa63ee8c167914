"""The browsers the web console's tests (test_console_browser.py) run in: Debian's
`chromium` through `chromedriver` and selenium, and Debian's `firefox-esr` through
Marionette, the remote protocol built into Firefox, with Mozilla's Python client
(`marionette-driver` from PyPI).

Why not selenium for Firefox too: selenium reaches Firefox only through
geckodriver, which Debian does not package and which ships only as a download
(nothing a fresh CI machine may fetch). geckodriver itself is a translator from
WebDriver's HTTP to Marionette, whose commands are WebDriver's; `FirefoxDriver`
is the same translation for the few commands the tests use, done in Python.

Both are handed to the tests as a `Browser`. Its `driver` has selenium's surface:
`get`, `current_url`, `refresh`, `find_element(s)`, `execute_script`,
`set_window_size`, `save_screenshot`, `delete_all_cookies`, and elements with
`text`, `click`, `send_keys`, `clear`, `submit`, `is_enabled`, `is_selected`,
`is_displayed`, `get_attribute`; Marionette's errors come out as selenium's
exceptions, so selenium's `WebDriverWait` and `expected_conditions` work on either
and the test bodies are the same for both. `console_errors()` returns what the
browser's console reported as an error since the previous call:
- chromium: its log (`goog:loggingPrefs`), entries of level SEVERE: uncaught
  exceptions, `console.error`, CSP violations, and a page or resource answered
  with a 4xx/5xx (source `network`);
- firefox: WebDriver BiDi's `log.entryAdded` of level error, on the session's
  BiDi socket (`webSocketUrl`, served beside Marionette by
  `--remote-debugging-port`): uncaught exceptions and CSP violations (type
  `javascript`) and `console.error` (type `console`). Firefox does not log a 4xx
  page as an error (`Browser.logs_refused_loads` is False). The events arrive on
  their own socket, so a read first logs a marker with `console.debug` in the
  page and collects up to it: whatever the page logged before is in. The same
  socket sizes the page (`browsingContext.setViewport`): a Firefox window is
  never narrower than 500 px, the console's narrow screenshots are 390 px.

Must not import: the server; this module knows browsers, not sepp.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Debian's packages (apt-get install -y chromium chromium-driver firefox-esr);
# elsewhere set these.
CHROMIUM = os.environ.get("SEPP_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SEPP_CHROMEDRIVER", "/usr/bin/chromedriver")
FIREFOX = os.environ.get("SEPP_FIREFOX", "/usr/bin/firefox-esr")
BROWSERS = ("chromium", "firefox")
# How long a browser may take to start, and the console's marker to come back
# (a loaded 2-core CI machine).
STARTUP_S = 60
CONSOLE_MARKER_S = 10.0

# No network beyond this machine: Firefox's background services (marionette-driver
# already turns most off) meet a dead proxy (port 9, discard); loopback, where the
# console under test listens, is never proxied.
FIREFOX_PREFS: dict[str, object] = {
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9,
    "network.proxy.no_proxies_on": "127.0.0.1,localhost",
    "network.dns.disablePrefetch": True,
}

# selenium's submit(): find the form, fire `submit`, and submit unless prevented.
SUBMIT_JS = """
let form = arguments[0];
while (form.nodeName !== "FORM" && form.parentNode) { form = form.parentNode; }
const event = form.ownerDocument.createEvent("Event");
event.initEvent("submit", true, true);
if (form.dispatchEvent(event)) { HTMLFormElement.prototype.submit.call(form); }
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleError:
    """One error from a browser's console: where it came from (chromium's log
    source, e.g. `network`, `javascript`, `console-api`; firefox's BiDi entry
    type, `javascript` or `console`) and its text."""

    source: str
    message: str


class Browser:
    """A started browser: `driver` (selenium's surface), its console, and the
    folder for its screenshots and logs."""

    def __init__(
        self,
        *,
        name: str,
        artefacts: Path,
        driver: Any,
        console_errors: Callable[[], list[ConsoleError]],
        logs_refused_loads: bool,
        quit: Callable[[], None],
    ) -> None:
        self.name = name
        self.artefacts = artefacts
        self.driver = driver
        self._console_errors = console_errors
        # Whether a page answered with a 4xx shows as a console error
        # (chromium: yes, source network; firefox: no).
        self.logs_refused_loads = logs_refused_loads
        self.quit = quit

    def console_errors(self) -> list[ConsoleError]:
        """The console's errors since the previous call (or the start)."""
        return self._console_errors()


def start(name: str, window: tuple[int, int], artefacts: Path) -> Browser:
    """Starts browser `name` (headless, a `window` of width x height); skips (a
    failure in CI, tests/ci_skips.py) when it or its driver is not installed."""
    if name == "chromium":
        return _start_chromium(window, artefacts)
    if name == "firefox":
        return _start_firefox(window, artefacts)
    raise ValueError(f"unknown browser {name!r}")


# --- chromium: chromedriver + selenium --------------------------------------


def _start_chromium(window: tuple[int, int], artefacts: Path) -> Browser:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(
            f"chromium and chromium-driver are not installed ({', '.join(missing)} missing): "
            "apt-get install -y chromium chromium-driver"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--metrics-recording-only",
        "--no-default-browser-check",
        "--proxy-server=direct://",
        "--proxy-bypass-list=*",
        f"--window-size={window[0]},{window[1]}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    def console_errors() -> list[ConsoleError]:
        return [
            ConsoleError(source=e["source"], message=e["message"])
            for e in driver.get_log("browser")
            if e["level"] == "SEVERE"
        ]

    return Browser(
        name="chromium",
        artefacts=artefacts,
        driver=driver,
        console_errors=console_errors,
        logs_refused_loads=True,
        quit=driver.quit,
    )


# --- firefox: Marionette + WebDriver BiDi's log ------------------------------


def _start_firefox(window: tuple[int, int], artefacts: Path) -> Browser:
    pytest.importorskip("selenium", reason="selenium is not installed")
    pytest.importorskip("marionette_driver", reason="marionette-driver is not installed")
    websocket = pytest.importorskip("websocket", reason="websocket-client is not installed")
    from marionette_driver.marionette import Marionette

    if not shutil.which(FIREFOX):
        pytest.skip(
            f"firefox-esr is not installed ({FIREFOX} missing): apt-get install -y firefox-esr"
        )
    # port 0: marionette-driver picks a free port and gives it to Firefox's
    # profile; --remote-debugging-port=0: the BiDi server on a free port, named
    # in the session's webSocketUrl. Firefox's own output goes to gecko.log.
    marionette = Marionette(
        host="127.0.0.1",
        port=0,
        bin=FIREFOX,
        headless=True,
        app_args=["--remote-debugging-port=0"],
        startup_timeout=STARTUP_S,
        gecko_log=str(artefacts / "gecko.log"),
        prefs=FIREFOX_PREFS,
    )
    try:
        capabilities = marionette.start_session(capabilities={"webSocketUrl": True})
        marionette.set_window_rect(width=window[0], height=window[1])
        socket = websocket.create_connection(
            capabilities["webSocketUrl"], timeout=CONSOLE_MARKER_S, suppress_origin=True
        )
    except BaseException:
        marionette.cleanup()
        raise
    bidi = Bidi(socket)
    bidi.command("session.subscribe", {"events": ["log.entryAdded"]})
    driver = FirefoxDriver(marionette, bidi)
    driver.set_window_size(*window)

    def console_errors() -> list[ConsoleError]:
        return bidi.errors_until_marker(marionette.current_window_handle)

    def quit() -> None:
        try:
            socket.close()
            marionette.delete_session()
        finally:
            marionette.cleanup()  # stops Firefox, removes its profile
            # Let go of the runner and its profile objects now: left to the
            # interpreter's exit, their __del__ cleans up again and fails there.
            marionette.instance = None

    return Browser(
        name="firefox",
        artefacts=artefacts,
        driver=driver,
        console_errors=console_errors,
        logs_refused_loads=False,
        quit=quit,
    )


class Bidi:
    """The session's WebDriver BiDi socket, subscribed to `log.entryAdded`. The
    socket is read only when the test waits for a command's answer or asks for
    the console's errors; log entries met while waiting for an answer are kept
    for the next read of the console."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.markers = itertools.count(1)
        self.entries: list[dict[str, Any]] = []

    def receive(self, deadline: float) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("firefox's BiDi socket sent nothing before the deadline")
        self.socket.settimeout(remaining)
        message: dict[str, Any] = json.loads(self.socket.recv())
        if message.get("type") == "error":
            raise AssertionError(f"firefox's BiDi socket answered an error: {message}")
        return message

    def command(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Sends a command and returns its answer's result."""
        command_id = next(self.ids)
        self.socket.send(json.dumps({"id": command_id, "method": method, "params": params}))
        deadline = time.monotonic() + CONSOLE_MARKER_S
        while True:
            message = self.receive(deadline)
            if message.get("method") == "log.entryAdded":
                self.entries.append(message["params"])
            elif message.get("id") == command_id:
                result: dict[str, Any] = message.get("result", {})
                return result

    def next_entry(self, deadline: float) -> dict[str, Any]:
        if self.entries:
            return self.entries.pop(0)
        while True:
            message = self.receive(deadline)
            if message.get("method") == "log.entryAdded":
                entry: dict[str, Any] = message["params"]
                return entry

    def errors_until_marker(self, context: str) -> list[ConsoleError]:
        """Logs a marker in the page of `context` (a window handle is its BiDi
        context) and returns the error entries received before it."""
        marker = f"sepp-console-marker-{next(self.markers)}"
        self.command(
            "script.evaluate",
            {
                "expression": f"console.debug({json.dumps(marker)})",
                "target": {"context": context},
                "awaitPromise": False,
            },
        )
        errors: list[ConsoleError] = []
        deadline = time.monotonic() + CONSOLE_MARKER_S
        while True:
            entry = self.next_entry(deadline)
            if entry.get("type") == "console" and entry.get("text") == marker:
                return errors
            if entry.get("level") == "error":
                frames = (entry.get("stackTrace") or {}).get("callFrames") or []
                where = ""
                if frames:
                    top = frames[0]
                    where = f" (at {top['url']}:{top['lineNumber'] + 1}:{top['columnNumber'] + 1})"
                errors.append(ConsoleError(source=entry["type"], message=entry["text"] + where))


def _selenium_error(error: Exception) -> Exception:
    """Marionette's error as the selenium exception of the same WebDriver error
    code (WebDriverWait ignores NoSuchElementException; the expected conditions
    catch StaleElementReferenceException)."""
    from selenium.common import exceptions

    status = getattr(error, "status", "")
    kind: type[exceptions.WebDriverException] = {
        "no such element": exceptions.NoSuchElementException,
        "stale element reference": exceptions.StaleElementReferenceException,
        "element not interactable": exceptions.ElementNotInteractableException,
        "element click intercepted": exceptions.ElementClickInterceptedException,
        "invalid selector": exceptions.InvalidSelectorException,
        "javascript error": exceptions.JavascriptException,
        "timeout": exceptions.TimeoutException,
    }.get(status, exceptions.WebDriverException)
    return kind(f"{status}: {error}")


class _Translated:
    """Runs a Marionette call, raising selenium's exception for its error."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> None:
        from marionette_driver.errors import MarionetteException

        if isinstance(error, MarionetteException):
            raise _selenium_error(error) from error


translated = _Translated()


class FirefoxDriver:
    """selenium's WebDriver surface that the tests use, over Marionette."""

    def __init__(self, marionette: Any, bidi: Bidi) -> None:
        self.m = marionette
        self.bidi = bidi

    def get(self, url: str) -> None:
        with translated:
            self.m.navigate(url)

    @property
    def current_url(self) -> str:
        with translated:
            return str(self.m.get_url())

    def refresh(self) -> None:
        with translated:
            self.m.refresh()

    def find_element(self, by: str, value: str) -> FirefoxElement:
        with translated:
            return FirefoxElement(self.m.find_element(by, value))

    def find_elements(self, by: str, value: str) -> list[FirefoxElement]:
        with translated:
            return [FirefoxElement(e) for e in self.m.find_elements(by, value)]

    def execute_script(self, script: str, *args: Any) -> Any:
        # sandbox=None: in the page's own global, like selenium's (a global the
        # script sets is there for the next script and for the page).
        unwrapped = [a.e if isinstance(a, FirefoxElement) else a for a in args]
        with translated:
            return self.m.execute_script(
                script, script_args=unwrapped, sandbox=None, new_sandbox=False
            )

    def set_window_size(self, width: int, height: int) -> None:
        # The page's viewport, not the window: Firefox keeps a window at least
        # 500 px wide, and the console's narrow screenshots are 390 px.
        self.bidi.command(
            "browsingContext.setViewport",
            {
                "context": self.m.current_window_handle,
                "viewport": {"width": width, "height": height},
            },
        )

    def save_screenshot(self, path: str) -> bool:
        # The viewport, like selenium's (full=False).
        with translated:
            png = self.m.screenshot(format="base64", full=False)
        Path(path).write_bytes(base64.b64decode(png))
        return True

    def delete_all_cookies(self) -> None:
        with translated:
            self.m.delete_all_cookies()


class FirefoxElement:
    """selenium's WebElement surface that the tests use, over Marionette's."""

    def __init__(self, element: Any) -> None:
        self.e = element

    @property
    def text(self) -> str:
        with translated:
            return str(self.e.text)

    def click(self) -> None:
        with translated:
            self.e.click()

    def send_keys(self, *values: str) -> None:
        with translated:
            self.e.send_keys(*values)

    def clear(self) -> None:
        with translated:
            self.e.clear()

    def submit(self) -> None:
        with translated:
            self.e.marionette.execute_script(SUBMIT_JS, script_args=[self.e], sandbox=None)

    def is_enabled(self) -> bool:
        with translated:
            return bool(self.e.is_enabled())

    def is_selected(self) -> bool:
        with translated:
            return bool(self.e.is_selected())

    def is_displayed(self) -> bool:
        with translated:
            return bool(self.e.is_displayed())

    def get_attribute(self, name: str) -> str | None:
        with translated:
            value = self.e.get_attribute(name)
        return None if value is None else str(value)
