"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis).

Every operation is called with generated parameters, valid and invalid; no answer may be a 5xx, and
every answer must match the documented status codes, content types and schemas.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

EXAMPLES_PER_OPERATION = 40
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
"""No 5xx, and every answer as documented. (Not ``positive_data_acceptance``: a string the schema allows,
such as ``at=\x04``, is still rejected with a documented 422 when it is not an RFC 3339 time.)"""


def test_no_input_makes_a_5xx_or_breaks_the_schema(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    schema = schemathesis.openapi.from_asgi("/schema/openapi.json", create_app(db=ledger.db, config=DEFAULT))
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]  # Err raises
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        def check(case: Any) -> None:
            case.call_and_validate(checks=CHECKS)

        try:
            check()
        except AssertionError as e:  # name the operation that failed
            pytest.fail(f"{operation.method.upper()} {operation.path}: {e}")
