"""What a host list costs a step: the egress proxy against the whole network.

    python bench/egress.py [--runs 15] [--requests 50] [--mb 32] [--no-docker]

For each isolating backend (bwrap; docker when an engine answers), three configurations of
the same step, interleaved round by round so the machine's drift hits each alike:

- ``open``: ``network: true`` (the bare equivalent: the host's network, bwrap's
  ``--share-net``; docker's default network), the way a step reached one model API before;
- ``hosts``: ``hosts: [127.0.0.1:PORT]``: its own namespace, the forwarder inside, the proxy
  on the host (the tunnel carries the client that connects to the loopback URL directly);
- ``hosts-proxy``: the same list, the client sending absolute-form requests to HTTP_PROXY.

Three steps are timed: ``start`` (``true``: the forwarder's and the proxy's fixed cost),
``requests`` (N sequential small GETs on fresh connections, timed inside the step: the
per-request latency), and ``bulk`` (one download of ``--mb`` MiB: throughput). The server
runs in this process on 127.0.0.1 (docker's ``open`` row reaches it through the host's
network only with ``--network host``; without a bridge here the row is skipped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from choir.models import Limits
from choir.sandbox import Sandbox, get_sandbox

CLIENT = r'''
import json, os, sys, time, urllib.request
url, n, proxied = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if proxied:
    os.environ.pop("NO_PROXY", None); os.environ.pop("no_proxy", None)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(
        {"http": os.environ["HTTP_PROXY"]}))
else:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
times = []
for _ in range(n):
    start = time.perf_counter()
    size = len(opener.open(url, timeout=30).read())
    times.append(time.perf_counter() - start)
print("RESULT " + json.dumps({"median_ms": sorted(times)[len(times) // 2] * 1000,
                              "total_s": sum(times), "bytes": size}))
'''


def serve(bulk: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            body = bulk if self.path == "/bulk" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def step(sb: Sandbox, repo: Path, out: Path, command: str, *, hosts: tuple[str, ...],
         network: bool) -> tuple[float, dict[str, Any]]:
    chunks: list[bytes] = []
    start = time.perf_counter()
    result = sb.exec(command, repo=repo, out_dir=out, env={}, timeout_s=300, limits=Limits(),
                     network=network, sink=chunks.append, hosts=hosts)
    wall = time.perf_counter() - start
    text = b"".join(chunks).decode(errors="replace")
    assert result.exit_code == 0 and result.infra_error is None, (result, text[-2000:])
    found = [line for line in text.splitlines() if line.startswith("RESULT ")]
    return wall, json.loads(found[0][7:]) if found else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--mb", type=int, default=32)
    parser.add_argument("--no-docker", action="store_true")
    args = parser.parse_args()
    server = serve(b"x" * (args.mb << 20))
    port = server.server_address[1]
    listed = (f"127.0.0.1:{port}",)
    tmp = Path(tempfile.mkdtemp())
    repo, out = tmp / "repo", tmp / "out"
    repo.mkdir()
    repo.chmod(0o755)
    (repo / "client.py").write_text(textwrap.dedent(CLIENT))
    (repo / "client.py").chmod(0o644)
    from choir.sandbox.docker import DockerSandbox

    backends = {"bwrap": get_sandbox("bwrap")}
    if not args.no_docker and DockerSandbox.available():
        backends["docker"] = get_sandbox("docker")
    url = f"http://127.0.0.1:{port}"
    steps = {"start": "true",
             "requests": f"python3 client.py {url}/small {args.requests} {{proxied}}",
             "bulk": f"python3 client.py {url}/bulk 1 {{proxied}}"}
    print(f"{'backend':7} {'step':9} {'config':12} {'wall ms':>8} {'in-step':>14} {'vs open':>8}")
    for backend, sb in backends.items():
        configs: dict[str, Callable[[str], tuple[float, dict[str, Any]]]] = {
            "hosts": lambda c, sb=sb: step(sb, repo, out, c.format(proxied=0), hosts=listed,
                                    network=False),
            "hosts-proxy": lambda c, sb=sb: step(sb, repo, out, c.format(proxied=1), hosts=listed,
                                          network=False),
        }
        if backend == "bwrap":  # docker's default network cannot reach the host's loopback
            configs = {"open": lambda c, sb=sb: step(sb, repo, out, c.format(proxied=0), hosts=(),
                                              network=True), **configs}
        for name, command in steps.items():
            samples: dict[str, list[tuple[float, dict[str, Any]]]] = {c: [] for c in configs}
            for run in configs.values():
                run(command)  # warm-up
            for _ in range(args.runs if name != "bulk" else max(3, args.runs // 3)):
                for config, run in configs.items():
                    samples[config].append(run(command))
            base = statistics.median(w for w, _ in samples.get("open", samples["hosts"]))
            for config, values in samples.items():
                wall = statistics.median(w for w, _ in values) * 1000
                inner = ""
                if name == "requests":
                    inner = f"{statistics.median(r['median_ms'] for _, r in values):.2f} ms/req"
                elif name == "bulk":
                    rate = [r["bytes"] / r["total_s"] / (1 << 20) for _, r in values]
                    inner = f"{statistics.median(rate):.0f} MiB/s"
                print(f"{backend:7} {name:9} {config:12} {wall:8.1f} {inner:>14} "
                      f"{wall / base / 1000:8.2f}x")
        sb.close()
    server.shutdown()


if __name__ == "__main__":
    main()
