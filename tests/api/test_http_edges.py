"""Edges of HTTP itself on the API: q-values in ``Accept``, ``HEAD``, ``OPTIONS``."""

from __future__ import annotations

import pytest
from litestar import Litestar
from litestar.testing import TestClient

WINDOW = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}


@pytest.mark.parametrize(("accept", "media_type"), [
    # A q-value outside 0..1, not a number, or with four decimals: the range is ignored.
    ("text/csv;q=-1", "application/json"), ("text/csv;q=abc", "application/json"),
    ("text/csv;q=1.5", "application/json"), ("text/csv;q=0.5000", "application/json"),
    ("text/csv;q=-1, application/json;q=0.5", "application/json"),
    ("application/json;q=2, text/csv;q=0.5", "text/csv"), ("application/json;q=nan, text/csv;q=0.1", "text/csv"),
    # Valid ranges keep counting next to an ignored one.
    ("text/csv;q=-1, text/*", "text/csv"), ("text/csv;q=1.000, application/json;q=0.999", "text/csv"),
])
def test_a_media_range_with_an_invalid_q_value_is_ignored(client: TestClient[Litestar], accept: str,
                                                          media_type: str) -> None:
    response = client.get("/v1/usage", params=WINDOW, headers={"Accept": accept})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].split(";")[0] == media_type
