"""The web console (issue 16) in real browsers, every test in each: Debian's
chromium driven by chromedriver through selenium (`--headless=new --no-sandbox`),
and Debian's firefox-esr driven through its built-in Marionette protocol
(marionette-driver; headless), both handed to the same test bodies by
tests/server/browsers.py with selenium's surface. No network: the server listens
on 127.0.0.1:0 in a thread of this process.

Covers: login and roles; the dashboard showing five new jobs within 2 s without
a reload; a job page with its decoded payload; bulk requeue from the dead-letters
page (the job reserved again at attempt 1); pause from the queue page; a
schedule made with the schedules page's form, listed with its next fire time,
paused, resumed and deleted; no console errors on any page, in either browser. Saves a screenshot of every page, desktop
(1280 px) and narrow (390 px), under $SEPP_ARTEFACTS/console/BROWSER (else
pytest's tmp directory), with Firefox's own log (gecko.log) beside them.

Without chromium / chromedriver / firefox-esr / selenium / marionette-driver
these tests skip, which in CI (CI=true) is a failure (tests/ci_skips.py):
.ci/run installs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sepp.admin.console import fmt_ms
from sepp.server.server import SeppServer
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.browsers import Browser, ConsoleError, start
from tests.server.conftest import connect, job
from tests.server.test_admin_api import ADMIN_KEY, ADMIN_ON, KEYS_TOML, RETAIN, VIEWER_KEY

pytest.importorskip("selenium", reason="selenium is not installed")
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.usefixtures("in_process_env")

DESKTOP = (1280, 900)
NARROW = (390, 844)
# How long a page may take to show what it should (a loaded 2-core CI machine).
PAGE_WAIT_S = 10.0
# The target: a new job on an open dashboard within 2 s of its ack.
LIVE_UPDATE_S = 2.0
T = TypeVar("T")


class ServerThread:
    """An in-process sepp server on its own event loop in a thread (selenium
    blocks the test's thread)."""

    def __init__(self, **env: str) -> None:
        self.config = in_process_config(**{**ADMIN_ON, **RETAIN, **env})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stack = contextlib.AsyncExitStack()
        self.server: SeppServer | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def __enter__(self) -> ServerThread:
        self.thread.start()

        async def start() -> SeppServer:
            return await self.stack.enter_async_context(in_process(self.config))

        self.server = self.run(start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self.stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()

    @property
    def base(self) -> str:
        assert self.server is not None and self.server.admin_address is not None
        host, port = self.server.admin_address
        return f"http://{host}:{port}"

    def enqueue(self, queue: str, count: int = 1, **fields: Any) -> list[str]:
        async def go() -> list[str]:
            assert self.server is not None
            client = await connect(address_of(self.server))
            try:
                return list(await client.enqueue_ids(*(job(queue, **fields) for _ in range(count))))
            finally:
                await client.close()

        return self.run(go())

    def reserve(self, queue: str) -> list[dict[str, Any]]:
        async def go() -> list[dict[str, Any]]:
            assert self.server is not None
            client = await connect(address_of(self.server))
            try:
                return await client.reserve([queue], max_jobs=10)
            finally:
                await client.close()

        return self.run(go())

    def admin(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """A service admin call as the local admin, once durable."""
        from sepp.server.service import LOCAL_ADMIN

        async def go() -> Any:
            assert self.server is not None
            service = self.server.service
            outcome, barrier = getattr(service, operation)(LOCAL_ADMIN, *args, **kwargs)
            await service.durable(barrier)
            return outcome

        return self.run(go())


@pytest.fixture(scope="module", params=["chromium", "firefox"])
def browser(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Browser]:
    """Each browser in turn (every test runs in both), started once for the module."""
    name: str = request.param
    root = os.environ.get("SEPP_ARTEFACTS")
    path = Path(root) / "console" / name if root else tmp_path_factory.mktemp(f"console-{name}")
    path.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots ({name}): {path}")
    started = start(name, DESKTOP, path)
    try:
        yield started
    finally:
        started.quit()


@pytest.fixture
def console(browser: Browser) -> Iterator[Console]:
    with ServerThread(admin__keys=KEYS_TOML) as server:
        session = Console(browser, server)
        try:
            yield session
        finally:
            browser.driver.delete_all_cookies()


def script_errors(errors: list[ConsoleError]) -> list[ConsoleError]:
    """The errors a stopped server leaves none of: not a failed load (chromium
    logs those, source network) nor the event stream's reconnection."""
    return [e for e in errors if e.source != "network" and "/admin/api/v1/events" not in e.message]


class Console:
    def __init__(self, browser: Browser, server: ServerThread) -> None:
        self.browser = browser
        self.d = browser.driver
        self.server = server
        self.artefacts = browser.artefacts
        browser.console_errors()  # drop what earlier tests left

    def open(self, path: str) -> None:
        self.d.get(self.server.base + path)

    def wait(self, condition: Any, timeout: float = PAGE_WAIT_S) -> Any:
        return WebDriverWait(self.d, timeout).until(condition)

    def find(self, css: str) -> Any:
        return self.d.find_element(By.CSS_SELECTOR, css)

    def login(self, name: str, key: str) -> None:
        self.open("/login")
        self.find("#name").send_keys(name)
        self.find("#key").send_keys(key)
        self.find("form button[type=submit]").click()
        self.wait(ec.presence_of_element_located((By.CSS_SELECTOR, "header .who")))

    def console_errors(self) -> list[ConsoleError]:
        return self.browser.console_errors()

    def shoot(self, name: str) -> None:
        """Screenshots of the open page, desktop and narrow."""
        for label, (width, height) in (("desktop", DESKTOP), ("narrow", NARROW)):
            self.d.set_window_size(width, height)
            self.d.execute_script("return document.body.offsetHeight")  # lay out again
            self.d.save_screenshot(str(self.artefacts / f"{name}-{label}.png"))
        self.d.set_window_size(*DESKTOP)

    def confirm(self, expected_text: str) -> None:
        dialog_text = self.wait(ec.visibility_of_element_located((By.ID, "confirm-text")))
        assert dialog_text.text == expected_text
        self.find("#confirm-ok").click()


def test_login_and_roles_a_viewer_sees_the_controls_disabled(console: Console):
    server = console.server
    server.enqueue("mail", 2)
    console.open("/queues/mail")
    assert console.d.current_url.startswith(console.server.base + "/login")
    console.find("#name").send_keys("vera")
    console.find("#key").send_keys("not-the-key")
    console.find("form button[type=submit]").click()
    console.wait(ec.text_to_be_present_in_element((By.ID, "login-error"), "Unknown name or key."))
    console.shoot("login")
    console.login("vera", VIEWER_KEY)
    assert console.find("header .who").text == "vera (viewer)"
    console.open("/queues/mail")
    buttons = console.d.find_elements(By.CSS_SELECTOR, "button.act")
    assert len(buttons) == 3 and not any(b.is_enabled() for b in buttons)
    # The audit page is for admins.
    console.open("/audit")
    assert "needs role admin" in console.find("main").text
    # Chromium logs the refused login (401) and the refused page (403) as failed
    # loads, Firefox nothing; nothing else may be logged.
    refused = sorted(
        (e.message.split(" - ")[0].removeprefix(server.base), e.source)
        for e in console.console_errors()
    )
    expected = [("/audit", "network"), ("/login", "network")]
    assert refused == (expected if console.browser.logs_refused_loads else []), refused
    # A new login as an admin.
    console.d.delete_all_cookies()
    console.login("ada", ADMIN_KEY)
    console.open("/queues/mail")
    buttons = console.d.find_elements(By.CSS_SELECTOR, "button.act")
    assert len(buttons) == 3 and all(b.is_enabled() for b in buttons)
    assert console.console_errors() == []


def test_the_dashboard_shows_five_new_jobs_within_two_seconds_without_a_reload(console: Console):
    server = console.server
    server.enqueue("orders", 1)
    console.login("ada", ADMIN_KEY)
    console.open("/")
    console.wait(ec.text_to_be_present_in_element((By.ID, "live"), "live"))
    console.d.execute_script("window.__notReloaded = true")
    ready = (By.CSS_SELECTOR, 'section[data-queue="orders"] dd[data-field="ready"]')
    console.wait(ec.text_to_be_present_in_element(ready, "1"))
    server.enqueue("orders", 5)
    try:
        WebDriverWait(console.d, LIVE_UPDATE_S).until(ec.text_to_be_present_in_element(ready, "6"))
    except TimeoutException:
        pytest.fail(f"the dashboard did not show the 5 new jobs within {LIVE_UPDATE_S} s")
    assert console.d.execute_script("return window.__notReloaded") is True
    # A queue that did not exist when the page was drawn gets a card.
    server.enqueue("brand-new", 2)
    card = (By.CSS_SELECTOR, 'section[data-queue="brand-new"] dd[data-field="ready"]')
    console.wait(ec.text_to_be_present_in_element(card, "2"))
    console.shoot("dashboard")
    assert console.console_errors() == []


def test_the_dashboard_reconnects_by_itself_after_a_server_restart(browser: Browser):
    # Without keys (loopback, local admin): no session to lose in the restart.
    with ServerThread() as first:
        first.enqueue("before", 1)
        console = Console(browser, first)
        console.open("/")
        console.wait(ec.text_to_be_present_in_element((By.ID, "live"), "live"))
        host_port = first.base.removeprefix("http://")
    console.wait(ec.text_to_be_present_in_element((By.ID, "live"), "reconnecting"))
    with ServerThread(admin__listen_addr=host_port) as second:
        second.enqueue("after", 3)
        card = (By.CSS_SELECTOR, 'section[data-queue="after"] dd[data-field="ready"]')
        console.wait(ec.text_to_be_present_in_element(card, "3"))
        assert console.find("#live").text == "live"
    # While it was down: failed loads and the event stream's reconnections.
    assert script_errors(browser.console_errors()) == []


def test_a_window_picked_while_the_server_is_down_raises_no_script_error(browser: Browser):
    # Found by Firefox: the dashboard's history fetch, cut short (the server
    # down, or the page navigating away), was an uncaught rejection, which
    # Firefox reports as a console error.
    with ServerThread() as server:
        server.enqueue("before", 1)
        console = Console(browser, server)
        console.open("/")
        console.wait(ec.text_to_be_present_in_element((By.ID, "live"), "live"))
        history = f"{server.base}/console/history?window=60000"
    console.wait(ec.text_to_be_present_in_element((By.ID, "live"), "reconnecting"))
    browser.console_errors()  # the stream's refused reconnections so far
    # Pick another window: the page fetches its history from the stopped server.
    # A second fetch after it, awaited here, is refused after the first one.
    refused = console.d.execute_script(
        """
        const picker = document.getElementById("window");
        picker.value = picker.options[picker.options.length - 1].value;
        picker.dispatchEvent(new Event("change"));
        return fetch(arguments[0]).then(() => "answered", () => "refused");
        """,
        history,
    )
    assert refused == "refused"
    assert script_errors(console.console_errors()) == []


def test_the_job_page_shows_the_decoded_payload_and_the_timeline(console: Console):
    server = console.server
    data = b'{"order":42,"lines":[{"sku":"A-1","qty":2}]}'
    (job_id,) = server.enqueue(
        "orders",
        1,
        payload={"data": data, "encoding": "application/json"},
        custom={"tenant": "acme"},
    )
    console.login("ada", ADMIN_KEY)
    # The search box takes a job id.
    box = console.find("#q")
    box.send_keys(job_id)
    box.submit()
    console.wait(ec.url_contains(f"/jobs/{job_id}"))
    payload = console.find("#payload").text
    assert '"order": 42' in payload and '"sku": "A-1"' in payload
    assert console.find('td[data-field="state"]').text == "ready"
    assert "acme" in console.find("table.custom").text
    # The timeline from the log: its enqueue, and a reserve once a worker takes it.
    assert [
        e.get_attribute("data-event")
        for e in console.d.find_elements(By.CSS_SELECTOR, "#timeline li")
    ] == ["JobEnqueued"]
    server.reserve("orders")
    console.d.refresh()
    events = console.d.find_elements(By.CSS_SELECTOR, "#timeline li")
    assert [e.get_attribute("data-event") for e in events] == ["JobEnqueued", "JobReserved"]
    console.shoot("job")
    assert console.console_errors() == []


def test_bulk_requeue_from_the_dead_letters_page_and_the_job_is_reserved_again_at_attempt_1(
    console: Console,
):
    server = console.server
    ids = server.enqueue("billing", 3)
    outcome = server.admin("dead_letter_jobs", ids)
    assert not hasattr(outcome, "message"), outcome
    console.login("ada", ADMIN_KEY)
    console.open("/dead-letters?queue=billing")
    boxes = console.d.find_elements(By.CSS_SELECTOR, "input.pick")
    assert sorted(b.get_attribute("value") for b in boxes) == sorted(ids)
    console.shoot("dead-letters")
    console.find("#pick-all").click()  # select all
    assert all(box.is_selected() for box in boxes)
    console.find('button[data-action="requeue"]').click()
    console.confirm("Requeue 3 dead letters of billing?")
    console.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, "input.pick"))
    reserved = server.reserve("billing")
    assert sorted(j["id"] for j in reserved) == sorted(ids)
    assert [j["attempt"] for j in reserved] == [1, 1, 1]
    assert console.console_errors() == []


def test_pause_and_dead_letter_a_live_job_from_the_queue_page(console: Console):
    server = console.server
    server.enqueue("video", 4)
    console.login("ada", ADMIN_KEY)
    console.open("/queues/video")
    console.shoot("queue")
    console.find('button[data-action="purge"]').click()
    # The purge dialog states the count; cancelled here.
    text = console.wait(ec.visibility_of_element_located((By.ID, "confirm-text")))
    assert text.text == "Purge 4 ready and scheduled jobs of video?"
    console.find('#confirm button[value="cancel"]').click()
    # Dead-letter one live job from the queue view.
    console.find("input.pick").click()
    console.find('button[data-action="dead-letter"]').click()
    console.confirm("Dead-letter 1 selected job of video?")
    console.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "input.pick")) == 3)
    console.find('button[data-action="pause"]').click()
    console.confirm("Pause queue video?")
    console.wait(ec.presence_of_element_located((By.ID, "paused-mark")))
    info = server.admin("queue_info", "video")
    assert (info.paused, info.ready, info.dead_letter) == (True, 3, 1)
    assert console.console_errors() == []


