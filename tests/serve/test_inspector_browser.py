"""The inspector in a real headless Chromium over a real ``treadle serve`` (issue 13 item 2).

Each test starts ``treadle serve`` on a fresh local World (the ``start_serve`` fixture of
tests/serve/conftest.py: real uvicorn, real worker) and drives the page as a user
would: log in, read the runs list, open a run, watch a step appear live, press cancel.
One browser serves the whole module. Selenium is blocking, so every browser call runs
in a thread (``Page``) while the server and the worker keep this test's event loop.
Screenshots are kept under the printed artifacts directory (never committed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from treadle import FatalError, Hook, Workflows, sleep

from .browser import artifacts_dir, chromium_or_skip, open_browser, wait_for
from .conftest import FULL_TOKEN, READ_TOKEN, Served, StartServe


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Debian's chromium and chromedriver: found, installed (root with apt-get), or a
    printed skip."""
    return chromium_or_skip()


@pytest.fixture(scope="module")
def browser(chromium: tuple[str, str]) -> Iterator[Any]:
    """One headless Chromium for the module's tests."""
    driver = open_browser(chromium)
    print(f"\ninspector screenshots: {artifacts_dir()}")
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The browser on one server; each call runs in a thread (selenium blocks)."""

    def __init__(self, driver: Any, served: Served) -> None:
        self.driver = driver
        self.url = served.url

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def open(self, path: str) -> None:
        await self.call(self.driver.get, self.url + path)

    async def wait(self, condition: Callable[[Any], Any], what: str, timeout: float = 15.0) -> Any:
        return await self.call(wait_for, self.driver, condition, what, timeout)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_script, script, *args)

    async def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(await self.call(self.driver.find_elements, By.CSS_SELECTOR, selector))

    async def click(self, selector: str) -> None:
        """Clicks the first match, found and clicked in one step (the page re-renders
        what changed, so an element held across calls may be gone)."""
        script = (
            "const e = document.querySelector(arguments[0]);"
            "if (!e) return false; e.click(); return true;"
        )
        await self.wait(lambda d: d.execute_script(script, selector), f"{selector} to click")

    async def texts(self, selector: str) -> list[str]:
        """The shown text of every match, read at once (no element to go stale)."""
        script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)"
        return list(await self.js(script, selector))

    async def wait_text(self, selector: str, needle: str, what: str) -> None:
        """Waits until some match of ``selector`` shows ``needle``."""
        script = (
            "return [...document.querySelectorAll(arguments[0])]"
            ".some((e) => e.innerText.includes(arguments[1]))"
        )
        await self.wait(lambda d: d.execute_script(script, selector, needle), what)

    async def shot(self, name: str) -> None:
        path = artifacts_dir() / f"{name}.png"
        await self.call(self.driver.save_screenshot, str(path))
        print(f"screenshot: {path}")

    async def login(self, token: str) -> None:
        """Opens the page with a clean tab session and logs in through the form."""
        await self.open("/")
        await self.js("sessionStorage.clear(); location.reload();")
        form = await self.wait(_visible("#token"), "the login form")
        await self.call(form.send_keys, token)
        button = (await self.css("form.login button[type=submit]"))[0]
        await self.call(button.click)


def _visible(selector: str) -> Callable[[Any], Any]:
    from selenium.webdriver.common.by import By

    def check(driver: Any) -> Any:
        found = [e for e in driver.find_elements(By.CSS_SELECTOR, selector) if e.is_displayed()]
        return found[0] if found else False

    return check


def _attr(selector: str, name: str, value: str) -> Callable[[Any], Any]:
    from selenium.webdriver.common.by import By

    def check(driver: Any) -> Any:
        found = driver.find_elements(By.CSS_SELECTOR, selector)
        return found[0] if found and found[0].get_attribute(name) == value else False

    return check


def _register(app: Workflows, gates: dict[str, asyncio.Event]) -> dict[str, Any]:
    """The workflows the tests run: one quick, one held on a gate, one asleep."""

    @app.step
    async def greet(name: str) -> str:
        return f"hello, {name}"

    @app.workflow
    async def hello(name: str) -> str:
        return await greet(name)

    @app.step
    async def prepare(order_id: str) -> str:
        return order_id.upper()

    @app.step
    async def held(order_id: str) -> str:
        # Runs until the test opens the gate: the run is visibly mid-flight meanwhile.
        await gates.setdefault(order_id, asyncio.Event()).wait()
        return "released"

    @app.step
    async def ship(order_id: str) -> str:
        return f"shipped {order_id}"

    @app.workflow
    async def order(order_id: str) -> str:
        await prepare(order_id)
        await held(order_id)
        return await ship(order_id)

    @app.workflow
    async def nap(minutes: int) -> str:
        await sleep(f"{minutes}m")
        return "rested"

    @app.workflow
    async def approval(order_id: str) -> str:
        answer = await Approval.wait(token=f"approve:{order_id}", timeout="1h")
        return "approved" if answer is not None and answer.approved else "held"

    @app.step(max_retries=0)
    async def explode(secret: str) -> str:
        raise FatalError(f"<img src=x onerror=alert(1)> refused {secret}")

    @app.workflow
    async def doomed(secret: str) -> str:
        return await explode(secret)

    return {"hello": hello, "order": order, "nap": nap, "approval": approval, "doomed": doomed}


class Approval(Hook):
    approved: bool


@pytest.fixture
def stack_world(request: pytest.FixtureRequest) -> Any:
    """The World a test's server runs on: local unless parametrized "postgres+nats"."""
    if getattr(request, "param", "local") == "local":
        return "local"
    return request.getfixturevalue("pg_world")


