"""``ledger.errors.printable``: text from the cluster made inert before it reaches a terminal or a log line."""

from __future__ import annotations

import pytest

from ledger.errors import printable


@pytest.mark.parametrize(("text", "keep_newlines", "expected"), [
    ("plain [bold]x[/bold] ünïcode", False, "plain [bold]x[/bold] ünïcode"),  # only control characters change
    ("a\x1b[2Jb", False, "a\\x1b[2Jb"),  # clear screen
    ("t\x1b]0;owned\x07", False, "t\\x1b]0;owned\\x07"),  # window title, then BEL
    ("a\tb\rc\x00d\x7fe\x9bf", False, "a\\tb\\rc\\x00d\\x7fe\\x9bf"),  # tab, CR, NUL, DEL and a C1 CSI
    ("one\ntwo", False, "one\\ntwo"),  # a log line or a rejection stays one line
    ("one\ntwo\x1b", True, "one\ntwo\\x1b"),  # a table cell keeps its stacked lines
    # Bidirectional overrides and isolates would make the terminal draw "gpu-1 team-a" backwards or out of order;
    # right-to-left letters themselves are text and stay.
    ("pool\u202e1-upg", False, "pool\\u202e1-upg"),
    ("\u2066a\u2069\u200f\u061c", False, "\\u2066a\\u2069\\u200f\\u061c"),
    ("שלום\n\u202a", True, "שלום\n\\u202a"),
])
def test_control_characters_are_written_as_escapes(text: str, keep_newlines: bool, expected: str) -> None:
    assert printable(text, keep_newlines=keep_newlines) == expected
