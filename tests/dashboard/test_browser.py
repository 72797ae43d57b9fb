"""End to end in a real headless Chromium: every service running, the dashboard as its own process.

Debian's chromium (scripts/install_test_deps.sh) driven by playwright for Python through that
executable; no browser is downloaded. The test loads the page, runs the what-if preview (the
preview changes, the live plan and the node do not), plays the guided demo compressed to a few
seconds per stage and watches the captions advance and the allocator table fill, then stops a
service and watches its panel say so while the others keep updating. Screenshots go to
results/dashboard/ for review.
"""

from __future__ import annotations

import functools
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parfusion.v1 import nodeagent_pb2, nodeagent_pb2_grpc
from services.common.clients import channel
from tests.conftest import ROOT
from tests.dashboard.local_stack import StackLike, start_services

CHROMIUM = "/usr/bin/chromium"
STAGE_S = 3.0
SHOTS = ROOT / "results" / "dashboard"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]


@pytest.fixture
def stack(home: Path) -> Iterator[StackLike]:
    extra = {
        "PARFUSION_NODEAGENT_BACKEND": "modeled",
        "PARFUSION_ALLOCATOR_SEED_INTENTS": "true",
        "PARFUSION_DASHBOARD_DEMO_STAGE_SECONDS": str(STAGE_S),
        "PARFUSION_DASHBOARD_REFRESH_MS": "500",
        "PARFUSION_DASHBOARD_POLL_SECONDS": "1",
        "PARFUSION_DASHBOARD_CALL_TIMEOUT_MS": "1000",
    }
    names = ["allocator", "nodeagent", "gpulane", "extender", "bridge", "dashboard"]
    running = start_services(home, names, extra)
    yield running
    running.close()


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
            viewport={"width": 1500, "height": 1300},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except Exception:  # an element swapped out mid-read: read again
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _percent(text: str) -> float:
    return float(text.strip().rstrip("%"))


