"""Offline testing helpers: a scripted fake model (in process or on 127.0.0.1), a small
real model served on 127.0.0.1 (the ``realmodel`` extra) and a recording executor, so users
test their own verifiers, agents and policies without a key."""

from choir.testing.fake_model import (
    FakeModel,
    FakeModelServer,
    ScriptExhausted,
    final_output,
    reply,
    text,
    tool_call,
)
from choir.testing.local_model import LocalModelServer
from choir.testing.recording import RecordingExecutor

__all__ = [
    "FakeModel",
    "FakeModelServer",
    "LocalModelServer",
    "RecordingExecutor",
    "ScriptExhausted",
    "final_output",
    "reply",
    "text",
    "tool_call",
]
