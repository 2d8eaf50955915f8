"""The process that runs one postcondition inside the sandbox. Standard library only.

It runs under the project's interpreter, where Choir itself may not be installed, so it
imports nothing from Choir: the host passes this file's source in ``CHOIR_PC_HARNESS`` and
the step runs ``python3 -I -B -c 'exec(...)'`` (isolated: nothing is imported from the
tree until the child loads the check). The spec (what to check, against which
resource, with which timeout) comes in ``CHOIR_PC_SPEC``, the run's context (work item,
action) in ``CHOIR_PC_CONTEXT``.

Two processes, so the verdict never comes from the code being trusted for it:

* the parent (this harness, alone in its process) starts a child in its own session with
  one pipe, gives it ``START_S`` to start and then at most ``timeout_s`` from its first
  byte (the check's window), kills the child's whole group, and exits 0 (pass), 1 (fail)
  or 3 (inconclusive). The exit code is the verdict the host reads; it is decided after
  the child is dead, so nothing the child prints or writes can change it.
* the child loads the callable, calls it (awaiting it when it is a coroutine function),
  and sends one JSON result on the pipe. A raise, an exit without a result, two results,
  a malformed result, a crash or a hang are all INCONCLUSIVE.

``$CHOIR_OUT/postcondition.json`` and the last stdout line are written by the parent for
people and for the report's detail; the host never takes the verdict from them.

Its polling loops (an invariant retried until its deadline) are written by hand on purpose:
Choir's own retries use tenacity, but this file runs where only the standard library is.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
EXIT = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}
SEVERITY = {PASS: None, FAIL: "yellow", INCONCLUSIVE: "red"}
DETAIL_MAX = 1000
RESULT_MAX = 64 * 1024
# the child's interpreter start (stdlib imports, before the check begins) has an allowance
# of its own: on a loaded machine it took seconds, and the check's window must not pay for it
START_S = 20.0
BEGIN = b"\n"  # the child's first byte: the check begins, its window opens
BOOTSTRAP = ('import os; exec(compile(os.environ["CHOIR_PC_HARNESS"], '
             '"choir-postcondition", "exec"))')
# isolated (``-I``): neither the working directory (the tree being verified) nor
# ``PYTHONPATH`` is on the path while the harness imports its own modules, so a ``json.pyc``
# planted in the tree never runs in the process that decides the verdict; the child puts
# them back (``_load``) only once the harness is loaded, to import the check
ARGV = ("-I", "-B", "-c", BOOTSTRAP)


class _NotVisible(Exception):
    """The target could not be read (absent, unreachable, hung): no evidence either way."""


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


# ---- resources: only those declared in choir.yaml, reached the declared way -------------

def _sqlite_value(resource: dict[str, Any], sql: str, params: dict[str, Any],
                  timeout: float) -> Any:
    """The first column of the first row (``_NotVisible`` when there is no row)."""
    uri = "file:" + urllib.parse.quote(resource["path"]) + "?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True, timeout=max(timeout, 0.01))
    except sqlite3.Error as exc:
        raise _NotVisible(f"cannot open {resource['path']}: {exc}") from None
    try:
        row = con.execute(sql, params).fetchone()
    except sqlite3.OperationalError as exc:
        raise _NotVisible(f"query failed: {exc}") from None
    finally:
        con.close()
    if row is None:
        raise _NotVisible("no row")
    return row[0]


def _postgres_value(resource: dict[str, Any], sql: str, params: dict[str, Any],
                    timeout: float) -> Any:
    try:
        import psycopg  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise _NotVisible("psycopg is not installed in the project's interpreter: "
                          "pip install 'psycopg[binary]'") from None
    try:
        with psycopg.connect(resource["dsn"], connect_timeout=max(1, int(timeout)),
                             **egress_tunnel(resource["dsn"])) as con:
            row = con.execute(sql, params).fetchone()
    except psycopg.Error as exc:
        raise _NotVisible(f"query failed: {type(exc).__name__}") from None
    if row is None:
        raise _NotVisible("no row")
    return row[0]


def egress_tunnel(dsn: str) -> dict[str, Any]:
    """libpq's ``hostaddr``/``port`` for the sandbox's tunnel to the DSN's host, if any.

    Under a host list there is no DNS and Postgres speaks no HTTP proxy: the forwarder
    listens on a loopback port per listed endpoint (``CHOIR_EGRESS_TUNNELS``). ``hostaddr``
    connects there while ``host`` stays the DSN's, for TLS verification and authentication.
    """
    tunnels = json.loads(os.environ.get("CHOIR_EGRESS_TUNNELS") or "{}")
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql") or not parts.hostname:
        return {}
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    where = tunnels.get(f"{host}:{parts.port or 5432}")
    if not isinstance(where, str) or ":" not in where:
        return {}
    address, port = where.rsplit(":", 1)
    return {"hostaddr": address, "port": int(port)}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect could leave the allowlisted base URL


def _http_get(resource: dict[str, Any], path: str, timeout: float) -> tuple[int, bytes]:
    """GET ``path`` under the resource's base URL (never another host); status and body."""
    if "://" in path or path.startswith("//"):
        raise ValueError(f"path '{path}' must be relative to the resource's base URL")
    url = resource["base_url"].rstrip("/") + "/" + path.lstrip("/")
    # the sandbox's egress proxy when the verifier has a host list (HTTP_PROXY is set then)
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler())
    try:
        with opener.open(url, timeout=max(timeout, 0.01)) as resp:
            return int(resp.status), resp.read(RESULT_MAX)
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, urllib.error.URLError) as exc:  # refused, reset, timed out
        raise _NotVisible(f"GET {url}: {getattr(exc, 'reason', exc)}") from None


