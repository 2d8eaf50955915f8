"""``choir.Agent``: a tool-calling loop whose completion is gated by a verifier (docs/concepts.md).

The model finishes by calling ``final_output``. Its arguments are validated into
``output_type`` first (invalid arguments are an invalid model response: the model is told
what was wrong, and no verification attempt is spent). The verifier then passes (its return
value is the output), rejects (one attempt, compact feedback, the model revises), or fails
the run (``FatalAgentError``). A model that resubmits the identical rejected candidate is stopped
after a few tries (``no_progress``, then ``verification_exhausted``); a turn bound ends any
other run whose model never converges.

A tool postcondition that fails is a rejection counted like a rejected final output, and
it also holds the run open: no ``final_output`` is considered (nor verified) until a later
call of that tool passes its postconditions. One sent in the same reply as the failed call
is answered "not considered" (the model had not seen the rejection yet: nothing counted);
one sent on a later turn is an invalid response, so a model that ignores the rejection ends
with ``invalid_responses`` rather than a completed run.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from choir._core.canonical import to_jsonable
from choir._core.terminal import utf8
from choir.agent.context import AgentContext, ExecutionContext
from choir.agent.feedback import one_line
from choir.agent.gate import Gate, GateResult, RetryPolicy, candidate_hash, retryable
from choir.agent.llm import ModelClient, ModelReply, add_usage, as_model
from choir.agent.store import ContextStore
from choir.agent.tools import Tool, as_tools, clip, model_json, validated
from choir.exceptions import FatalAgentError, ToolInputError
from choir.models import Usage

if TYPE_CHECKING:
    from choir.postconditions.agent import Postcondition

FINAL = "final_output"
TRANSIENT = "transient"  # a model_error's detail when the last fault was worth a retry
_BLAST_RADIUS: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "choir_agent_blast_radius", default=None)
MAX_ERROR_CHARS = 1_500


@dataclass(frozen=True)
class AgentEvent:
    """One thing that happened in a run; ``name`` is stable, ``data`` is small."""

    name: str
    turn: int
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentResult:
    """What ``Agent.run`` returns.

    Attributes:
        status: ``"completed"`` or ``"failed"``.
        output: the verifier's return value, or the validated output without a verifier.
        events: event names in order (this invocation's).
        context: the final AgentContext (``.verification.attempts_used``, ``.usage``).
        error: why a failed run failed: ``verification_exhausted``, ``fatal``,
            ``turn_limit``, ``invalid_responses``, ``model_error`` or ``system_error``.
        message: one bounded line about the failure.
    """

    status: Literal["completed", "failed"]
    output: Any
    events: tuple[str, ...]
    context: AgentContext
    error: str | None = None
    message: str = ""
    event_log: tuple[AgentEvent, ...] = ()

    @property
    def usage(self) -> Usage:
        return self.context.usage


class _Done(Exception):
    """The run ended. The context keeps the JSON form of the output; ``value`` is live."""

    def __init__(self, ctx: AgentContext, value: Any = None) -> None:
        self.ctx = ctx.model_copy(update={"output": to_jsonable(ctx.output)})
        self.value = ctx.output if value is None else value


def _final_model(output_type: Any) -> tuple[type[BaseModel], bool]:
    """The argument model of ``final_output`` and whether the output is wrapped in it."""
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        return output_type, False
    wrapped = create_model("final_output_args", __config__=ConfigDict(extra="forbid"),
                           output=(output_type, ...))
    return wrapped, True


class Agent:
    """A model with tools, an output type and an optional verifier.

    Args:
        instructions: the system prompt.
        model: a litellm model name, or any ``ModelClient`` (``choir.testing.FakeModel``).
        tools: functions (or ``Tool``s); ``agent_ctx`` / ``execution_ctx`` are injected.
        output_type: what ``final_output`` must carry (a pydantic model or any type).
        verifier: ``verifier(output, [agent_ctx], [execution_ctx])``, sync or async.
        verifier_max_attempts: rejections allowed before ``verification_exhausted``.
        max_turns: model calls allowed in a run.
        max_invalid_responses: unusable replies allowed (bad arguments, unknown tools).
        max_identical_rejections: times the identical candidate may be rejected in a row
            before the run ends with ``no_progress`` and ``verification_exhausted``.
        retry: retries for system errors (model transport, verifier crashes).
        model_settings: passed to litellm (``api_base``, ``temperature``, ...).
        postconditions: per tool name, ``choir.postconditions.agent.Postcondition``s run
            after each successful call; a fail or inconclusive is a rejection (one attempt)
            and holds the run open until a later call of that tool passes them.
    """

    def __init__(self, instructions: str = "", model: str | ModelClient | None = None,
                 tools: Iterable[Tool | Callable[..., Any]] = (), output_type: Any = str,
                 verifier: Callable[..., Any] | None = None, verifier_max_attempts: int = 3,
                 *, max_turns: int = 40, max_invalid_responses: int = 3,
                 max_identical_rejections: int = 3,
                 retry: RetryPolicy | None = None, model_settings: dict[str, Any] | None = None,
                 name: str = "agent",
                 postconditions: Mapping[str, Sequence[Postcondition]] | None = None) -> None:
        if model is None:
            raise ValueError("Agent needs a model: a litellm name or a ModelClient")
        if verifier_max_attempts < 1 or max_turns < 1:
            raise ValueError("verifier_max_attempts and max_turns must be at least 1")
        self.name = name
        self.instructions = instructions
        self.model = as_model(model, model_settings)
        self.tools = as_tools(tools)
        self.output_type = output_type if output_type is not None else str
        self.final_args, self._wrapped = _final_model(self.output_type)
        self.retry = retry or RetryPolicy()
        if max_identical_rejections < 2:
            raise ValueError("max_identical_rejections must be at least 2")
        self.gate = (Gate(verifier, verifier_max_attempts, self.retry,
                          max_repeats=max_identical_rejections)
                     if verifier is not None else None)
        self.verifier_max_attempts = verifier_max_attempts
        self.max_turns = max_turns
        self.max_invalid_responses = max_invalid_responses
        self.postconditions = {k: tuple(v) for k, v in (postconditions or {}).items()}
        unknown = sorted(set(self.postconditions) - set(self.tools))
        if unknown:
            raise ValueError(f"postconditions name unknown tools: {', '.join(unknown)}; "
                             f"tools: {', '.join(self.tools) or 'none'}")

    # -- schema -----------------------------------------------------------------------
    def tool_schemas(self) -> list[dict[str, Any]]:
        params = self.final_args.model_json_schema()
        params.pop("title", None)
        final = {"type": "function", "function": {
            "name": FINAL, "parameters": params,
            "description": "Submit your final answer. It is validated"
                           + (" and verified" if self.gate else "") + " before it counts."}}
        return [*(t.schema() for t in self.tools.values()), final]

    # -- running ----------------------------------------------------------------------
    def run_sync(self, query: str, **kwargs: Any) -> AgentResult:
        """``run`` for synchronous callers (not from inside a running event loop)."""
        return asyncio.run(self.run(query, **kwargs))

    async def run(self, query: str, *, run_id: str | None = None,
                  store: ContextStore | None = None, deps: Any = None,
                  on_event: Callable[[AgentEvent], None] | None = None,
                  blast_radius: str | None = None) -> AgentResult:
        """Run until the output is accepted or the run fails; resumes a stored run.

        With ``store`` and ``run_id``, the context is saved after every step, and a run
        that already exists continues where it stopped (a finished one returns at once).
        ``blast_radius`` (small, medium, large; default large) decides which tool
        postconditions are required: those whose threshold it is above.
        """
        token = _BLAST_RADIUS.set(blast_radius)  # per run, also for concurrent runs
        try:
            return await self._run(query, run_id=run_id, store=store, deps=deps,
                                   on_event=on_event)
        finally:
            _BLAST_RADIUS.reset(token)

    async def _run(self, query: str, *, run_id: str | None, store: ContextStore | None,
                   deps: Any, on_event: Callable[[AgentEvent], None] | None) -> AgentResult:
        run_id = run_id or f"{self.name}-{secrets.token_hex(6)}"
        log: list[AgentEvent] = []
        output: Any = None
        ctx = store.load(run_id) if store is not None else None
        if ctx is None:
            messages: list[dict[str, Any]] = []
            if self.instructions:
                messages.append({"role": "system", "content": self.instructions})
            messages.append({"role": "user", "content": query})
            ctx = AgentContext(query=query, messages=tuple(messages))

        def emit(name: str, data: dict[str, Any] | None = None) -> None:
            event = AgentEvent(name, ctx.turn if ctx else 0, dict(data or {}))
            log.append(event)
            if on_event is not None:
                on_event(event)

        exec_ctx = ExecutionContext(run_id=run_id, deps=deps,
                                    emit=lambda n, d: emit(n, d))

        def save(new: AgentContext) -> AgentContext:
            if store is not None:
                store.save(run_id, new)
            return new

        if ctx.status == "running":
            emit("run_started" if not ctx.turn else "run_resumed")
            try:
                while True:
                    ctx = save(await self._step(ctx, exec_ctx, emit))
            except _Done as done:
                ctx, output = save(done.ctx), done.value
        else:
            output = ctx.output
        emit("run_completed" if ctx.status == "completed" else "run_failed",
             {"error": ctx.error} if ctx.error else {})
        code = ctx.error.split(":", 1)[0] if ctx.error else None
        return AgentResult(status="completed" if ctx.status == "completed" else "failed",
                           output=output, events=tuple(e.name for e in log), context=ctx,
                           error=code, message=ctx.error or "", event_log=tuple(log))

    async def _step(self, ctx: AgentContext, exec_ctx: ExecutionContext,
                    emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext:
        """One model call, or the answers to the tool calls it left pending."""
        pending = ctx.pending_tool_calls()
        if pending:
            return await self._answer(ctx, pending, exec_ctx, emit)
        if ctx.turn >= self.max_turns:
            emit("turn_limit", {"max_turns": self.max_turns})
            raise _Done(self._fail(ctx, "turn_limit"))
        emit("turn_started", {"turn": ctx.turn + 1})
        reply = await self._complete(ctx, emit)
        ctx = ctx.with_messages(reply.as_message(), turn=ctx.turn + 1,
                                usage=add_usage(ctx.usage, reply.usage))
        if reply.tool_calls:
            return ctx  # saved before any side effect, so a crash never re-asks the model
        if self._wrapped and self.output_type is str and (reply.content or "").strip():
            # as saved in the messages: a lone surrogate failed the durable save (review 20b)
            return await self._finish(ctx, utf8(reply.content or ""), None, exec_ctx, emit)
        return self._invalid(ctx, None, f"Reply with tool calls; finish by calling {FINAL}.",
                             emit)

    async def _complete(self, ctx: AgentContext,
                        emit: Callable[[str, dict[str, Any] | None], None]) -> ModelReply:
        for retry in range(self.retry.max_retries + 1):
            try:
                return await self.model.complete(list(ctx.messages), self.tool_schemas())
            except Exception as exc:  # noqa: BLE001 - transport faults are retried, bounded
                emit("model_error", {"error": one_line(f"{type(exc).__name__}: {exc}")})
                if retry >= self.retry.max_retries or not retryable(exc):
                    # the detail says whether it was an outage (a retry might have worked)
                    # or a refusal (a bad request, a key refused): the caller decides on it
                    kind = TRANSIENT if retryable(exc) else "refused"
                    raise _Done(self._fail(ctx, "model_error", f"{kind}: " + one_line(
                        f"{type(exc).__name__}: {exc}"))) from exc
                await asyncio.sleep(self.retry.delay(retry))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _answer(self, ctx: AgentContext, calls: Sequence[dict[str, Any]],
                      exec_ctx: ExecutionContext,
                      emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext:
        ordered = sorted(calls, key=lambda c: c.get("function", {}).get("name") == FINAL)
        for call in ordered:
            fn = call.get("function", {})
            name, arguments = str(fn.get("name", "")), fn.get("arguments") or "{}"
            if name == FINAL:
                if len(ordered) > 1 and call is not ordered[-1]:
                    ctx = self._tool_reply(ctx, call, f"Only one {FINAL} call counts.")
                    continue
                return await self._final(ctx, call, arguments, exec_ctx, emit)
            ctx = await self._run_tool(ctx, call, name, arguments, exec_ctx, emit)
        return ctx

    @staticmethod
    def _tool_reply(ctx: AgentContext, call: dict[str, Any], content: str) -> AgentContext:
        return ctx.with_messages({"role": "tool", "tool_call_id": call.get("id"),
                                  "content": content})

    async def _run_tool(self, ctx: AgentContext, call: dict[str, Any], name: str,
                        arguments: Any, exec_ctx: ExecutionContext,
                        emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext:
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join([*self.tools, FINAL])
            return self._invalid(ctx, call, f"Unknown tool {one_line(name, 64)!r}; "
                                            f"available: {known}.", emit)
        try:
            args = tool.validate(arguments)
        except (ValueError, ValidationError) as exc:
            return self._invalid(ctx, call, f"Invalid arguments for {name}: "
                                            f"{clip(str(exc), MAX_ERROR_CHARS)}", emit)
        emit("tool_called", {"tool": name})
        try:
            content = await tool.call(args, ctx, exec_ctx)
        except FatalAgentError as exc:
            emit("tool_fatal", {"tool": name})
            raise _Done(self._fail(self._tool_reply(ctx, call, "fatal"), "fatal",
                                   one_line(str(exc)))) from exc
        except ToolInputError as exc:
            emit("tool_error", {"tool": name})
            content = f"Error: {clip(str(exc), MAX_ERROR_CHARS)}"
        except Exception as exc:  # noqa: BLE001 - the model is told, the run goes on
            emit("tool_error", {"tool": name, "error": type(exc).__name__})
            content = f"Error: the tool failed ({type(exc).__name__}: {one_line(str(exc))})"
        else:
            if self.postconditions.get(name):
                return await self._postconditions(ctx, call, name, args, content, emit)
        return self._tool_reply(ctx, call, content)

    async def _postconditions(self, ctx: AgentContext, call: dict[str, Any], name: str,
                              args: BaseModel, content: str,
                              emit: Callable[[str, dict[str, Any] | None], None]
                              ) -> AgentContext:
        """The tool mutated state: check its effect. A fail or inconclusive is a rejection
        (the Agent's rejection block, one attempt, same accounting as a rejected final output)."""
        from choir.agent.feedback import rejection_feedback

        action = {"tool": name, **args.model_dump(mode="json")}
        context = {"action": action, "tool_result": content[:4000]}
        radius = _BLAST_RADIUS.get()
        for check in self.postconditions[name]:
            if not check.required(radius):
                continue
            result = await asyncio.to_thread(check.check, context)
            emit("postcondition_" + result.outcome,
                 {"tool": name, "postcondition": check.name, "severity": result.severity})
            if result.outcome == "pass":
                continue
            emit("drift", {"signal": "verify", "severity": result.severity,
                           "postcondition": check.name, "detail": one_line(result.detail)})
            state = Gate._count(ctx.verification, candidate_hash(action), ctx.turn)
            state = state.model_copy(update={"unresolved": {**state.unresolved,
                                                            name: ctx.turn}})
            ctx = ctx.model_copy(update={"verification": state,
                                         "attempt": state.attempts_used})
            stuck = state.repeats >= (self.gate.max_repeats if self.gate else 3)
            feedback = rejection_feedback(
                f"postcondition {check.name} {result.outcome} after {name}: {result.detail}",
                f"postcondition_{result.outcome}",
                {"tool": name, "severity": result.severity,
                 "before_final_output": f"call {name} again until its postconditions pass"},
                attempts_used=state.attempts_used, max_attempts=self.verifier_max_attempts,
                repeats=state.repeats)
            emit("verification_rejected", {"attempts_used": state.attempts_used})
            ctx = self._tool_reply(ctx, call, f"{content}\n{feedback}")
            if stuck or state.attempts_used >= self.verifier_max_attempts:
                emit("verification_exhausted", {"attempts_used": state.attempts_used})
                raise _Done(self._fail(ctx, "verification_exhausted"))
            return ctx
        if name in ctx.verification.unresolved:  # this tool's effect checks out now
            rest = {k: v for k, v in ctx.verification.unresolved.items() if k != name}
            ctx = ctx.model_copy(update={
                "verification": ctx.verification.model_copy(update={"unresolved": rest})})
        return self._tool_reply(ctx, call, content)

    def _unresolved(self, ctx: AgentContext, call: dict[str, Any] | None,
                    emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext | None:
        """The answer to a final output sent while a tool's postcondition is unresolved
        (None when every failed one has passed since). Not verified, never completing."""
        open_ = ctx.verification.unresolved
        if not open_:
            return None
        tools = ", ".join(sorted(open_))
        emit("final_output_refused", {"unresolved": sorted(open_)})
        if ctx.turn in open_.values():  # the model has not read the rejection yet
            text = (f"Not considered: a postcondition of an earlier call in this reply "
                    f"failed ({tools}); read its rejection and revise first.")
            return (self._tool_reply(ctx, call, text) if call is not None
                    else ctx.with_messages({"role": "user", "content": text}))
        return self._invalid(ctx, call, f"Not considered: a postcondition of {tools} failed "
                                        f"and has not passed since; call {tools} again until "
                                        f"its postconditions pass, then call {FINAL}.", emit)

    def _invalid(self, ctx: AgentContext, call: dict[str, Any] | None, text: str,
                 emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext:
        emit("invalid_model_response", {"reason": one_line(text)})
        count = ctx.invalid_responses + 1
        if call is not None:
            ctx = self._tool_reply(ctx, call, text)
        else:
            ctx = ctx.with_messages({"role": "user", "content": text})
        ctx = ctx.model_copy(update={"invalid_responses": count})
        if count > self.max_invalid_responses:
            raise _Done(self._fail(ctx, "invalid_responses"))
        return ctx

    async def _final(self, ctx: AgentContext, call: dict[str, Any], arguments: Any,
                     exec_ctx: ExecutionContext,
                     emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext:
        try:
            parsed = validated(self.final_args, model_json(arguments))
            candidate = cast(Any, parsed).output if self._wrapped else parsed
            candidate_hash(candidate)  # a value no JSON holds ("inf" made a float) is no output
        except (ValueError, ValidationError) as exc:
            return self._invalid(ctx, call, f"Invalid {FINAL} arguments: "
                                            f"{clip(str(exc), MAX_ERROR_CHARS)}", emit)
        return await self._finish(ctx, candidate, call, exec_ctx, emit)

    async def _finish(self, ctx: AgentContext, candidate: Any, call: dict[str, Any] | None,
                      exec_ctx: ExecutionContext,
                      emit: Callable[[str, dict[str, Any] | None], None]) -> AgentContext:
        refused = self._unresolved(ctx, call, emit)
        if refused is not None:
            return refused
        if self.gate is None:
            done = ctx if call is None else self._tool_reply(ctx, call, "accepted")
            raise _Done(done.model_copy(update={"output": candidate, "status": "completed"}))
        result: GateResult = await self.gate.check(candidate, ctx, exec_ctx)
        ctx = ctx.model_copy(update={"verification": result.state,
                                     "attempt": result.state.attempts_used})
        state = {"attempts_used": result.state.attempts_used}
        if result.kind == "passed":
            emit("verification_passed", state)
            done = ctx if call is None else self._tool_reply(ctx, call, "accepted")
            raise _Done(done.model_copy(update={"output": result.output,
                                                "status": "completed"}))
        if result.kind in ("rejected", "exhausted"):
            emit("verification_rejected", state)
            ctx = (ctx.with_messages({"role": "user", "content": result.feedback})
                   if call is None else self._tool_reply(ctx, call, result.feedback))
            if result.kind == "exhausted":
                if result.no_progress:
                    emit("no_progress", {**state, "repeats": result.state.repeats})
                emit("verification_exhausted", state)
                raise _Done(self._fail(ctx, "verification_exhausted"))
            return ctx
        emit("verification_error" if result.kind == "system_error" else "verification_fatal",
             {"error": result.error})
        raise _Done(self._fail(ctx, "fatal" if result.kind == "fatal" else "system_error",
                               result.error))

    @staticmethod
    def _fail(ctx: AgentContext, error: str, detail: str = "") -> AgentContext:
        return ctx.model_copy(update={"status": "failed",
                                      "error": f"{error}: {detail}" if detail else error})
