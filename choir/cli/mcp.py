"""``choir mcp``: the MCP server an agent calls to verify its work (``choir.mcp``)."""

from __future__ import annotations

from pathlib import Path

import click

from choir.cli._errors import EXIT_OK


@click.command()
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio",
              show_default=True, help="stdio (the client starts this command) or streamable "
              "HTTP on 127.0.0.1.")
@click.option("--repo", "repos", type=click.Path(path_type=Path), multiple=True,
              help="A repo the tools may verify (repeatable; default: the current directory). "
                   "Its choir.yaml is pinned now.")
@click.option("--sandbox", "sandbox_name", default=None,
              help="docker | bwrap | local | auto (default: choir.yaml, else auto).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="With --transport http: the port on 127.0.0.1 (0: a free one).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 86400), default=900,
              show_default=True, help="Seconds one verification may take; then its "
                                      "sandboxes are stopped and it ends FAIL, saying so.")
def mcp(transport: str, repos: tuple[Path, ...], sandbox_name: str | None, port: int,
        timeout_s: float) -> int:
    """Serve Choir's tools (verify, show_report, show_attestation, gate, list_runs) over MCP.

    Repos, sandbox, timeout and CHOIR_HOME are fixed here; no tool call changes them. Over
    HTTP the printed token must come as `Authorization: Bearer TOKEN` (CHOIR_MCP_TOKEN sets
    it).
    """
    from choir.mcp import require_extra

    require_extra()
    from choir.mcp.scope import Scope
    from choir.mcp.tools import Tools

    tools = Tools(Scope.open(list(repos)), sandbox=sandbox_name, timeout_s=timeout_s)
    if transport == "stdio":
        from choir.mcp.server import serve_stdio

        serve_stdio(tools)
        return EXIT_OK
    from choir.mcp.http import serve_http

    def announce(url: str, token: str) -> None:
        click.echo(f"choir mcp: {url}", err=False)
        click.echo(f"choir mcp: token {token}  (send it as `Authorization: Bearer TOKEN`; "
                   "Ctrl-C stops the server)")

    serve_http(tools, port, announce=announce)
    return EXIT_OK
