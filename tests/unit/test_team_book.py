"""Which namespaces a team's claims can be in (``TeamBook.namespaces_of``), the SQL pre-filter of the claims listing."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.projections.queries import TeamBook

RELABEL = datetime(2026, 11, 1, 12, tzinfo=UTC)

# ml: vision until the relabel, nlp after; ops labelled vision but overridden to infra; web labelled web in c2;
# legacy overridden to vision with no Namespace recorded.
BOOK = TeamBook(intervals={("c1", "ml"): [(None, RELABEL, "vision"), (RELABEL, None, "nlp")],
                           ("c1", "ops"): [(None, None, "vision")],
                           ("c2", "web"): [(None, None, "web")]},
                overrides={"ops": "infra", "legacy": "vision"})


def test_a_team_has_its_labelled_overridden_and_same_named_namespaces() -> None:
    # "vision" itself: a namespace of that name with no Namespace recorded bills to its own name.
    assert BOOK.namespaces_of({"vision"}) == ["legacy", "ml", "vision"]


def test_an_override_takes_a_namespace_from_the_team_of_its_label() -> None:
    assert BOOK.namespaces_of({"infra"}) == ["infra", "ops"]
    assert "ops" not in BOOK.namespaces_of({"vision", "nlp"})


def test_several_teams_take_the_namespaces_of_each_across_clusters() -> None:
    assert BOOK.namespaces_of({"web", "nlp"}) == ["ml", "nlp", "web"]
    assert BOOK.namespaces_of(set()) == []


def test_every_namespace_the_book_bills_to_a_team_is_among_that_teams_namespaces() -> None:
    # The pre-filter may list more than needed, never less: check it against team() at instants on each side.
    for (cluster, namespace) in [*BOOK.intervals, ("c1", "legacy"), ("c1", "vision"), ("c1", "unknown")]:
        for at in (datetime(2026, 11, 1, tzinfo=UTC), RELABEL, datetime(2026, 11, 2, tzinfo=UTC)):
            team = BOOK.team(cluster, namespace, at)
            assert namespace in BOOK.namespaces_of({team}), (cluster, namespace, at, team)