@pytest.fixture
async def stack(
    start_serve: StartServe, browser: Any, stack_world: Any
) -> AsyncIterator[tuple[Served, Page, dict[str, Any], dict[str, asyncio.Event]]]:
    """A server on a fresh World, the module's browser on it, the tests' workflows.

    Afterwards the browser's console must hold no script error and no refusal by
    the Content-Security-Policy (failed requests, a 401 before login say, are fine).
    """
    served = await start_serve(stack_world)
    gates: dict[str, asyncio.Event] = {}
    flows = _register(served.app, gates)
    page = Page(browser, served)
    await page.call(browser.get_log, "browser")  # what earlier tests left
    yield served, page, flows, gates
    entries = await page.call(browser.get_log, "browser")
    bad = [
        str(e.get("message"))
        for e in entries
        if e.get("level") == "SEVERE" and "Failed to load resource" not in str(e.get("message"))
    ]
    assert not bad, f"the page logged errors: {bad}"


async def test_the_runs_list_shows_a_run_and_opens_its_page(stack: Any) -> None:
    """Issue 13 item 2: load the runs list, see a run, open it (timeline, output)."""
    served, page, flows, _ = stack
    run = await served.app.start(flows["hello"], "world")
    assert await run.result(timeout=20) == "hello, world"

    await page.login(FULL_TOKEN)
    row = f'tr[data-run-id="{run.run_id}"]'
    await page.wait(_attr(row, "data-status", "completed"), "the completed run in the list")
    cells = await page.texts(f"{row} td")
    assert cells[0] == "completed" and cells[1] == run.run_id and cells[2] == "hello"
    await page.shot("runs-list")

    await page.click(f"{row} a")
    await page.wait(_visible('li.bar[data-name="greet"]'), "the greet step's bar")
    (title,) = await page.texts("h1.run-title")
    assert run.run_id in title and "completed" in title
    assert '"hello, world"' in await page.texts(".io pre.json")
    assert await page.js("return location.pathname") == f"/runs/{run.run_id}"
    await page.shot("run-completed")

    # Its raw events, read when the "Events" box is opened.
    await page.click("details.events-box summary")
    await page.wait_text("ol.events", "run_completed", "the run's events")
    assert "run_created" in (await page.texts("ol.events"))[0]

    # Re-run: a new run with the same input, linked from the page.
    await page.click("section.actions .buttons button:nth-child(3)")
    link = await page.wait(_visible(".action-status a"), "the re-run's link")
    rerun_id = link.text
    assert rerun_id != run.run_id
    assert await served.app.get_run(rerun_id).result(timeout=20) == "hello, world"

    # The workflow's name links back to the list, filtered by it: both runs.
    await page.click("dl.facts a")
    await page.wait(_visible(f'tr[data-run-id="{rerun_id}"]'), "the list of hello runs")
    assert "workflow=hello" in await page.js("return location.search")
    assert len(await page.css("table.runs tbody tr")) == 2


