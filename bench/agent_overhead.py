"""The Agent loop's own cost per turn, against calling the same fake model bare.

    python bench/agent_overhead.py [--turns 200]

Rows: ``bare``: the scripted model's ``complete`` called N times with a growing message
list (what any loop must do); ``agent``: an Agent run of N turns, each a typed tool call
validated, injected and answered, then ``final_output`` validated and verified; ``agent +
sqlite``: the same, with the context saved durably after every step. Per-turn figures and
the ratio to bare, in one process, so machine noise cancels.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from choir import Agent
from choir.agent import RetryPolicy, SqliteContextStore
from choir.agent.llm import ModelReply
from choir.testing import FakeModel, final_output, reply, tool_call


class Out(BaseModel):
    total: int


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: first.
        b: second.
    """
    return a + b


def verify(out: Out) -> int:
    return out.total


def script(turns: int) -> list[ModelReply]:
    return [*(reply(tool_call("add", {"a": i, "b": 1})) for i in range(turns - 1)),
            final_output(total=turns)]


async def bare(turns: int) -> float:
    model = FakeModel(list(script(turns)))
    messages: list[dict[str, object]] = [{"role": "user", "content": "q"}]
    start = time.perf_counter()
    for _ in range(turns):
        got = await model.complete(list(messages), [])
        messages.append(got.as_message())
        for call in got.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "1"})
    return time.perf_counter() - start


async def agent(turns: int, store: SqliteContextStore | None) -> float:
    a = Agent(model=FakeModel(list(script(turns))), tools=[add], output_type=Out,
              verifier=verify, max_turns=turns + 1, retry=RetryPolicy(backoff_s=0))
    start = time.perf_counter()
    result = await a.run("q", store=store, run_id=f"bench-{time.monotonic_ns()}")
    assert result.status == "completed", result.message
    return time.perf_counter() - start


async def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteContextStore(Path(tmp) / "agents.sqlite")
        rows = {"bare": await bare(turns), "agent": await agent(turns, None),
                "agent + sqlite": await agent(turns, store)}
    base = rows["bare"]
    print(f"{'':16} {'total s':>9} {'ms/turn':>9} {'x bare':>8}   ({turns} turns)")
    for name, secs in rows.items():
        print(f"{name:16} {secs:9.3f} {secs / turns * 1000:9.2f} {secs / base:8.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    asyncio.run(main(parser.parse_args().turns))
