"""The span attributes Choir may export, and the one filter every value passes.

Spans leave the machine (an OTLP collector, a vendor's trace view), so what they carry is
decided here, not at each call site: a name not in ``ATTRIBUTES`` is dropped, and a value is
kept only if it is a number, a flag or a short string (hashes, names, ids, verdicts). Raw
verifier output, log text, prompts and model replies have no attribute to travel in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from choir._core.terminal import strip_controls

# name -> what it holds (docs/observability.md shows this table)
ATTRIBUTES: dict[str, str] = {
    "choir.action": "the adjudication's move after a round (done, retry, nested, halt, ...)",
    "choir.attempt": "the executor attempt's number, from 1",
    "choir.attestation.id": "the attestation minted for a green thread",
    "choir.cost_usd": "what a model call cost, in US dollars (litellm's price table)",
    "choir.crashed": "green threads that crashed (INCONCLUSIVE evidence of nothing)",
    "choir.duration_s": "a green thread's wall time, in seconds",
    "choir.executor": "the executor kind (command, python, llm)",
    "choir.executor.exit_code": "the executor's exit code (absent when it has none)",
    "choir.executor.timed_out": "whether the executor ran out of time",
    "choir.isolation": "the sandbox's or executor's isolation (namespace, container, none, ...)",
    "choir.lens": "the lens a green thread ran through (default, rerun, ...)",
    "choir.manifest_hash": "the run manifest's blake3: the artifact listing every log and file",
    "choir.mood": "the mood (CALM, SKEPTICAL, PARANOID, BOLD, CURIOUS)",
    "choir.plan": "a plan's id (reserved for the plan driver)",
    "choir.plan.item": "a plan item's id (reserved for the plan driver)",
    "choir.replica": "the replica number of a green thread",
    "choir.report_hash": "the stored report's blake3",
    "choir.round": "the round's id (a session's, or {run}-r{N})",
    "choir.round.kind": "primary, nested, broaden or verify",
    "choir.run_id": "the run, session or green thread id",
    "choir.sandbox": "the sandbox kind (docker, bwrap, local, in-process)",
    "choir.status": "how a run or session ended (asserted, halted, PASS, FAIL, ...)",
    "choir.tree_hash": "the verified tree's hash",
    "choir.verdict": "PASS, FAIL or INCONCLUSIVE",
    "choir.verifier": "the verifier's name in choir.yaml",
    "choir.verifiers": "how many green threads a round or session planned",
    "choir.work_item": "the work item's id",
    "error.type": "the exception's class name when a span failed (never its message)",
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "the model's provider (openai, anthropic, ...)",
    "gen_ai.request.model": "the model asked",
    "gen_ai.system": "the provider again, under the older convention's name",
    "gen_ai.usage.input_tokens": "prompt tokens",
    "gen_ai.usage.output_tokens": "completion tokens",
}

# long enough for a blake3 hex digest with its prefix, a run id or a model name; too short
# for a paragraph of output to travel in
MAX_STRING = 160


def clean(attrs: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """The exportable part of ``attrs``: declared names, scalar values, short clean strings."""
    out: dict[str, str | int | float | bool] = {}
    for name, value in attrs.items():
        if name not in ATTRIBUTES or value is None:
            continue
        if isinstance(value, (bool, int, float)):
            out[name] = value
        elif isinstance(value, str):
            out[name] = " ".join(strip_controls(value).split())[:MAX_STRING]
        elif hasattr(value, "value") and isinstance(value.value, str):  # an enum
            out[name] = value.value[:MAX_STRING]
    return out
