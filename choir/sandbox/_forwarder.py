"""Inside the sandbox: the step's way to Choir's egress proxy, then the step itself.

Run as ``python3 -I -S -c SOURCE SOCKET TUNNELS COMMAND...`` (stdlib only, no site: it must
work with any Python in any image). It listens on ``127.0.0.1`` (an ephemeral port) and
relays every connection to the proxy's Unix socket, sets ``HTTP(S)_PROXY`` to that port for
the command, starts the command and exits with its status. ``TUNNELS`` (JSON) lists
``[address, port, "host:port"]``: a listener on that loopback address and port (0: any)
that opens a ``CONNECT`` to the listed endpoint for each connection. A listed loopback
endpoint gets its own address and port, so a client that never proxies loopback (Go's, for
one) still reaches a listed ``127.0.0.1:PORT`` server; any other gets a free port, named in
``CHOIR_EGRESS_TUNNELS`` for clients that speak no HTTP proxy (Postgres).

Nothing here is a security boundary: the step may kill it or talk to the socket itself.
The proxy on the host decides everything.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

LOOPBACK = "127.0.0.1"


def _relay(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        try:
            sock.shutdown(how)
        except OSError:
            pass


def _carry(client: socket.socket, path: str, target: str | None) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        if target:
            upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = upstream.recv(4096)
                if not data:
                    break
                head += data
            line = head.split(b"\r\n", 1)[0]
            status = line.split(b" ")
            if len(status) < 2 or status[1] != b"200":
                sys.stderr.write(f"[choir egress] {target}: {line.decode('latin-1')}\n")
                return
            rest = head.split(b"\r\n\r\n", 1)[1]
            if rest:
                client.sendall(rest)
        back = threading.Thread(target=_relay, args=(upstream, client), daemon=True)
        back.start()
        _relay(client, upstream)
        back.join()
    except OSError as exc:
        sys.stderr.write(f"[choir egress] the proxy is out of reach: {exc}\n")
    finally:
        upstream.close()
        client.close()


def _listen(address: str, port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(64)
    return server


def _serve(server: socket.socket, path: str, target: str | None) -> None:
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_carry, args=(client, path, target), daemon=True).start()


def main(argv: list[str]) -> None:
    path, tunnels, command = argv[0], json.loads(argv[1]), argv[2:]
    proxy = _listen(LOOPBACK, 0)
    url = f"http://{LOOPBACK}:{proxy.getsockname()[1]}"
    threading.Thread(target=_serve, args=(proxy, path, None), daemon=True).start()
    opened = {}
    for address, port, target in tunnels:
        try:
            server = _listen(address, port)
        except OSError as exc:
            sys.stderr.write(f"[choir egress] no tunnel to {target} on {address}:{port}: "
                             f"{exc}\n")
            continue
        opened[target] = f"{address}:{server.getsockname()[1]}"
        threading.Thread(target=_serve, args=(server, path, target), daemon=True).start()
    env = dict(os.environ)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = url
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = "localhost,127.0.0.1,::1"
    env.pop("ALL_PROXY", None)
    env.pop("all_proxy", None)
    env["NODE_USE_ENV_PROXY"] = "1"  # Node's own fetch reads the variables only when asked
    env["CHOIR_EGRESS_PROXY"] = url
    env["CHOIR_EGRESS_TUNNELS"] = json.dumps(opened)  # endpoint -> the local address to use
    child = subprocess.Popen(command, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    sys.stdout.flush()
    os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main(sys.argv[1:])
