"""``ledger.errors.shorten`` and ``shorten_repr``: client input echoed in an error message, cut to a fixed length."""

from __future__ import annotations

import pytest

from ledger.errors import shorten, shorten_repr


@pytest.mark.parametrize(("value", "limit", "expected"), [
    ("abc", 10, "'abc'"),  # short enough: the whole repr
    ("abcdefgh", 10, "'abcdefgh'"),  # exactly 10 characters with its quotes
    ("abcdefghi", 10, "'abcdefg…'"),  # 11 with its quotes: 7 letters, the ellipsis and the closing quote
    ("it's fine", 6, '"it\'…"'),  # repr chose double quotes; the same ones close the cut
    (1234567890123, 10, "123456789…"),  # not a string: no quote to keep
])
def test_a_quoted_value_is_cut_to_the_limit_keeping_its_closing_quote(value: object, limit: int,
                                                                      expected: str) -> None:
    assert shorten_repr(value, limit) == expected
    assert len(shorten_repr(value, limit)) <= limit


def test_plain_text_is_cut_with_its_last_character_an_ellipsis() -> None:
    assert shorten("abcdefghijk", 5) == "abcd…"
    assert shorten("abcde", 5) == "abcde"
