"""The tracer facade: off it is a no-op, on it parents spans through asyncio and threads,
carries only declared, short attributes, and stops within its bound."""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from choir import telemetry
from choir.telemetry.attributes import ATTRIBUTES, MAX_STRING, clean
from tests.otelspans import all_text, by_name, parent_of, recording

pytest.importorskip("opentelemetry.sdk")

DOCS = Path(__file__).parents[3] / "docs" / "observability.md"


def test_off_every_call_is_the_same_no_op() -> None:
    assert not telemetry.enabled()
    first, second = telemetry.span("a", {"choir.verdict": "PASS"}), telemetry.span("b")
    assert first is second
    with first as handle:
        handle.set({"choir.verdict": "FAIL"})
    telemetry.begin("k", "choir.round")
    telemetry.end("k")
    telemetry.end_under("k")
    with telemetry.within("k"):
        pass


async def test_off_async_with_is_a_no_op() -> None:
    async with telemetry.span("choir.green_thread") as handle:
        handle.set({"choir.verdict": "PASS"})


class Verdict(enum.Enum):
    PASS = "PASS"


def test_only_declared_scalar_and_short_values_pass() -> None:
    long = "x" * 10_000
    kept = clean({"choir.verdict": Verdict.PASS, "choir.verifier": "unit\x1b[31m\nnext",
                  "choir.report_hash": long, "choir.attempt": 2, "choir.cost_usd": 0.5,
                  "choir.executor.timed_out": False, "choir.run_id": None,
                  "choir.summary": "a paragraph of output", "log": "raw",
                  "choir.lens": ["a", "list"], "choir.mood": {"a": 1}})
    assert kept == {"choir.verdict": "PASS", "choir.verifier": "unit next",
                    "choir.report_hash": "x" * MAX_STRING, "choir.attempt": 2,
                    "choir.cost_usd": 0.5, "choir.executor.timed_out": False}


def test_green_threads_side_by_side_are_each_parented_to_their_round() -> None:
    async def thread(n: int) -> None:
        async with telemetry.span("choir.green_thread", {"choir.replica": n}):
            await asyncio.sleep(0.01 * (3 - n))  # interleaved: the last started ends first

            def blocking() -> None:
                with telemetry.span("chat m", kind="client"):
                    time.sleep(0.01)

            await asyncio.to_thread(blocking)

    async def round_() -> None:
        with telemetry.span("choir.round"):
            await asyncio.gather(*(thread(n) for n in range(3)))

    with recording() as exporter:
        asyncio.run(round_())
    spans = exporter.get_finished_spans()
    [rnd] = by_name(spans, "choir.round")
    threads = by_name(spans, "choir.green_thread")
    assert sorted(t.attributes["choir.replica"] for t in threads) == [0, 1, 2]
    assert all(parent_of(spans, t) is rnd for t in threads)
    calls = by_name(spans, "chat m")
    assert sorted(parent_of(spans, c).attributes["choir.replica"] for c in calls) == [0, 1, 2]


def test_keyed_spans_parent_across_call_stacks_and_are_closed_by_prefix() -> None:
    with recording() as exporter:
        with telemetry.span("choir.run", key="run-1"):
            telemetry.begin("run-1-r0", "choir.round", parent="run-1")
            with telemetry.within("run-1-r0"), telemetry.span("choir.green_thread",
                                                                key="run-1-r0-unit-0"):
                pass
            # minted after its green thread ended: still its child
            with telemetry.span("choir.attest", {"choir.attestation.id": "att-1"},
                                parent="run-1-r0-unit-0"):
                pass
            telemetry.end("run-1-r0", {"choir.action": "retry"})
            telemetry.begin("run-1-r1", "choir.round", parent="run-1")
            telemetry.begin("run-1-r1", "choir.round", parent="run-1")  # resumed: one span
            telemetry.end_under("run-1-r")  # the run stopped at an approval gate
        telemetry.end("never-opened")
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "choir.run")
    rounds = by_name(spans, "choir.round")
    assert len(rounds) == 2 and all(parent_of(spans, r) is run for r in rounds)
    [thread] = by_name(spans, "choir.green_thread")
    [attest] = by_name(spans, "choir.attest")
    assert parent_of(spans, thread) is rounds[0] and parent_of(spans, attest) is thread
    assert rounds[0].attributes["choir.action"] == "retry"


def test_a_failing_block_is_marked_by_class_never_by_message() -> None:
    canary = "CANARY-otel-exception-message-quotes-output"
    with recording() as exporter, pytest.raises(ValueError, match=canary), \
            telemetry.span("choir.green_thread"):
        raise ValueError(canary)
    [span] = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "ValueError"
    assert span.status.description == "ValueError" and not span.events
    assert canary not in all_text([span])


def test_stop_gives_up_on_an_exporter_that_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    class Hanging:
        def export(self, spans: Any) -> Any:
            from opentelemetry.sdk.trace.export import SpanExportResult

            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            release.wait(60)

        def force_flush(self, timeout_millis: int = 0) -> bool:
            return True

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.2")
    telemetry.start(exporter=Hanging())
    with telemetry.span("choir.verify"):
        pass
    started = time.monotonic()
    telemetry.stop()
    took = time.monotonic() - started
    release.set()
    assert not telemetry.enabled() and took < 2.0, took


@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("ON", True),
                                           ("0", False), ("", False), ("no", False)])
def test_choir_otel_turns_it_on(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("CHOIR_OTEL", value)
    assert telemetry.wanted() is on
    assert telemetry.wanted(True)


def test_the_docs_list_every_attribute_and_span() -> None:
    text = DOCS.read_text()
    missing = [name for name in ATTRIBUTES if f"`{name}`" not in text]
    assert not missing, f"docs/observability.md does not list {missing}"
    for span in ("choir.verify", "choir.run", "choir.round", "choir.green_thread",
                 "choir.attest", "choir.executor.attempt", "chat {model}"):
        assert f"`{span}`" in text
