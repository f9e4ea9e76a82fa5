"""The claims listing (``GET /v1/claims``, ``dra-ledger claims``) reads a page's details for its claims only.

A ledger lists every claim it ever recorded, so the listing must not ask the database once a claim (it asked for
each claim's team, 30 s of 36 on a simulated 1,000-node day), and a page must be what the whole list gives.

The history: namespace ``ml`` labelled team ``vision`` until minute 50, then ``nlp``; namespace ``web`` of team
``web``. Claims made at minute 0 in both: allocated ones, pending ones, and ones deleted at minute 40 (billed to
the team of their last moment, ``vision``). The listing is asked for at minute 60.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

from ledger import services
from ledger.projections import runner
from ledger.testing.handle import LedgerHandle
from ledger.translator.translate import TranslatorSettings
from ledger.types import JSONObject
from tests.factories import at, claim, dig, gpu, history, namespace, resource_slice, uid

ASKED = at(60)


def write_history(path: Path, n: int) -> Path:
    """``n`` claims of each kind in ``ml`` and in ``web`` (see the module docstring); ``2 * n`` GPUs each."""
    ml = namespace("ml", "vision")
    events: list[tuple[str, JSONObject, float]] = [
        ("ADDED", ml, 0), ("ADDED", namespace("web", "web"), 0),
        ("ADDED", resource_slice(name=uid("slice"), devices=[gpu(f"gpu-{i}") for i in range(4 * n)]), 0)]
    for ns, first in (("ml", 0), ("web", 2 * n)):
        for i in range(n):
            events.append(("ADDED", claim(name=f"run-{i}", namespace=ns, claim_uid=uid("claim"),
                                          results=[f"gpu-{first + i}"], allocated_at=0), 0))
            events.append(("ADDED", claim(name=f"wait-{i}", namespace=ns, claim_uid=uid("claim")), 0))
            gone = claim(name=f"gone-{i}", namespace=ns, claim_uid=uid("claim"), results=[f"gpu-{first + n + i}"],
                         allocated_at=0)
            events += [("ADDED", gone, 0), ("DELETED", gone, 40)]
    relabelled = copy.deepcopy(ml)
    dig(relabelled, "metadata", "labels")["team"] = "nlp"
    events.append(("MODIFIED", relabelled, 50))
    return history(path, events)


def listed(ledger: LedgerHandle) -> tuple[list[Any], int]:
    """Every claim at :data:`ASKED` (``services.claims``) and how many SQL statements the listing sent."""
    seen: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(ledger.engine, "before_cursor_execute", count)
    try:
        body: Any = services.claims(ledger.db, at=ASKED)
    finally:
        event.remove(ledger.engine, "before_cursor_execute", count)
    return body["claims"], len(seen)


def test_the_listing_sends_the_same_statements_for_few_claims_and_for_many(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    statements: dict[int, int] = {}
    for n in (1, 5):
        ledger = ledger_factory()
        assert not ledger.replay(write_history(tmp_path / f"{n}.jsonl", n)).rejected
        runner.catch_up(ledger.engine)
        rows, statements[n] = listed(ledger)
        got = {(c["namespace"], c["name"]): (c["state"], c["team"], len(c["devices"])) for c in rows}
        expected: dict[tuple[str, str], tuple[str, str, int]] = {}
        for ns, team_now in (("ml", "nlp"), ("web", "web")):
            for i in range(n):
                expected[(ns, f"run-{i}")] = ("allocated", team_now, 1)
                expected[(ns, f"wait-{i}")] = ("pending", team_now, 0)
                expected[(ns, f"gone-{i}")] = ("deleted", "vision" if ns == "ml" else "web", 0)
        assert got == expected
    assert statements[1] == statements[5]


def walk(ledger: LedgerHandle, *, limit: int, **asked: Any) -> tuple[list[Any], int]:
    """Every page of the listing at :data:`ASKED`, each starting after the previous page's last claim: the claims
    served and the pages read."""
    served: list[Any] = []
    after = None
    pages = 0
    while True:
        page = services.claims_page(ledger.db, at=ASKED, after=after, limit=limit, **asked)
        body: Any = page.body
        served += body["claims"]
        pages += 1
        if not page.more:
            return served, pages
        assert pages < 100, "the pages never end"  # each history here has at most 24 claims
        assert page.last == (served[-1]["cluster"], served[-1]["namespace"], served[-1]["name"], served[-1]["uid"])
        after = page.last


def test_every_page_is_the_matching_slice_of_the_whole_list(ledger: LedgerHandle, tmp_path: Path) -> None:
    assert not ledger.replay(write_history(tmp_path / "h.jsonl", 3)).rejected
    runner.catch_up(ledger.engine)
    whole: Any = services.claims(ledger.db, at=ASKED)
    everything = whole["claims"]
    assert len(everything) == 18
    assert [(c["namespace"], c["name"]) for c in everything] == sorted((c["namespace"], c["name"]) for c in everything)
    filters: list[tuple[dict[str, Any], Callable[[Any], bool]]] = [
        ({}, lambda c: True),
        ({"state": "deleted"}, lambda c: c["state"] == "deleted"),
        ({"state": "allocated"}, lambda c: c["state"] == "allocated"),
        ({"state": "pending", "team": "nlp"}, lambda c: c["state"] == "pending" and c["team"] == "nlp"),
        ({"team": "vision"}, lambda c: c["team"] == "vision"),
        ({"visible_teams": {"nlp", "web"}}, lambda c: c["team"] in ("nlp", "web")),
        ({"visible_teams": {"vision"}, "team": "vision"}, lambda c: c["team"] == "vision"),
        ({"visible_teams": {"web"}, "team": "vision"}, lambda c: False),
        ({"namespace": "web", "state": "pending"}, lambda c: c["namespace"] == "web" and c["state"] == "pending"),
        ({"name": "gone-1"}, lambda c: c["name"] == "gone-1"),
    ]
    for asked, keep in filters:
        expected = [c for c in everything if keep(c)]
        assert expected or asked == {"visible_teams": {"web"}, "team": "vision"}, asked  # that one sees none
        for limit in (1, 2, 4):
            served, pages = walk(ledger, limit=limit, **asked)
            assert served == expected, (asked, limit)
            assert pages == max(-(-len(expected) // limit), 1), (asked, limit)  # no empty last page after one


def test_two_clusters_are_listed_one_after_the_other_and_every_page_walks_on(ledger: LedgerHandle,
                                                                            tmp_path: Path) -> None:
    # The same history under two clusters: every claim's namespace, name and uid twice, told apart by cluster.
    path = write_history(tmp_path / "h.jsonl", 2)
    for cluster in ("b-cluster", "a-cluster"):
        report = services.replay_files(ledger.db, [path], cluster=cluster,
                                       settings=TranslatorSettings(team_label=ledger.team_label))
        assert report.lines and not report.rejected
    runner.catch_up(ledger.engine)
    one: Any = services.claims(ledger.db, at=ASKED, cluster="a-cluster")
    assert len(one["claims"]) == 12
    both: Any = services.claims(ledger.db, at=ASKED)
    assert both["claims"] == one["claims"] + [{**c, "cluster": "b-cluster"} for c in one["claims"]]
    for limit in (1, 5):
        assert walk(ledger, limit=limit)[0] == both["claims"]
        alive = [c for c in both["claims"] if c["state"] == "allocated"]
        assert walk(ledger, limit=limit, state="allocated")[0] == alive


def test_a_page_starts_after_a_key_that_no_claim_has(ledger: LedgerHandle, tmp_path: Path) -> None:
    assert not ledger.replay(write_history(tmp_path / "h.jsonl", 2)).rejected
    runner.catch_up(ledger.engine)
    everything: Any = services.claims(ledger.db, at=ASKED)
    # Between ml/wait-1 and web/gone-0 by name: "ml" < "ml-zzz" < "web". A claim deleted since the previous page
    # leaves such a key behind; the next page starts at the claim after it all the same.
    page = services.claims_page(ledger.db, at=ASKED, after=("default", "ml-zzz", "", ""), limit=100)
    body: Any = page.body
    assert body["claims"] == [c for c in everything["claims"] if c["namespace"] == "web"]
    assert not page.more
