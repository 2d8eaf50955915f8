"""``choir serve``: the warm service that ``choir verify``, ``choir run`` and ``choir mcp``
use when it runs, and the cold path when it does not.

One concept per module: where it listens and how both ends check it (``place``), when a
service may not answer a client (``stale``), what a request may say (``wire``), the client
end (``client``), the service's loop (``server``) and the process that answers one request
(``worker``). This package's ``__init__`` imports nothing: the client runs on every
``choir verify`` before it knows whether it needs more than the standard library.
"""

SERVED = ("verify", "run")
"""The commands a service answers: a request is one of their command lines (``wire``), and
the CLI's entry asks the service only for these (``choir.cli``)."""
