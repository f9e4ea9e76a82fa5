"""``quotas --output json`` writes ``used`` as ``GET /v1/quotas`` does (a float, ``4.0``), while the body the
ledger answers with keeps its exact counts for the table."""

from __future__ import annotations

import json

from ledger.cli import float_quota_usage
from ledger.types import JSONObject

MAX_INT64 = 2**63 - 1


def test_every_used_of_an_instant_body_becomes_a_float_and_the_exact_body_is_left_as_it_was() -> None:
    body: JSONObject = {"at": "2026-11-02T09:30:00Z", "nextPageToken": None, "rows": [
        {"team": "vision", "resourceName": "gpu.example.com", "used": 4, "nominalQuota": 3.0, "overQuota": True,
         "reasons": [], "claims": [{"namespace": "ml-train", "name": "pair-0", "used": 2, "reasons": []},
                                   {"namespace": "ml-train", "name": "pick-seven", "used": 2, "reasons": []}]},
        {"team": "nlp", "resourceName": "gpu.memory", "used": 1.5, "nominalQuota": None, "overQuota": False,
         "reasons": [], "claims": [{"namespace": "ml-serve", "name": "a", "used": 1.5, "reasons": []}]},
    ]}
    exact = json.dumps(body)

    written = json.dumps(float_quota_usage(body))

    assert written == exact.replace('"used": 4,', '"used": 4.0,').replace('"used": 2,', '"used": 2.0,')
    assert json.dumps(body) == exact  # the table still prints 4, and Kueue's saturated int64 exactly


def test_intervals_take_the_same_form_and_a_count_past_2_to_the_53_rounds_as_the_api_rounds_it() -> None:
    body: JSONObject = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "intervals": [
        {"team": "vision", "resourceName": "res-2", "from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z",
         "used": MAX_INT64, "nominalQuota": None, "overQuota": False}]}

    intervals = float_quota_usage(body)["intervals"]

    assert isinstance(intervals, list) and len(intervals) == 1
    interval = intervals[0]
    assert isinstance(interval, dict)
    assert interval["used"] == 9.223372036854775808e18  # 2**63: the float nearest 2**63 - 1
    assert json.dumps(interval["used"]) == "9.223372036854776e+18"

