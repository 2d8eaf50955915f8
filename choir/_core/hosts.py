"""Host allowlist entries: ``host[:port]``, parsed one way for configuration and the proxy.

An entry names one TCP endpoint a sandboxed step may reach through Choir's egress proxy
(``choir.sandbox.egress``): a DNS name or an IP literal, and a port (443 when none is
written: model APIs speak HTTPS). The same parser reads what a step asks the proxy for, so
a request matches an entry only when both normalise to the same text; a number that is
only an IP address in some spelling (``2130706433``, ``0x7f.1``, ``127.1``) is neither a
name nor a literal here, so it can never match a name the user listed.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORT = 443
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")


@dataclass(frozen=True, order=True)
class HostPort:
    """One endpoint: ``host`` lower case without a trailing dot, ``ip`` when it is a literal."""

    host: str
    port: int
    ip: bool = False

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def split_authority(text: str) -> tuple[str, str | None]:
    """``(host, port text or None)`` of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``.

    Raises:
        ValueError: an unclosed bracket, or text after ``]`` that is not ``:port``.
    """
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{text!r}: '[' without ']'")
        rest = text[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r}: only ':PORT' may follow ']'")
        return text[1:end], rest[1:] if rest else None
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, port
    return text, None


def parse_host(text: str, *, default_port: int | None = DEFAULT_PORT) -> HostPort:
    """The endpoint ``text`` names.

    Raises:
        ValueError: not ``host[:port]`` with a DNS name or an IP literal (IPv6 in brackets)
            and a port in 1-65535; userinfo, paths, zone ids and numeric names are refused.
    """
    if not isinstance(text, str) or not text or len(text) > 300:
        raise ValueError("a host is 'NAME[:PORT]' or 'IP[:PORT]' (IPv6 as '[ADDR]:PORT')")
    if any(c in text for c in "@/\\?#% \t\r\n") or not text.isascii():
        raise ValueError(f"{text!r} is not 'host[:port]' (no scheme, user, path or spaces)")
    host, port_text = split_authority(text)
    if port_text is None:
        if default_port is None:
            raise ValueError(f"{text!r} names no port")
        port = default_port
    elif port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    host = host.lower()
    if host.endswith(".") and len(host) > 1:
        host = host[:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if address.version == 6 and not text.startswith("["):
            raise ValueError(f"{text!r}: write an IPv6 address in brackets, '[{host}]:PORT'")
        return HostPort(str(address), port, ip=True)
    if text.startswith("["):
        raise ValueError(f"{text!r}: brackets hold an IPv6 address only")
    if not _NAME.match(host) or len(host) > 253 or _NUMERIC_LABEL.match(host.rsplit(".")[-1]):
        raise ValueError(f"{text!r} is neither a host name nor an IP address")
    return HostPort(host, port)


def normalise_hosts(entries: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Each entry as ``host:port``, sorted and without repeats (what is hashed and recorded).

    Raises:
        ValueError: an entry ``parse_host`` refuses.
    """
    return tuple(sorted({str(parse_host(entry)) for entry in entries}))
