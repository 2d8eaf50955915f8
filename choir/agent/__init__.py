"""Agents whose completion is gated by a verifier (docs/concepts.md), and their tools."""

from choir.agent.agent import Agent, AgentEvent, AgentResult
from choir.agent.context import AgentContext, ExecutionContext, VerificationState
from choir.agent.gate import RetryPolicy
from choir.agent.llm import LiteLLMModel, ModelClient, ModelReply, ToolCall
from choir.agent.store import ContextStore, SqliteContextStore
from choir.agent.tools import Tool, tool

__all__ = [
    "Agent",
    "AgentContext",
    "AgentEvent",
    "AgentResult",
    "ContextStore",
    "ExecutionContext",
    "LiteLLMModel",
    "ModelClient",
    "ModelReply",
    "RetryPolicy",
    "SqliteContextStore",
    "Tool",
    "ToolCall",
    "VerificationState",
    "tool",
]