@pytest.fixture
def foreign_site(tmp_path: Path) -> Iterator[str]:
    """Another web site (localhost is cross-site to 127.0.0.1) serving pages that link to the
    dashboard, as a hostile page open in the same browser would."""
    site = tmp_path / "foreign"
    site.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_guided_demo_what_if_and_a_stopped_service_in_a_real_browser(
    stack: StackLike, page: Any, foreign_site: str, tmp_path: Path
) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    refused: list[str] = []  # anything the Content-Security-Policy blocked, any script error
    page.on("console", lambda m: refused.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: refused.append(str(e)))
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    dashboard = stack.address("dashboard")

    # a link on another site: the reflected name is inert text, ?story=guided starts nothing
    (tmp_path / "foreign" / "index.html").write_text(
        f'<a id="xss" href="{dashboard}/partials/%3Cimg%20src=x%20onerror=alert(1)%3E">x</a>'
        f'<a id="story" href="{dashboard}/?story=guided">demo</a>'
    )
    page.goto(foreign_site + "/", wait_until="domcontentloaded")
    page.locator("#xss").click()
    page.wait_for_load_state("domcontentloaded")
    assert "no panel named" in page.locator("body").inner_text()
    page.goto(foreign_site + "/", wait_until="domcontentloaded")
    page.locator("#story").click()
    page.wait_for_load_state("domcontentloaded")
    _wait(
        lambda: "press Guided Demo to start it" in page.locator("#flash").inner_text(), 10, "offer"
    )
    time.sleep(1.0)
    assert page.locator("#demo-status").inner_text() == "idle"
    assert dialogs == []
    refused.clear()  # the 404 above is logged as a console error; from here on nothing may be

    page.goto(dashboard + "/", wait_until="domcontentloaded")
    assert page.evaluate("typeof htmx") == "object" and page.evaluate("htmx.version").startswith(
        "2."
    )

    # every service up: no panel reports one unreachable, the plan has rows
    _wait(lambda: page.locator("#allocation-table tr[data-intent]").count() >= 3, 30, "plan rows")
    try:
        _wait(lambda: page.locator(".down-msg").count() == 0, 20, "every panel healthy")
    except AssertionError:
        raise AssertionError(page.locator(".down-msg").all_inner_texts()) from None
    assert page.locator("#no-gpu").inner_text() == "no GPU detected"
    seeded = page.locator("#allocation-table tr[data-intent]").count()

    # what-if: the preview follows the sliders; the live plan and the node do not
    live_intents = set(page.locator("#allocation-table tr[data-intent]").evaluate_all(
        "rows => rows.map(r => r.dataset.intent)"
    ))  # fmt: skip
    cpu = page.locator("#whatif-form input[name=cpu]")
    cpu.focus()
    page.keyboard.press("End")  # slider to 1.0, like a user would
    _wait(lambda: page.locator("#preview-table").count() == 1, 15, "preview table")
    storm = page.locator("#preview").inner_text()
    assert "assuming cpu 100%" in storm
    assert page.locator("#whatif-form input[name=cpu] + output").inner_text() == "1"
    page.locator("#whatif-form input[name=rate]").focus()
    page.keyboard.press("End")  # arrival rate x4 on top
    _wait(lambda: page.locator("#preview").inner_text() != storm, 15, "preview to change")
    assert "arrival ×4" in page.locator("#preview").inner_text()
    with channel(stack.address("nodeagent")) as ch:
        tel = nodeagent_pb2_grpc.NodeAgentServiceStub(ch).GetNodeTelemetry(
            nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5
        )
    assert tel.telemetry.disturbance_remaining_s == 0  # the preview injected nothing
    assert page.locator("#active-disturbance").count() == 0
    preview_contention = _percent(page.locator("#preview-contention").inner_text())
    live_contention = _percent(page.locator("#cockpit [data-kpi=contention] .value").inner_text())
    assert live_contention < preview_contention  # the live plan never saw the what-if storm
    assert page.locator("#active-policy").inner_text() == "parfusion"
    rows = page.locator("#allocation-table tr[data-intent]")
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.intent)")) == live_intents

    # polling pauses while the tab is hidden and resumes when it is visible again
    partials: list[str] = []
    page.on("request", lambda r: partials.append(r.url) if "/partials/" in r.url else None)
    page.evaluate(
        "Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true})"
    )
    time.sleep(0.5)
    partials.clear()
    time.sleep(2.5)
    assert partials == [], partials
    page.evaluate(
        "Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    _wait(lambda: len(partials) >= 5, 5, "polling to resume")
    page.screenshot(path=str(SHOTS / "what-if.png"), full_page=True)

    # guided demo: captions advance through the five stages, policy follows, table fills
    page.locator("#guided-demo").click()
    seen_stages: list[str] = []
    classes: set[str] = set()
    deadline = time.monotonic() + STAGE_S * 5 + 30
    shot_taken = False
    while time.monotonic() < deadline:
        caption = page.locator("#demo-caption")
        try:
            stage = caption.get_attribute("data-stage", timeout=1000) if caption.count() else None
            rows = page.locator("#allocation-table tbody tr[data-intent] td:nth-child(2)")
            classes |= {rows.nth(i).inner_text() for i in range(rows.count())}
            status = page.locator("#demo-status").inner_text(timeout=1000)
        except Exception:
            continue
        if stage and (not seen_stages or seen_stages[-1] != stage):
            seen_stages.append(stage)
        if (
            stage == "disturbance"
            and not shot_taken
            and page.locator("#active-disturbance").count()
        ):
            page.screenshot(path=str(SHOTS / "guided-demo-disturbance.png"), full_page=True)
            shot_taken = True
        if status == "done":
            break
        time.sleep(0.25)
    assert seen_stages == ["baseline", "parfusion", "urgent", "disturbance", "recovery"]
    assert page.locator("#demo-status").inner_text() == "done"
    assert shot_taken, "the injected disturbance never showed in the node panel"
    assert "URGENT" in classes, f"urgent intent never reached the allocator table: {classes}"
    assert page.locator("#allocation-table tr[data-intent]").count() >= seeded
    outcomes = page.locator("#demo .outcome").all_inner_texts()
    assert any(o.startswith("SetPolicy baseline") for o in outcomes), outcomes
    assert any(o.startswith("InjectDisturbance cpu 60%") for o in outcomes), outcomes
    assert not any("failed" in o for o in outcomes), outcomes
    assert page.locator("#active-policy").inner_text() == "parfusion"
    markers = page.locator("#latency svg g.event")
    labels = [markers.nth(i).get_attribute("data-label") or "" for i in range(markers.count())]
    for label in ("1 Baseline", "policy baseline -> parfusion", "urgent obstacle-stop"):
        assert label in labels, labels
    assert any(label.startswith("disturbance cpu") for label in labels), labels
    assert page.locator("#latency svg.robot-timeline rect[data-state=PREEMPTED]").count() >= 1
    assert "PREEMPTED → URGENT_TASK_RUNNING" in page.locator("#robot ul.transitions").inner_text()
    page.screenshot(path=str(SHOTS / "guided-demo.png"), full_page=True)

    # stop a service: its panel says so, the rest keeps updating
    gpulane = stack.address("gpulane")
    stack.stop("gpulane")
    _wait(
        lambda: f"gpulane unreachable at {gpulane}" in page.locator("#gpu").inner_text(),
        15,
        "gpu panel to report gpulane down",
    )
    assert page.locator("[data-service=gpulane].down").count() == 1
    _wait(lambda: "gpulane down" in page.locator("#events").inner_text(), 10, "event log entry")
    assert page.locator("#allocator .down-msg").count() == 0
    assert page.locator("#node .down-msg").count() == 0
    generation = page.locator("#cockpit [data-kpi=policy] .sub").inner_text()
    _wait(
        lambda: page.locator("#cockpit [data-kpi=policy] .sub").inner_text() != generation,
        10,
        "the cockpit to keep updating",
    )
    page.screenshot(path=str(SHOTS / "service-down.png"), full_page=True)
    assert not [m for m in refused if "Content Security Policy" in m or "Refused" in m], refused
    assert dialogs == []