def test_a_schedule_made_with_the_form_is_listed_with_its_next_fire_time_paused_resumed_and_deleted(
    console: Console,
):
    server = console.server
    console.login("ada", ADMIN_KEY)
    console.find('header nav a[href="/schedules"]').click()
    console.wait(ec.presence_of_element_located((By.ID, "no-schedules")))
    console.find("#s-name").send_keys("nightly digest")
    console.find("#s-queue").send_keys("reports")
    console.find("#s-type").send_keys("digest")
    console.find("#s-cron").send_keys("30 2 * * *")
    console.find("#s-tz").clear()
    console.find("#s-tz").send_keys("Europe/Berlin")
    console.find("#s-payload").send_keys("weekly numbers")
    console.find("#schedule-form button[type=submit]").click()
    row = 'tr[data-schedule="nightly digest"]'
    console.wait(ec.presence_of_element_located((By.CSS_SELECTOR, row)))
    (info,) = server.admin("list_schedules")
    assert (info.queue, info.job_type, info.cron, info.timezone, info.every_ms) == (
        "reports", "digest", "30 2 * * *", "Europe/Berlin", None
    )  # fmt: skip
    assert (info.catch_up, info.paused) == ("one", False)
    assert info.payload_encoding == "text/plain; charset=utf-8"
    assert console.find(f'{row} td[data-field="timing"]').text == "30 2 * * * (Europe/Berlin)"
    assert console.find(f'{row} td[data-field="next"]').text == fmt_ms(info.next_ms)
    console.shoot("schedules")
    # The form again with a listed name would replace it: asked first, cancelled here.
    console.find("#s-name").send_keys("nightly digest")
    console.find("#s-queue").send_keys("elsewhere")
    console.find("#s-type").send_keys("other")
    console.find("#s-every").send_keys("5000")
    console.find("#schedule-form button[type=submit]").click()
    text = console.wait(ec.visibility_of_element_located((By.ID, "confirm-text")))
    assert text.text == (
        "Replace schedule nightly digest? Its definition is overwritten by this form's."
    )
    console.find('#confirm button[value="cancel"]').click()
    console.wait(ec.invisibility_of_element_located((By.ID, "confirm-text")))
    assert server.admin("list_schedules") == (info,)
    state = (By.CSS_SELECTOR, f'{row} td[data-field="state"]')
    console.find(f'{row} button[data-action="schedule-pause"]').click()
    console.confirm("Pause schedule nightly digest? It fires no job until it is resumed.")
    console.wait(ec.text_to_be_present_in_element(state, "paused"))
    assert server.admin("list_schedules")[0].paused is True
    console.find(f'{row} button[data-action="schedule-resume"]').click()
    console.confirm("Resume schedule nightly digest? It fires again from its next tick.")
    console.wait(ec.text_to_be_present_in_element(state, "active"))
    assert server.admin("list_schedules")[0].paused is False
    console.find(f'{row} button[data-action="schedule-delete"]').click()
    console.confirm(
        "Delete schedule nightly digest? It fires no more jobs; the jobs it fired stay."
    )
    console.wait(ec.presence_of_element_located((By.ID, "no-schedules")))
    assert server.admin("list_schedules") == ()
    assert console.console_errors() == []


