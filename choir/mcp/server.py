"""The MCP server: the tool list, argument validation, errors as tool errors, stdio.

Built on the SDK's low-level ``Server`` so the tools' schemas and their validation are Choir's
own closed models (``choir.mcp.args``): a field the model does not name is refused, not
dropped. Whatever goes wrong in a call (bad arguments, a path out of scope, a missing
attestation, a verification past its bound, a bug) comes back as a tool error with a bounded,
cleaned message; the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from pydantic import BaseModel, ValidationError

from choir._version import __version__
from choir.exceptions import ChoirError
from choir.mcp.args import GateArgs, ListRunsArgs, ShowArgs, VerifyArgs
from choir.mcp.bound import clean
from choir.mcp.tools import Tools

log = logging.getLogger("choir.mcp")
ERROR_MAX = 1000

INSTRUCTIONS = (
    "Choir verifies a working tree in sandboxes and signs what it found. Call `verify` after "
    "a change: it returns the verdict, bounded reports with failure signatures and next "
    "actions, and attestation ids (never raw logs). `gate` says whether a work item or claim "
    "is ASSERTed for the tree. Repos, sandbox, network and the verifier allowlist are fixed "
    "by whoever started this server; no argument changes them.")


@dataclass(frozen=True)
class ToolDef:
    name: str
    description: str
    args: type[BaseModel]
    call: Callable[[Tools, Any], Awaitable[dict[str, Any]]]
    read_only: bool = True


def _sync(method: Callable[[Tools, Any], dict[str, Any]]) -> Callable[..., Any]:
    """A reading tool, run in a worker thread so a slow disk never stalls other calls."""
    async def call(tools: Tools, args: Any) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(method, tools, args)
    return call


TOOLS = (
    ToolDef("verify", "Verify a served repo's working tree now under a mood (default CALM): "
            "returns status, verdict, run_id, bounded reports (verdict, summary, failure "
            "signatures, next actions), failing tests and attestation ids. With `claim`, a "
            "PASS is recorded so `gate` answers for this tree.", VerifyArgs, Tools.verify,
            read_only=False),
    ToolDef("show_report", "The report an attestation signed (by attestation id), re-hashed "
            "now; held-out checks show their counts only.", ShowArgs, _sync(Tools.show_report)),
    ToolDef("show_attestation", "An attestation by id, with its signature, key trust and "
            "evidence re-checked now.", ShowArgs, _sync(Tools.show_attestation)),
    ToolDef("gate", "Whether a work item or claim is ASSERTed with valid, trusted attestations "
            "for a served repo's current tree (or a commit): what `choir gate` answers.",
            GateArgs, _sync(Tools.gate)),
    ToolDef("list_runs", "Recent `choir run` and `choir verify` runs, newest first (at most "
            "`limit`); with `repo`, that repo's verify sessions.", ListRunsArgs,
            _sync(Tools.list_runs)),
)
_BY_NAME = {t.name: t for t in TOOLS}


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=clean(text, ERROR_MAX))],
                                is_error=True)


def _invalid(name: str, err: ValidationError) -> str:
    """The fields and what is wrong with each; never the value (it may be megabytes)."""
    parts = [f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
             for e in err.errors(include_input=False, include_url=False)[:10]]
    return f"{name}: invalid arguments: " + "; ".join(parts)


async def call_tool(tools: Tools, name: str, arguments: dict[str, Any] | None
                    ) -> types.CallToolResult:
    """Validate, run, answer; every failure a tool error (see the module docstring)."""
    tool = _BY_NAME.get(name)
    if tool is None:
        return _error(f"unknown tool {name[:80]!r}; the tools are: {', '.join(_BY_NAME)}")
    try:
        args = tool.args.model_validate(arguments or {})
    except ValidationError as err:
        return _error(_invalid(name, err))
    try:
        answer = await tool.call(tools, args)
    except ChoirError as exc:
        return _error(f"{name}: {exc}")
    except Exception as exc:  # a bug must not end the server, nor leak a traceback
        log.exception("tool %s failed", name)
        return _error(f"{name}: internal error ({type(exc).__name__}); the server's stderr "
                      "has the details")
    text = json.dumps(answer, ensure_ascii=False, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=answer)


def build(tools: Tools) -> Server[Any]:
    """The SDK server with Choir's tools."""

    listed = [types.Tool(name=t.name, description=t.description,
                         input_schema=t.args.model_json_schema(),
                         annotations=types.ToolAnnotations(read_only_hint=t.read_only,
                                                           open_world_hint=False))
              for t in TOOLS]

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams
                           ) -> types.CallToolResult:
        return await call_tool(tools, params.name, params.arguments)

    return Server("choir", version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def serve_stdio(tools: Tools) -> None:
    """Serve on stdin/stdout until the client closes them (logs go to stderr)."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server = build(tools)

    async def main() -> None:
        from choir.mcp.stdio import bounded_stdio

        async with bounded_stdio() as (read, write):  # a request line is bounded
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


__all__ = ["TOOLS", "build", "call_tool", "serve_stdio"]