@pytest.mark.parametrize("stack_world", ["local", "postgres+nats"], indirect=True)
async def test_a_step_appears_live_without_a_reload(stack: Any) -> None:
    """Issue 13 item 2 (live updates over SSE): a run held in a step moves on screen
    when the test releases it: the next step's bar appears, the run completes, and the
    page was never reloaded. On both Worlds (their feeds differ)."""
    served, page, flows, gates = stack
    gates["o-live"] = asyncio.Event()
    run = await served.app.start(flows["order"], "o-live")

    await page.login(FULL_TOKEN)
    await page.wait(_visible("table.runs"), "the runs list")
    await page.open(f"/runs/{run.run_id}")
    await page.wait(_attr('li.bar[data-name="held"]', "data-status", "running"), "held running")
    assert not await page.css('li.bar[data-name="ship"]')
    await page.js("window.__not_reloaded = true;")
    await page.shot("run-live-held")

    gates["o-live"].set()
    await page.wait(_visible('li.bar[data-name="ship"]'), "the ship step appearing live")
    await page.wait(_attr('li.bar[data-name="held"]', "data-status", "completed"), "held done")
    await page.wait_text("h1", "completed", "the run completed on screen")
    assert await page.js("return window.__not_reloaded === true") is True
    assert await run.result(timeout=20) == "shipped o-live"
    await page.shot("run-live-completed")


async def test_cancel_button_cancels_the_run_in_the_world(stack: Any) -> None:
    """Issue 13 item 2: press cancel (and confirm); the page shows the run cancelled and
    the World holds it cancelled."""
    served, page, flows, _ = stack
    run = await served.app.start(flows["nap"], 60)

    await page.login(FULL_TOKEN)
    await page.wait(_visible("table.runs"), "the runs list")
    await page.open(f"/runs/{run.run_id}")
    await page.wait(_visible("li.bar.kind-wait"), "the sleep's wait bar")
    button = await page.wait(_visible("button.danger"), "the cancel button")
    assert button.text == "Cancel run"
    await page.call(button.click)
    alert = await page.wait(lambda d: d.switch_to.alert, "the confirm dialog")
    assert run.run_id in alert.text
    await page.call(alert.accept)

    await page.wait_text("h1", "cancelled", "the run cancelled on screen")
    assert (await served.world.runs.get(run.run_id)).status == "cancelled"
    cancel = (await page.css("button.danger"))[0]
    assert not cancel.is_enabled()
    await page.shot("run-cancelled")


async def test_a_read_only_token_sees_no_actions(stack: Any) -> None:
    """Issue 13 item 1 (read-only role): the page shows the run but no action buttons."""
    served, page, flows, _ = stack
    run = await served.app.start(flows["nap"], 60)

    await page.login(READ_TOKEN)
    await page.wait(_visible(f'tr[data-run-id="{run.run_id}"]'), "the run in the list")
    assert await page.texts("#role") == ["read-only"]
    await page.open(f"/runs/{run.run_id}")
    await page.wait(_visible(".read-only-note"), "the read-only note")
    await page.wait(_visible("li.bar.kind-wait"), "the run's timeline")
    assert not await page.css("section.actions")
    buttons = set(await page.texts("main button"))
    assert not buttons & {"Cancel run", "Wake", "Re-run", "Resume hook"}
    await page.shot("run-read-only")

    # An unknown run is said in one line, with nothing else of a run's page.
    await page.open("/runs/wrun_no_such_run")
    await page.wait_text("main .error", "No run wrun_no_such_run.", "the unknown run's line")
    assert not await page.js("return !document.querySelector('.run-body').hidden")


