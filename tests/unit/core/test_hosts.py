"""Host list entries: one parser for configuration and for what a step asks the proxy for."""

from __future__ import annotations

import pytest

from choir._core.hosts import HostPort, normalise_hosts, parse_host


@pytest.mark.parametrize(("text", "expected"), [
    ("api.anthropic.com", HostPort("api.anthropic.com", 443)),
    ("API.Anthropic.COM.:8443", HostPort("api.anthropic.com", 8443)),
    ("127.0.0.1:8080", HostPort("127.0.0.1", 8080, ip=True)),
    ("[::1]:9", HostPort("::1", 9, ip=True)),
    ("[0:0:0:0:0:0:0:1]", HostPort("::1", 443, ip=True)),
    ("localhost:5432", HostPort("localhost", 5432)),
    ("db_internal.corp", HostPort("db_internal.corp", 443)),
])
def test_entries_normalise(text: str, expected: HostPort) -> None:
    assert parse_host(text) == expected


@pytest.mark.parametrize("text", [
    "", "http://api.openai.com", "user@api.openai.com", "api.openai.com/v1", "a b",
    "api.openai.com:0", "api.openai.com:65536", "api.openai.com:http", "::1", "[::1",
    "[api.openai.com]:443", "[fe80::1%eth0]:80", "127.1", "2130706433", "0x7f000001",
    "10.0.0.0x1", "bücher.example", "-bad.example", "a..b",
])
def test_what_is_not_one_endpoint_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_host(text)


def test_numeric_spellings_of_an_address_never_match_a_listed_name() -> None:
    """``127.1`` is 127.0.0.1 to the C resolver: here it is no host at all."""
    for spelling in ("127.1", "0177.0.0.1", "2130706433", "0x7f.1"):
        with pytest.raises(ValueError):
            parse_host(spelling)


def test_a_list_is_sorted_without_repeats() -> None:
    assert normalise_hosts(["b.example", "a.example:443", "A.example"]) == \
        ("a.example:443", "b.example:443")
    assert str(parse_host("[::1]:80")) == "[::1]:80"
