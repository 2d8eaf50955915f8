"""``choir view`` in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium): follow a run to a failing report and a highlighted citation, see an
attestation turn invalid after a byte flip, and a hostile artifact stay inert and bounded.

Skips when Chromium, its driver or Selenium is not installed (CI installs them). With
``CHOIR_VIEW_SCREENSHOTS=DIR`` the main pages are saved there as PNGs (docs/img/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choir.evidence.artifacts import ArtifactStore
from tests.viewhome import flip_byte, make_home, run_plan, session_attestations, view_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver")
pytestmark = [pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                 reason="needs chromium and chromium-driver (apt)"),
              pytest.mark.slow]  # CI's slow stage: the README's command stays under five minutes
SHOTS = os.environ.get("CHOIR_VIEW_SCREENSHOTS")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_home(tmp_path_factory.mktemp("view"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900",  # and no name resolves: the browser stays on loopback
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"view-{name}.png"))


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def test_run_list_to_a_failing_report_to_the_highlighted_citation(
        browser: Any, made: dict[str, str]) -> None:
    with view_server(Path(made["home"])) as server:
        browser.get(server.url)
        assert browser.current_url == f"{server.base}/"  # the token left the address bar
        prefix = server.base.removeprefix(server.origin)  # the launch's path prefix
        assert len(prefix) > 20 and [c["path"] for c in browser.get_cookies()] == [f"{prefix}/"]
        assert all(a.get_attribute("href").startswith(f"{server.base}/")
                   for a in css(browser, "a[href]") if not a.get_attribute("href").count("#"))
        links = {a.text: a for a in css(browser, "a.run-link")}
        assert set(links) == {made["verify"], made["run"]}
        shot(browser, "runs")
        links[made["run"]].click()
        assert len(css(browser, "li.round")) == 2 and len(css(browser, "tr.thread")) == 2
        source = browser.page_source
        assert "executor" in source and ("container" in source or "namespace" in source)
        shot(browser, "run")
        browser.back()
        next(a for a in css(browser, "a.run-link") if a.text == made["verify"]).click()
        rows = {r.find_element("css selector", "b").text: r for r in css(browser, "tr.thread")}
        shot(browser, "verify")
        rows["unit"].find_element("css selector", "a.report-link").click()
        assert "::test_add" in browser.page_source
        shot(browser, "report")
        citation = css(browser, "a.citation")[0]
        wanted = citation.text  # "lines N–N of ..."
        citation.click()
        cited = css(browser, "span.line.cited")
        assert cited and cited[0].get_attribute("id") == f"L{wanted.split()[1].split('–')[0]}"
        assert cited[0].value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
        assert "matches the stored bytes" in css(browser, "p.cite-status")[0].text
        shot(browser, "citation")


def test_a_hostile_artifact_is_inert_and_bounded(browser: Any, made: dict[str, str]) -> None:
    with view_server(Path(made["home"])) as server:
        browser.get(server.url)
        next(a for a in css(browser, "a.run-link") if a.text == made["verify"]).click()
        rows = {r.find_element("css selector", "b").text: r for r in css(browser, "tr.thread")}
        rows["hostile"].find_element("css selector", "a.log-link").click()
        assert browser.title.startswith("artifact") and "pwned" not in browser.title
        assert css(browser, "script") == [] and css(browser, "main img") == []
        lines = css(browser, "span.line")
        assert "<script>document.title=" in lines[0].text  # shown as text, not run
        assert "RED" in lines[1].text and "\x1b" not in browser.page_source
        assert "line cut" in lines[2].text and len(lines[2].text) < 5000
        assert "after the long line" in lines[3].text
        assert len(browser.page_source) < 40_000
        shot(browser, "hostile")


def test_an_attestation_is_marked_invalid_after_a_byte_flip_in_its_object(
        browser: Any, made: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(made["home"], home)
    unit = session_attestations(home, made["verify"])["unit"]
    with view_server(home) as server:
        browser.get(server.url)
        browser.get(f"{server.base}/attestation/{unit.id}")  # type: ignore[attr-defined]
        assert css(browser, "#att-status")[0].text == "VALID"
        shot(browser, "attestation")
        log = unit.body.artifacts["logs/combined.log"]  # type: ignore[attr-defined]
        flip_byte(ArtifactStore(home / "artifacts").path_of(log), 5)
        browser.refresh()  # the status is re-derived on every view
        assert css(browser, "#att-status")[0].text == "INVALID"
        assert "MISSING OR ALTERED" in browser.page_source
        shot(browser, "attestation-invalid")
        browser.get(f"{server.base}/audit")
        violation = css(browser, "tr.violation a")[0]
        violation.click()
        assert "/attestation/" in browser.current_url or "/artifact/" in browser.current_url


@pytest.mark.slow  # a whole plan run: CI's slow stage
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="a plan's verifier needs bubblewrap")
def test_a_plan_is_drawn_as_a_graph_without_script(browser: Any, tmp_path: Path) -> None:
    """A real three-item plan (one waits for the other two): its list row leads to its page,
    where the browser renders the server-drawn SVG, one box per item, one arrow per
    dependency, coloured by state."""
    home = tmp_path / "home"
    run_plan(tmp_path, home, "demo", """\
        - id: write-a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: break-it
          goal: breaks the tree
          max_attempts: 1
          executor: {kind: command, command: 'echo BROKEN > h.txt'}
        - id: copy-a
          goal: copy a
          executor: {kind: command, command: 'echo A > b.txt'}
          depends_on: [write-a]
        - id: release-notes
          goal: needs everything
          member: worker
          depends_on: [copy-a, break-it]
        """)
    with view_server(home) as server:
        browser.get(server.url)
        next(a for a in css(browser, "a.run-link") if a.text == "demo").click()
        assert browser.current_url == f"{server.base}/plan/demo"
        nodes = css(browser, "svg.plan-graph g.node")
        assert len(nodes) == 4 and len(css(browser, "svg.plan-graph .edge")) == 3
        assert all(n.rect["width"] > 100 for n in nodes)  # laid out and drawn
        merged = css(browser, 'g.node[data-item="write-a"] rect')[0]
        failed = css(browser, 'g.node[data-item="break-it"] rect')[0]
        assert merged.value_of_css_property("fill") != failed.value_of_css_property("fill")
        assert css(browser, "script") == []
        shot(browser, "plan")
        browser.get(f"{server.origin}/plan/demo")  # outside the prefix: the cookie is not
        assert "demo" not in browser.page_source and "not found" in browser.page_source  # sent