async def test_a_bad_token_shows_the_login_error(stack: Any) -> None:
    """Issue 13 item 1 (auth): a wrong token is refused on the form, which says so and
    shows no data."""
    _, page, _, _ = stack
    await page.login("not-the-token-at-all")
    problem = await page.wait(_visible("#login-error"), "the login error")
    assert "refused" in problem.text
    assert not await page.css("table.runs")
    assert await page.js("return sessionStorage.getItem('treadle.token')") is None
    await page.shot("login-refused")


async def test_resume_a_hook_from_the_page(stack: Any) -> None:
    """Issue 13 item 1 (resume action): the run waits on a hook; the page lists it, the
    form is open with its token, a JSON payload resumes it and the run completes."""
    served, page, flows, _ = stack
    run = await served.app.start(flows["approval"], "o-7")

    await page.login(FULL_TOKEN)
    await page.wait(_visible("table.runs"), "the runs list")
    await page.open(f"/runs/{run.run_id}")
    token = await page.wait(_visible("#hook-token"), "the open resume form")
    await page.wait(lambda d: token.get_attribute("value") == "approve:o-7", "the token filled")
    await page.wait_text("section.waiting", "approve:o-7", "the hook waited on")
    await page.wait_text("li.bar.kind-hook", "approve:o-7", "the hook's bar, with its token")
    payload = (await page.css("#hook-payload"))[0]
    await page.call(payload.clear)
    await page.call(payload.send_keys, "{not json")
    await page.call((await page.css("form.resume button"))[0].click)
    status = await page.wait(_visible(".action-status.error"), "the JSON error")
    assert "not valid JSON" in status.text
    await page.call(payload.clear)
    await page.call(payload.send_keys, '{"approved": true}')
    await page.call((await page.css("form.resume button"))[0].click)
    await page.wait_text("h1", "completed", "the run completed on screen")
    assert await run.result(timeout=20) == "approved"
    await page.wait_text(".io pre.json", '"approved"', "the output")
    await page.shot("run-resumed")


async def test_a_failed_run_shows_its_error_as_text_and_folds_the_stack(stack: Any) -> None:
    """Issue 13 bad input: the inspector never shows a stack trace by default (it sits in
    a closed "details"), and an error carrying markup is shown as text, not run."""
    served, page, flows, _ = stack
    run = await served.app.start(flows["doomed"], "s3cr3t")
    with pytest.raises(Exception, match="refused"):
        await run.result(timeout=20)

    await page.login(FULL_TOKEN)
    await page.wait(_visible("table.runs"), "the runs list")
    await page.open(f"/runs/{run.run_id}")
    await page.wait(_visible("section.error-card"), "the error card")
    (card,) = await page.texts("section.error-card")
    assert "<img src=x onerror=alert(1)> refused s3cr3t" in card
    assert not await page.css("section.error-card img")
    # When the World kept a stack it is folded: a closed "details", its text not shown.
    folded = await page.js(
        "return [...document.querySelectorAll('section.error-card details.stack')]"
        ".map((d) => [d.open, d.querySelector('pre').checkVisibility()])"
    )
    assert all(state == [False, False] for state in folded), folded
    await page.wait(_attr('li.bar[data-name="explode"]', "data-status", "failed"), "the bar")
    await page.shot("run-failed")


