"""``choir view``: the local, read-only audit viewer in a browser."""

from __future__ import annotations

import click

from choir.cli._errors import EXIT_OK


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0: a free one).")
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser.")
def view(port: int, open_browser: bool) -> int:
    """Browse runs, reports, attestations, the AHDB and the audit on 127.0.0.1.

    The printed URL carries a path and a token made for this launch; requests without them
    are refused.
    """
    from choir.view import require_extra

    require_extra()
    from choir.view.serve import serve

    def announce(url: str) -> None:
        click.echo(f"choir view: {url}  (Ctrl-C stops it)", err=False)
        if open_browser:
            import webbrowser

            webbrowser.open(url)

    serve(port, announce=announce)
    return EXIT_OK
