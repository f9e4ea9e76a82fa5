"""``decode_jsonb``: the loader psycopg uses for ``json`` / ``jsonb`` columns agrees with the standard library.

The documents are written by hand in the forms PostgreSQL prints (``jsonb_out``): keys sorted, integers of any
size written out in full, fractions in positional notation.
"""

from __future__ import annotations

import json
import math

import pytest

from ledger.store.postgres import decode_jsonb

DOCUMENTS = [
    b'{"a": 1, "bb": [true, false, null], "ccc": {"d": "x"}}',
    b'{"memory": {"value": "80Gi"}, "index": 7}',
    b'"\\u00e9t\\u00e9 \\ud83d\\ude80 caf\xc3\xa9"',
    b"1180591620717411303424",  # 2**70: beyond 64 bits
    b"-1180591620717411303424",
    b"0.1",
    b"-2.5",
    b"[]",
    b"{}",
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_a_document_decodes_as_the_standard_library_decodes_it(document: bytes) -> None:
    decoded = decode_jsonb(document)
    assert decoded == json.loads(document)
    assert type(decoded) is type(json.loads(document))


def test_integers_beyond_64_bits_stay_exact() -> None:
    assert decode_jsonb(b'{"n": 1180591620717411303424}') == {"n": 2**70}


def test_a_fraction_beyond_the_range_of_a_float_decodes_as_infinity_as_before() -> None:
    # jsonb keeps such a number exactly; the fast decoder refuses it, and the standard library reads it as inf.
    text = b'{"n": 1' + b"0" * 400 + b'.5, "k": "kept"}'
    decoded = decode_jsonb(text)
    assert decoded == {"n": math.inf, "k": "kept"}
    assert decoded == json.loads(text)


def test_text_that_is_not_json_raises_the_standard_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        decode_jsonb(b'{"a": ')