def test_no_console_errors_on_any_page(console: Console):
    server = console.server
    (job_id,) = server.enqueue("misc", 1, payload={"data": b"\x00\x01binary", "encoding": "x/y"})
    console.login("ada", ADMIN_KEY)
    pages = {
        "dashboard-admin": "/",
        "queue-misc": "/queues/misc",
        "job-binary": f"/jobs/{job_id}",
        "dead-letters-empty": "/dead-letters",
        "schedules-empty": "/schedules",
        "enqueue": "/enqueue",
        "audit": "/audit",
        "search-miss": "/search?q=nothing",
    }
    for name, path in pages.items():
        console.open(path)
        console.wait(ec.presence_of_element_located((By.CSS_SELECTOR, "main h1")))
        console.shoot(name)
    # The enqueue form: a rejection shown inline, then an accepted job.
    console.open("/enqueue")
    console.find("#e-queue").send_keys("misc")
    console.find("#e-type").send_keys("resize")
    console.find("#e-payload").send_keys('{"w": 10}')
    console.find("#e-custom").send_keys('{"nested": {"no": 1}}')  # the protocol refuses it
    console.find("#enqueue button[type=submit]").click()
    result = (By.ID, "enqueue-result")
    console.wait(lambda d: d.find_element(*result).text.startswith("Rejected"))
    assert "custom" in console.find("#enqueue-result").text
    console.shoot("enqueue-rejected")
    console.find("#e-custom").clear()
    console.find("#e-custom").send_keys('{"tenant": "acme"}')
    console.find("#enqueue button[type=submit]").click()
    console.wait(lambda d: d.find_element(*result).text.startswith("Enqueued"))
    console.shoot("enqueue-done")
    # The audit page lists the admin action of this test's server (none yet but
    # the enqueue is not an admin record): pause one queue and look.
    server.admin("pause_queue", "misc", "for the audit page")
    console.open("/audit")
    console.wait(lambda d: "pause" in d.find_element(By.ID, "audit-rows").text)
    console.shoot("audit-entries")
    errors = console.console_errors()
    # A 4xx of a page the test opened on purpose (the search miss) is logged by
    # the browser as a failed resource; nothing else may be.
    assert [e for e in errors if "/search?q=nothing" not in e.message] == []
