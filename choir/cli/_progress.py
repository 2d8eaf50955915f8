"""``choir run``'s live view: the step, each green thread's state and time, results, the mood.

On a terminal it is a rich ``Live`` panel redrawn in place; anywhere else (CI logs, pipes) it
is one plain line per event, so nothing is lost to cursor tricks. It reads only what the
run streams (plans, green-thread states, node updates): bounded summaries, never raw output.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from choir._core.terminal import shorten, strip_controls

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.live import Live

_STYLE = {"PASS": "green", "FAIL": "red", "FLAKY": "yellow", "INCONCLUSIVE": "magenta"}
_KEEP = 8


@dataclass
class _Thread:
    label: str
    state: str = "queued"
    started: float | None = None
    seconds: float | None = None
    result: str = ""
    summary: str = ""

    def elapsed(self) -> str:
        if self.seconds is not None:
            return f"{self.seconds:.1f}s"
        return f"{time.monotonic() - self.started:.1f}s" if self.started else ""


class PlainConsole:
    """Where the view's lines go when stderr is no terminal (CI logs, pipes, ``--json``
    scripts): each line written as it is. rich, 80-100 ms of a cold command's imports here,
    is then not imported at all; and a line is neither wrapped at 80 columns nor has the
    ``:name:`` codes in a run's summary turned into emoji, as rich's plain output did."""

    is_terminal = False

    def print(self, text: str, **_style: Any) -> None:
        stream = sys.stderr  # looked up at each line, as rich's ``Console(stderr=True)`` does
        stream.write(text + "\n")
        stream.flush()


def stderr_console() -> Console | PlainConsole:
    """rich's console on stderr where rich would draw (a terminal, or ``FORCE_COLOR`` or
    ``TTY_COMPATIBLE`` set: rich's own tests), else a ``PlainConsole``."""
    if "FORCE_COLOR" not in os.environ and "TTY_COMPATIBLE" not in os.environ:
        try:
            tty = sys.stderr.isatty()
        except (AttributeError, ValueError):  # closed, or no stream at all
            tty = False
        if not tty:
            return PlainConsole()
    from rich.console import Console

    return Console(stderr=True, highlight=False)


@dataclass
class Progress:
    """An ``OnEvent`` for ``choir.graph.runner``; ``live`` draws in place on a terminal."""

    console: Console | PlainConsole
    live: bool
    step: str = "starting"
    mood: str = ""
    threads: dict[str, _Thread] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    _live: Live | None = None

    def __post_init__(self) -> None:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            assert isinstance(self.console, Console)  # live only where rich draws
            self._live = Live(get_renderable=self.render, console=self.console,
                              refresh_per_second=8, transient=False)
            self._live.start()

    def close(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        line = self._apply(kind, data)
        if line is None:
            return
        line = strip_controls(line)  # summaries and events carry text from the run
        self.log = [*self.log, line][-_KEEP:]
        if self._live is not None:
            self._live.refresh()  # every event is drawn at least once, not only on the timer
        else:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _apply(self, kind: str, data: dict[str, Any]) -> str | None:
        if kind == "progress":
            return self._progress(data)
        if kind == "attest":
            self.step = "attest"
            return f"[attest] {data.get('events', [''])[0]}"
        if kind == "adjudicate":  # its event names the decision and any mood change
            self.step = "adjudicate"
            self.mood = data.get("mood", self.mood)
            return "\n".join(f"[adjudicate] {e}" for e in data.get("events", []))
        if kind == "approve":
            return f"[approve] {data.get('status')}"
        return None

    def _progress(self, data: dict[str, Any]) -> str | None:
        what = data.get("kind")
        if what == "execute" and data.get("state") == "done":
            ended = ("timed out" if data.get("timed_out") else "done"
                     if data.get("exit_code") is None else f"exited {data['exit_code']}")
            removed = data.get("removed_bytecode") or []
            return f"  [execute] executor {ended} (isolation {data.get('isolation')})" + (
                f"\n  [execute] removed the compiled files it left (bytecode runs in place of "
                f"its source, and no check reads it): {', '.join(removed)}" if removed else "")
        if what == "execute":
            self.step = f"execute {data['work_item']} attempt {data['attempt']}"
            self.threads = {}
            return f"[execute] {data['work_item']} attempt {data['attempt']}"
        if what == "plan":
            self.mood = data.get("mood", self.mood)
            self.step = f"verify ({data.get('round_kind', 'primary')})"
            dropped = data.get("dropped") or []
            return (f"[plan] {self.mood}: {', '.join(data.get('verifiers', [])) or 'nothing'}"
                    + (f"  (dropped, never run: {', '.join(dropped)})" if dropped else "")
                    + f"\n       why: {data.get('reason', '')}")
        if what != "green":
            return None
        key = data["key"]
        label = f"{data['verifier']}#{data['replica']}" + (
            "" if data.get("lens") == "default" else f" ({data.get('lens')})")
        thread = self.threads.setdefault(key, _Thread(label))
        thread.state = data["state"]
        if thread.state == "running":
            thread.started = time.monotonic()
            return f"  [green] {label} running"
        if thread.state == "done":
            thread.seconds = data.get("seconds")
            thread.result = data.get("result", "")
            thread.summary = data.get("summary", "")
            return (f"  [green] {label} {thread.result} in {thread.elapsed()}: "
                    f"{shorten(thread.summary, 100)}")
        return None

    def render(self) -> Group:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=Text(strip_controls(f"{self.step}   mood {self.mood or '-'}")),
                      title_justify="left",
                      expand=False)
        for column in ("green thread", "state", "time", "result", "summary"):
            table.add_column(column)
        for thread in self.threads.values():
            style = _STYLE.get(thread.result, "")
            table.add_row(Text(strip_controls(thread.label)), Text(strip_controls(thread.state)),
                          thread.elapsed(), Text(strip_controls(thread.result), style=style),
                          Text(strip_controls(thread.summary[:70])))
        return Group(table, Text("\n".join(self.log[-_KEEP:]), style="dim"))


def spend_lines(usage: dict[str, dict[str, Any]]) -> list[str]:
    """One line per role: calls, tokens and cost (empty when no model was used)."""
    return [f"spend {role}: {row['calls']} call(s), "
            f"{row['prompt_tokens'] + row['completion_tokens']} tokens "
            f"({row['prompt_tokens']} in, {row['completion_tokens']} out), "
            f"${row['cost_usd']:.4f}"
            for role, row in usage.items()]