async def test_the_runs_list_filters_searches_pages_and_updates_live(stack: Any) -> None:
    """Issue 13 item 1 (runs list): the status filter, the workflow filter, the search
    box and cursor paging each narrow what is listed; a run started meanwhile appears
    without a reload."""
    served, page, flows, _ = stack
    done = [await served.app.start(flows["hello"], name) for name in ("a", "b", "c")]
    for run in done:
        await run.result(timeout=20)
    napping = await served.app.start(flows["nap"], 60)
    every = {r.run_id for r in [*done, napping]}

    async def listed() -> set[str]:
        return set(await page.js(
            "return [...document.querySelectorAll('table.runs tbody tr')]"
            ".map((tr) => tr.dataset.runId)"
        ))  # fmt: skip

    await page.login(FULL_TOKEN)
    await page.open("/?limit=3")
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 3, "page 1")
    first = await listed()
    next_button = await page.wait(_visible(".pager button:last-child"), "the next button")
    await page.call(next_button.click)
    await page.wait_text(".page-info", "Page 2", "page 2")
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 1, "page 2")
    second = await listed()
    assert first | second == every and not first & second
    await page.call((await page.css(".pager button"))[0].click)
    await page.wait_text(".page-info", "Page 1", "back on page 1")
    assert await listed() == first

    await page.open("/")
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 4, "all four")
    # The revision filter offers the World's deployments (from /api/deployments).
    deployment = served.app.settings.TREADLE_DEPLOYMENT_ID
    choices = await page.texts("#f-deployment option")
    assert choices[0] == "any" and any(c.startswith(deployment) for c in choices[1:]), choices
    await page.js(
        "const s = document.getElementById('f-status'); s.value = 'running';"
        "s.dispatchEvent(new Event('change'));"
    )
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 1, "running")
    assert await listed() == {napping.run_id}
    assert "status=running" in await page.js("return location.search")

    await page.js("document.getElementById('f-status').value = ''")
    workflow = (await page.css("#f-workflow"))[0]
    await page.call(workflow.send_keys, "hello")
    await page.call((await page.css("form.filters button"))[0].click)
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 3, "hello")
    assert await listed() == {r.run_id for r in done}

    search = (await page.css("#f-q"))[0]
    await page.call(search.send_keys, done[1].run_id)
    await page.call((await page.css("form.filters button"))[0].click)
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 1, "the one")
    assert await listed() == {done[1].run_id}
    await page.shot("runs-searched")

    # Clear the filters; a run started now shows up on its own (the list's stream).
    await page.open("/")
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 4, "all four")
    await page.js("window.__not_reloaded = true;")
    late = await served.app.start(flows["hello"], "late")
    await page.wait(_visible(f'tr[data-run-id="{late.run_id}"]'), "the new run, live")
    assert await page.js("return window.__not_reloaded === true") is True


async def test_wake_ends_a_sleep_and_the_run_goes_on(stack: Any) -> None:
    """Issue 13 item 1 (wake action): a run asleep for an hour is woken from the page;
    its sleep ends at once and the run completes."""
    served, page, flows, _ = stack
    run = await served.app.start(flows["nap"], 60)

    await page.login(FULL_TOKEN)
    await page.wait(_visible("table.runs"), "the runs list")
    await page.open(f"/runs/{run.run_id}")
    await page.wait(_attr("li.bar.kind-wait", "data-status", "waiting"), "the sleep")
    await page.click("section.actions .buttons button:nth-child(2)")
    await page.wait_text(".action-status", "Wake sent", "the wake sent")
    await page.wait_text("h1", "completed", "the run completed on screen")
    assert await run.result(timeout=20) == "rested"
    assert (
        await page.texts("li.bar.kind-wait")
        and (await page.js("return document.querySelector('li.bar.kind-wait').dataset.status"))
        == "completed"
    )


async def test_a_narrow_window_reads_without_sideways_scrolling(stack: Any) -> None:
    """Issue 13 item 1 (readable in a narrow window): at phone width the runs list
    and a run's page fit the window (no horizontal scroll), the Gantt included."""
    served, page, flows, gates = stack
    gates["o-narrow"] = asyncio.Event()
    gates["o-narrow"].set()
    run = await served.app.start(flows["order"], "o-narrow")
    assert await run.result(timeout=20) == "shipped o-narrow"

    size = await page.call(page.driver.get_window_size)
    await page.call(page.driver.set_window_size, 390, 844)
    try:
        overflow = "return document.documentElement.scrollWidth - window.innerWidth"
        await page.login(FULL_TOKEN)
        await page.wait(_visible(f'tr[data-run-id="{run.run_id}"]'), "the run in the list")
        assert await page.js(overflow) <= 0
        await page.shot("narrow-runs-list")
        await page.open(f"/runs/{run.run_id}")
        await page.wait(_visible('li.bar[data-name="ship"]'), "the Gantt")
        assert await page.js(overflow) <= 0
        await page.shot("narrow-run")
    finally:
        await page.call(page.driver.set_window_size, size["width"], size["height"])
