"""An MCP answer says how much it left out, wherever it cut (review 11, F6).

``clean`` cut every list at ``LIST_MAX`` and every dict at ``LIST_MAX`` keys with no marker:
a session of 64 runs answered 50 attestation ids and a 50-entry plan, and nothing said so.
"""

from __future__ import annotations

from choir.mcp.bound import LIST_MAX, RESPONSE_MAX, clean, fit, size


def test_a_cut_list_under_a_key_is_counted_beside_it() -> None:
    answer = {"attestations": [f"{i:064x}" for i in range(64)],
              "plan": [{"verifier": f"v{i}", "lens": "primary"} for i in range(70)],
              "verdict": "FAIL"}
    out = fit(clean(answer))
    assert len(out["attestations"]) == LIST_MAX and out["attestations_truncated"] == 14
    assert len(out["plan"]) == LIST_MAX and out["plan_truncated"] == 20
    assert size(out) <= RESPONSE_MAX


def test_an_earlier_count_is_added_to_not_replaced() -> None:
    out = clean({"reports": list(range(LIST_MAX + 5)), "reports_truncated": 3})
    assert out["reports_truncated"] == 8


def test_a_cut_dict_and_a_cut_nested_list_say_so() -> None:
    wide = {f"k{i:03}": i for i in range(LIST_MAX + 7)}
    out = clean({"counts": wide})
    assert len(out["counts"]) == LIST_MAX + 1 and out["counts"]["_keys_truncated"] == 7
    nested = clean([list(range(LIST_MAX + 2))])
    assert nested[0][-1] == "(3 more not shown)" and len(nested[0]) == LIST_MAX
    assert clean(out) == out and clean(nested) == nested  # fit() may clean twice


def test_nothing_is_added_when_nothing_is_cut() -> None:
    small = {"plan": ["a", "b"], "counts": {"x": 1}}
    assert clean(small) == small