def _fill(template: str, action: dict[str, Any]) -> str:
    """``{name}`` placeholders from the action, URL-quoted (values never become a path)."""
    return template.format_map({k: urllib.parse.quote(str(v), safe="") for k, v in
                                action.items()})


def _read(spec: dict[str, Any], action: dict[str, Any], timeout: float) -> Any:
    resource = spec["resource"]
    params = {**spec.get("params", {}), **action}  # named SQL parameters, never spliced
    if resource["kind"] == "sqlite":
        return _sqlite_value(resource, spec["sql"], params, timeout)
    if resource["kind"] == "postgres":
        return _postgres_value(resource, spec["sql"], params, timeout)
    status, body = _http_get(resource, _fill(spec["path"], params), timeout)
    if status == 404:
        raise _NotVisible("404 Not Found")
    field = spec.get("field")
    if field is None:
        return status
    try:
        data = json.loads(body)
    except ValueError:
        raise _NotVisible(f"HTTP {status}: body is not JSON") from None
    for key in str(field).split("."):
        if not isinstance(data, dict) or key not in data:
            raise _NotVisible(f"HTTP {status}: no field '{field}'")
        data = data[key]
    return data


def _expected(spec: dict[str, Any], action: dict[str, Any]) -> Any:
    key = spec.get("expect_from")
    if key is None:
        return spec.get("expect")
    if key not in action:
        raise KeyError(f"the action has no '{key}' (expect_from)")
    return action[key]


def _same(got: Any, want: Any) -> bool:
    return bool(got == want or str(got) == str(want))


def read_after_write(spec: dict[str, Any], context: dict[str, Any]) -> tuple[str, str]:
    """Re-read the target until it shows the expected value, polling with backoff.

    Within ``verify_timeout_ms``: the expected value read back is PASS; a different value
    read back at the deadline is FAIL (the write was lost or overwritten: drift yellow);
    no answer at all (no row, 404, unreachable, hung) is INCONCLUSIVE (drift red).
    """
    action = context.get("action") or {}
    want = _expected(spec, action)
    budget = spec["verify_timeout_ms"] / 1000
    deadline = time.monotonic() + budget
    last: tuple[bool, Any] | None = None
    why = "not read"
    delay = 0.02
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            got = _read(spec, action, left)
            if _same(got, want):
                return PASS, f"read back {got!r} as expected"
            last = (True, got)
        except _NotVisible as exc:
            why = str(exc)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.5)
    ms = spec["verify_timeout_ms"]
    if last is not None:
        return FAIL, f"read back {last[1]!r}, expected {want!r} (within {ms} ms)"
    return INCONCLUSIVE, f"the write was not visible within {ms} ms: {why}"


