"""Shell globs over repo-relative posix paths.

``fnmatch`` lets ``*`` cross ``/``, so ``src/*/test_*.py`` would match at every depth; here
``*``, ``?`` and ``[...]`` never match ``/`` and only ``**`` crosses folders (``**/``: any
depth, including none). The agent's file tools and the pinned spec read globs the same way:
one tokenizer feeds both ``glob_regex`` (the spec's regex, from a trusted file) and
``glob_match`` (the agent's patterns, from the model, matched without backtracking).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

# the regex of each token kind but a class and a literal
_REGEX = {"dirs": "(?:[^/]*/)*", "any": ".*", "star": "[^/]*", "one": "[^/]"}
_REPEATS = frozenset({"dirs", "any", "star"})  # the kinds that may match nothing
_CACHE_CELLS = 1_000_000  # state-set members kept in one matcher's memo, about 50 MB at most


def _tokens(pattern: str) -> Iterator[tuple[str, str]]:
    """``(kind, text)`` for each token: ``dirs`` (``**/``), ``any`` (``**``), ``star``,
    ``one`` (``?``), ``set`` (text: the regex character class) or ``lit`` (one character)."""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            yield "dirs", ""
            i += 3
        elif pattern.startswith("**", i):
            yield "any", ""
            i += 2
        elif pattern[i] == "*":
            yield "star", ""
            i += 1
        elif pattern[i] == "?":
            yield "one", ""
            i += 1
        elif pattern[i] == "[" and _class_end(pattern, i) > 0:
            end = _class_end(pattern, i)
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            # a "]" first in the class is one of its members, as the shell reads it
            yield "set", "[" + body.replace("\\", "\\\\").replace("]", "\\]") + "]"
            i = end + 1
        else:
            yield "lit", pattern[i]
            i += 1


def _class_end(pattern: str, i: int) -> int:
    """Where the ``[...]`` opened at ``i`` closes (a ``]`` right after ``[`` or ``[!`` is a
    member, not the end), or -1 when it never does (the ``[`` is then a plain character).
    ``[!]?`` was read as the class ``[^]``: no regex ``re`` compiles alone."""
    j = i + 1
    if pattern.startswith("!", j):
        j += 1
    if pattern.startswith("]", j):
        j += 1
    return pattern.find("]", j)


def glob_regex(pattern: str) -> str:
    """The regex source (unanchored) of ``pattern``.

    ``re`` backtracks on it: keep it for globs from a trusted file, and match anything an
    untrusted party writes with ``glob_match``.
    """
    return "".join(re.escape(text) if kind == "lit" else "(?!/)" + text if kind == "set"
                   else _REGEX[kind] for kind, text in _tokens(pattern))


def glob_match(pattern: str) -> Callable[[str], bool]:
    """A test of a whole path against ``pattern``, in time linear in the path.

    ``re`` backtracks on ``glob_regex``: a model's ``*a*a*a*a*a/`` against a 200-character
    name took 73 s (review 20b) and hung a run past its timeout. Here the positions in the
    pattern a prefix can reach are tracked as a set, one step per character (Thompson's
    construction), and each step is remembered, so a path costs a dictionary look-up per
    character once the matcher is warm. ``**`` matches line breaks too, as the spec reads it.

    Raises:
        re.error: a ``[...]`` that is no valid character set, e.g. ``[z-a]``.
    """
    tokens = list(_tokens(pattern))
    classes = {k: re.compile(text) for k, (kind, text) in enumerate(tokens) if kind == "set"}
    # state 2k: before token k; 2k+1: inside a folder name of the ``**/`` at k
    end = 2 * len(tokens)
    follow: list[tuple[int, ...]] = []  # follow[k]: the states 2k reaches matching nothing
    for k in range(len(tokens) + 1):
        j = k
        while j < len(tokens) and tokens[j][0] in _REPEATS:
            j += 1
        follow.append(tuple(range(2 * k, 2 * j + 1, 2)))
    memo: dict[tuple[frozenset[int], str], frozenset[int]] = {}
    cells = 0

    def step(states: frozenset[int], char: str) -> frozenset[int]:
        out: set[int] = set()
        for state in states:
            k, inside = divmod(state, 2)
            if inside:
                out.update(follow[k] if char == "/" else (state,))
                continue
            if k == len(tokens):
                continue
            kind, text = tokens[k]
            if kind == "dirs":
                out.update(follow[k] if char == "/" else (state + 1,))
            elif kind == "any" or (kind == "star" and char != "/"):
                out.update(follow[k])
            elif (kind == "lit" and char == text) or (kind == "one" and char != "/") or (
                    kind == "set" and char != "/" and classes[k].fullmatch(char)):
                out.update(follow[k + 1])
        return frozenset(out)

    start = frozenset(follow[0])

    def matches(path: str) -> bool:
        nonlocal cells
        states = start
        for char in path:
            nxt = memo.get((states, char))
            if nxt is None:
                nxt = step(states, char)
                if cells > _CACHE_CELLS:
                    memo.clear()
                    cells = 0
                memo[states, char] = nxt
                cells += len(nxt) + 1
            if not nxt:
                return False
            states = nxt
        return end in states

    return matches
