"""Edges of the ``/v1`` query parameters: what a problem body echoes, and which numbers are numbers."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import TestClient

MAX_ECHO_CHARS = 100
"""The documented cut of echoed input (:data:`api.parameters.MAX_ECHO_CHARS`), spelled out so the tests state it."""


def problem(client: TestClient[Litestar], url: str, status: int) -> str:
    """GET ``url``, check it is a problem-details answer with ``status``, and return its detail."""
    response = client.get(url)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    detail = body["detail"]
    assert isinstance(detail, str)
    return detail


def test_a_long_unknown_parameter_name_is_echoed_cut_to_100_characters_with_an_ellipsis(
        client: TestClient[Litestar]) -> None:
    detail = problem(client, "/v1/occupancy?" + "x" * 5000 + "=1", 400)
    assert detail.startswith("unknown query parameter " + "x" * (MAX_ECHO_CHARS - 1) + "…: this endpoint takes "), \
        detail[:300]
    assert "x" * MAX_ECHO_CHARS not in detail and len(detail) < 400


def test_many_unknown_parameters_are_listed_ten_at_most_and_the_rest_counted(client: TestClient[Litestar]) -> None:
    query = "&".join(f"p{n:03d}=1" for n in range(50))
    detail = problem(client, f"/v1/occupancy?{query}", 400)
    listed = ", ".join(f"p{n:03d}" for n in range(10))
    assert detail.startswith(f"unknown query parameters {listed} ... and 40 more: this endpoint takes "), detail


def test_a_long_event_type_is_echoed_cut(client: TestClient[Litestar]) -> None:
    detail = problem(client, "/v1/events?type=" + "T" * 5000, 422)
    assert detail.startswith("type: no event type '" + "T" * (MAX_ECHO_CHARS - 2) + "…; the types are "), detail[:300]


def test_a_time_too_far_in_the_future_with_a_long_fraction_is_echoed_cut(client: TestClient[Litestar]) -> None:
    at = "9999-06-01T00:00:00." + "0" * 5000 + "Z"
    detail = problem(client, f"/v1/occupancy?at={at}", 422)
    assert detail == f"at: {repr(at)[:MAX_ECHO_CHARS - 1]}… is too far in the future"
