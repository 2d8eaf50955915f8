"""Offline testing helpers: a scripted fake model (in process or on 127.0.0.1) and a
recording executor, so users test their own verifiers, agents and policies without a key."""

from choir.testing.fake_model import (
    FakeModel,
    FakeModelServer,
    ScriptExhausted,
    final_output,
    reply,
    text,
    tool_call,
)
from choir.testing.recording import RecordingExecutor

__all__ = [
    "FakeModel",
    "FakeModelServer",
    "RecordingExecutor",
    "ScriptExhausted",
    "final_output",
    "reply",
    "text",
    "tool_call",
]
