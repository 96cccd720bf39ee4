"""Takes the README's screenshot of the inspector: ``docs/images/inspector.png``.

Runs a demo on a throwaway local World (a few orders, one retried, one failed, one
waiting on an approval hook, some quick greetings), serves it with ``treadle serve``'s
app on an ephemeral port, opens one order's page in headless Chromium (Debian's
``chromium`` + ``chromium-driver``, through selenium) and saves the page.

    python3 scripts/screenshot_inspector.py [--out docs/images/inspector.png] [--view run|list]

Needs the dev extras (selenium, starlette, uvicorn). The PNG is kept small (< 200 KB):
if Chromium's is larger and ImageMagick's ``convert`` is present, it is quantized.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from treadle import FatalError, Hook, RetryableError, Workflows, settings, sleep
from treadle.serve import settings as serve_settings
from treadle.serve.app import Server
from treadle.serve.context import ServeContext
from treadle.worlds.local import LocalWorld

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 200_000
FAST = {"WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 100, "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.4}


class Approval(Hook):
    approved: bool


def demo(app: Workflows) -> dict[str, Any]:
    """The demo's workflows: an order (a retried charge, a sleep, an approval), a greeting."""
    tries: dict[str, int] = {}

    @app.step
    async def reserve(order_id: str, item: str) -> bool:
        await asyncio.sleep(0.15)
        return True

    @app.step(max_retries=3)
    async def charge(order_id: str, amount: int) -> str:
        tries[order_id] = tries.get(order_id, 0) + 1
        await asyncio.sleep(0.3)
        if order_id == "o-1002" and tries[order_id] < 3:
            raise RetryableError("payment provider timed out")
        if order_id == "o-1003":
            raise FatalError("card declined")
        return f"ch_{order_id}"

    @app.step
    async def ship(order_id: str) -> str:
        await asyncio.sleep(0.2)
        return f"shipped {order_id}"

    @app.workflow
    async def order(order_id: str, amount: int, items: list[str]) -> str:
        await asyncio.gather(*(reserve(order_id, item) for item in items))
        receipt = await charge(order_id, amount)
        await sleep("1s")
        if order_id == "o-1004":
            answer = await Approval.wait(token=f"approve:{order_id}", timeout="2d")
            if answer is None or not answer.approved:
                return "held for review"
        await ship(order_id)
        return receipt

    @app.step
    async def greet(name: str) -> str:
        return f"hello, {name}"

    @app.workflow
    async def hello(name: str) -> str:
        return await greet(name)

    return {"order": order, "hello": hello}


def open_browser(width: int, height: int) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        sys.exit("needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--hide-scrollbars", "--force-device-scale-factor=1",
                 f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


async def capture(out: Path, view: str, width: int, height: int) -> None:
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp:
        world = await LocalWorld(Path(tmp) / "world").open()
        engine = settings.load({}, **FAST)
        app = Workflows(world=world, settings_=engine, worker=True)
        flows = demo(app)
        await app.world()
        ctx = ServeContext(
            world=world, settings=engine, serve=serve_settings.load({}, TREADLE_SERVE_TOKEN=token)
        )
        server = Server(ctx)
        await server.start()
        try:
            for name in ("Ada", "Grace", "Linus"):
                await (await app.start(flows["hello"], name)).result(timeout=30)
            featured = await app.start(flows["order"], "o-1002", 4200, ["tea", "pot", "cups"])
            others = [
                await app.start(flows["order"], "o-1001", 1800, ["tea"]),
                await app.start(flows["order"], "o-1003", 990, ["kettle"]),
                await app.start(flows["order"], "o-1004", 12500, ["samovar", "tea"]),
            ]
            await featured.result(timeout=60)
            for run in others[:2]:
                # o-1003 fails on purpose: the list shows it failed.
                with contextlib.suppress(Exception):
                    await run.result(timeout=60)
            path = "/" if view == "list" else f"/runs/{featured.run_id}"
            await asyncio.to_thread(_shoot, server.url, token, path, out, width, height)
        finally:
            await server.stop()
            await app.close(grace_seconds=2)
            await world.close()


def _shoot(url: str, token: str, path: str, out: Path, width: int, height: int) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver = open_browser(width, height)
    try:
        driver.get(url + "/")
        driver.execute_script("sessionStorage.setItem('treadle.token', arguments[0])", token)
        driver.get(url + path)
        ready = "table.runs tbody tr" if path == "/" else "li.bar"
        WebDriverWait(driver, 20).until(lambda d: d.find_elements("css selector", ready))
        driver.execute_script("document.activeElement && document.activeElement.blur()")
        # Grow the window to the page (up to twice the height asked) and take it whole.
        full = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(max(height, int(full)), 2 * height))
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
    if out.stat().st_size > MAX_BYTES and shutil.which("convert"):
        subprocess.run(["convert", str(out), "-colors", "128", f"PNG8:{out}"], check=True)
    print(f"{out}: {out.stat().st_size // 1024} KB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "inspector.png")
    parser.add_argument("--view", choices=["run", "list"], default="run")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=760)
    args = parser.parse_args()
    asyncio.run(capture(args.out, args.view, args.width, args.height))


if __name__ == "__main__":
    main()