def invariant_check(spec: dict[str, Any], context: dict[str, Any]) -> tuple[str, str]:
    """Evaluate a boolean over system state: True is PASS, False FAIL (yellow), no answer
    within ``verify_timeout_ms`` INCONCLUSIVE (red). Transient errors are retried."""
    action = context.get("action") or {}
    deadline = time.monotonic() + spec["verify_timeout_ms"] / 1000
    why = "not evaluated"
    delay = 0.02
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            if "status" in spec:
                got = _read({**spec, "field": None}, action, left)
                ok, seen = got == spec["status"], f"HTTP {got}"
            else:
                got = _read(spec, action, left)
                ok, seen = bool(got), repr(got)
            if ok:
                return PASS, f"invariant holds ({seen})"
            return FAIL, f"invariant broken: {spec.get('sql') or spec.get('path')} gave {seen}"
        except _NotVisible as exc:
            why = str(exc)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.5)
    return INCONCLUSIVE, f"no answer within {spec['verify_timeout_ms']} ms: {why}"


SCAFFOLDS = {"read_after_write": read_after_write, "invariant_check": invariant_check}


# ---- the child: load the callable, call it, send one result ----------------------------

def _load(ref: str) -> Any:
    """``verifiers/x.py`` (function ``verify``), ``verifiers/x.py:fn`` or ``module:function``."""
    import importlib
    import importlib.util

    path, _, name = ref.partition(":") if ref.split(":")[0].endswith(".py") else (ref, "", "")
    # what ``python3 -c`` would have put first, now that the harness's own imports are done:
    # the check imports the code under test from the tree
    extra = [os.getcwd(), *(os.path.abspath(p) for p in
                            os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    sys.path[:0] = [p for p in extra if p not in sys.path]
    if path.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("choir_verifier", path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return getattr(module, name or "verify")
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _call(fn: Any, context: dict[str, Any]) -> Any:
    """Signature inspection decides: a parameter gets the context; a coroutine is awaited."""
    takes = bool(inspect.signature(fn).parameters)
    value = fn(context) if takes else fn()
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value
        value = asyncio.run(wait())
    return value


def _normalise(value: Any) -> dict[str, str]:
    if isinstance(value, bool):
        return {"outcome": PASS if value else FAIL, "detail": ""}
    if isinstance(value, dict):
        outcome, detail = value.get("outcome"), value.get("detail", "")
    else:
        outcome, detail = getattr(value, "outcome", None), getattr(value, "detail", "")
    outcome = getattr(outcome, "value", outcome)
    if outcome not in EXIT:
        return {"outcome": INCONCLUSIVE,
                "detail": f"the verifier returned {type(value).__name__}, not a "
                          "VerificationResult with outcome pass|fail|inconclusive"}
    return {"outcome": str(outcome), "detail": _clip(str(detail or ""))}


def child(spec: dict[str, Any], context: dict[str, Any]) -> None:
    fd = int(os.environ.pop("CHOIR_PC_FD"))
    os.write(fd, BEGIN)
    try:
        if spec["method"] in SCAFFOLDS:
            if spec.get("callable"):
                value: Any = _call(_load(spec["callable"]), context)
                if isinstance(value, bool):  # only a bool is one: a verdict is read as one
                    value = {"outcome": PASS if value else FAIL,
                             "detail": f"invariant {spec['callable']} returned {value!r}"}
            else:
                outcome, detail = SCAFFOLDS[spec["method"]](spec, context)
                value = {"outcome": outcome, "detail": detail}
        else:
            value = _call(_load(spec["callable"]), context)
        result = _normalise(value)
    except BaseException as exc:  # noqa: BLE001 - any raise is no evidence either way
        result = {"error": _clip(f"{type(exc).__name__}: {exc}")}
    with os.fdopen(fd, "w") as pipe:
        pipe.write(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


# ---- the parent: time, kill, decide -----------------------------------------------------

def _collect(proc: subprocess.Popen[bytes], fd: int, timeout: float) -> tuple[bytes, bool]:
    """Everything the child sends before it exits or its time is up: ``START_S`` for its
    interpreter to start (until its first byte), then ``timeout`` for the check. The
    deadline is set once, at that first byte: nothing the check sends extends it."""
    deadline = time.monotonic() + START_S
    data = b""
    open_ = True
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, True
        if open_:
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    if not data:
                        deadline = time.monotonic() + timeout
                    data += chunk
                    if len(data) > RESULT_MAX:
                        return data, False
                    continue
                open_ = False
        if proc.poll() is not None and not open_:
            return data, False
        if not open_:
            time.sleep(min(left, 0.02))


def _verdict(proc: subprocess.Popen[bytes], data: bytes, timed_out: bool,
             timeout: float) -> tuple[str, str]:
    if timed_out and not data:
        return INCONCLUSIVE, f"the verifier's interpreter did not start within {START_S:g} s"
    if timed_out:
        return INCONCLUSIVE, f"the verifier did not finish within {timeout:g} s"
    if proc.returncode != 0:
        return INCONCLUSIVE, f"the verifier process died (exit {proc.returncode})"
    data = data.removeprefix(BEGIN)
    try:
        result = json.loads(data.decode("utf-8"))
    except ValueError:
        return INCONCLUSIVE, ("the verifier sent no result" if not data else
                              "the verifier sent a malformed result")
    if not isinstance(result, dict):
        return INCONCLUSIVE, "the verifier sent a malformed result"
    if "error" in result:
        return INCONCLUSIVE, f"the verifier raised {str(result['error'])[:DETAIL_MAX]}"
    outcome = result.get("outcome")
    if outcome not in EXIT or set(result) != {"outcome", "detail"}:
        return INCONCLUSIVE, "the verifier sent a malformed result"
    return str(outcome), _clip(str(result.get("detail", "")))


def _protect_self() -> None:
    """Make this process non-dumpable: a process of the same user (the verifier, which runs
    as the same sandbox user) can then neither ptrace it nor write its memory through
    /proc/PID/mem, so it cannot rewrite the verdict this process is about to exit with.
    Measured in bwrap and docker: without it the child opened the parent's mem read-write."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def parent(spec: dict[str, Any]) -> int:
    started = time.monotonic()
    _protect_self()
    timeout = float(spec["timeout_s"])
    read_fd, write_fd = os.pipe()
    env = {**os.environ, "CHOIR_PC_FD": str(write_fd)}
    proc = subprocess.Popen([sys.executable, *ARGV, "--child"],
                            env=env, pass_fds=(write_fd,), start_new_session=True)
    os.close(write_fd)
    try:
        data, timed_out = _collect(proc, read_fd, timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        os.close(read_fd)
    outcome, detail = _verdict(proc, data, timed_out, timeout)
    record = {"verifier": spec["name"], "method": spec["method"], "outcome": outcome,
              "severity": SEVERITY[outcome], "detail": detail,
              "hosts": spec.get("hosts", []),
              "duration_ms": int((time.monotonic() - started) * 1000)}
    out = os.environ.get("CHOIR_OUT")
    if out:
        path = os.path.join(out, "postcondition.json")
        try:
            os.unlink(path)  # whatever the child left there is not the record
        except OSError:
            pass
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(record, fh, sort_keys=True)
    sys.stdout.write(f"\n[choir] postcondition {spec['name']}: {outcome.upper()}: {detail}\n")
    sys.stdout.flush()
    return EXIT[outcome]


def main() -> None:
    spec = json.loads(os.environ["CHOIR_PC_SPEC"])
    context = json.loads(os.environ.get("CHOIR_PC_CONTEXT") or "{}")
    context.setdefault("verifier", spec["name"])
    context.setdefault("resources", spec.get("resources", {}))
    context.setdefault("action", {})
    if "--child" in sys.argv[1:]:
        child(spec, context)
    sys.exit(parent(spec))


if __name__ == "__main__":
    main()
