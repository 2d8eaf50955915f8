"""Shell globs over repo-relative posix paths, as regular expressions.

``fnmatch`` lets ``*`` cross ``/``, so ``src/*/test_*.py`` would match at every depth; here
``*``, ``?`` and ``[...]`` never match ``/`` and only ``**`` crosses folders (``**/``: any
depth, including none). The agent's file tools and the pinned spec read globs the same way.
"""

from __future__ import annotations

import re


def glob_regex(pattern: str) -> str:
    """The regex source (unanchored) of ``pattern``."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("(?!/)[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)
