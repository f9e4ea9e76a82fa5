"""Replay is idempotent, tolerant of re-delivery and relists, and rebuild gives identical read models."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from sqlalchemy import text
from typer.testing import CliRunner

from ledger.cli import app
from ledger.projections import runner
from ledger.recorded import BrokenLine, WatchLine
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES, REAL
from tests.statements import statements_run

SEED = HISTORIES / "seed-lab.jsonl"


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def _count(ledger: LedgerHandle, table: str) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _in_threads(count: int, work: Callable[[], object]) -> list[BaseException]:
    """Run ``work`` in ``count`` threads at once; return what any of them raised."""
    import threading

    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except Exception as e:  # noqa: BLE001  # the caller asserts on every failure
            failures.append(e)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return failures


def test_replaying_the_same_file_twice_adds_no_rows(ledger: LedgerHandle) -> None:
    first = ledger.replay(SEED)
    before = ledger.snapshot()
    counts = {t: _count(ledger, t) for t in ("observations", "events", "translator_state")}
    second = ledger.replay(SEED)
    assert (first.recorded, first.duplicates) == (39, 0)
    assert (second.recorded, second.duplicates, second.events) == (0, 39, 0)
    assert {t: _count(ledger, t) for t in counts} == counts
    assert ledger.snapshot() == before


def test_every_line_delivered_twice_gives_the_same_ledger(ledger_factory: Callable[[], LedgerHandle],
                                                          tmp_path: Path) -> None:
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text("".join(f"{line}\n{line}\n" for line in _lines(SEED)))
    clean, twice = ledger_factory(), ledger_factory()
    clean.replay(SEED)
    report = twice.replay(doubled)
    assert report.duplicates == 39
    assert twice.snapshot() == clean.snapshot()


def _relist(lines: list[str], observed_at: str) -> list[str]:
    """A relist at ``observed_at``: every object alive now, re-sent as ADDED with its resourceVersion."""
    alive: dict[tuple[str, str], dict[str, Any]] = {}
    for line in lines:
        record = json.loads(line)
        obj = record["object"]
        if record["type"] == "BOOKMARK":
            continue
        key = (obj["kind"], obj["metadata"]["uid"])
        if record["type"] == "DELETED":
            alive.pop(key, None)
        else:
            alive[key] = obj
    return [json.dumps({"observedAt": observed_at, "type": "ADDED", "object": obj}) for obj in alive.values()]


def test_a_relist_in_the_middle_changes_nothing(ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    lines = _lines(SEED)
    middle = 25  # after the ext-0 claim was allocated, before the big claim exists
    relisted = tmp_path / "relisted.jsonl"
    head = lines[:middle]
    relist = _relist(head, "2026-11-02T09:20:30Z")  # 29 s after the last line before it
    assert len(relist) > 10
    relisted.write_text("\n".join([*head, *relist, *lines[middle:]]) + "\n")
    clean, with_relist = ledger_factory(), ledger_factory()
    clean.replay(SEED)
    report = with_relist.replay(relisted)
    assert report.recorded == 39 + len(relist)
    assert with_relist.snapshot() == clean.snapshot()


def test_rebuild_gives_read_models_identical_to_the_live_ones(ledger: LedgerHandle) -> None:
    ledger.replay(SEED)
    for path in sorted(REAL.glob("*.yaml")):
        ledger.replay(path)
    live = ledger.snapshot()
    assert live["device_allocations"] and live["device_inventory"]
    applied = runner.rebuild(ledger.engine)
    assert applied == len(live["events"])
    assert ledger.snapshot() == live


def test_rebuild_through_the_cli_reports_the_events_applied(ledger: LedgerHandle) -> None:
    ledger.replay(SEED)
    url = ledger.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(app, ["rebuild", "--database-url", url])
    assert result.exit_code == 0, result.output
    events = _count(ledger, "events")
    assert result.output.startswith(f"rebuilding the read models from the events ({events:,}) ...\n")
    assert f"rebuilt read models from {events} events" in result.output
    # Each table of the whole-history build is said once it is written, in the build's order.
    steps = [line.split()[2] for line in result.output.splitlines() if line.startswith("read models: ")]
    assert sorted(steps) == sorted(runner.table_names())
    assert steps[-1] == "device_allocations"  # the fold's tables last, allocations after the tables they read
    # ... and computed the occupancy counts again: the rows it reports are the rows stored.
    assert f"occupancy counts: {_count(ledger, 'occupancy_counts')} rows over 1 cluster(s)" in result.output
    assert _count(ledger, "occupancy_counts") > 1


def test_files_given_out_of_order_are_recorded_and_said_to_go_back_in_time(ledger: LedgerHandle,
                                                                           tmp_path: Path) -> None:
    # The seed lab cut in two and the halves given in the wrong order: every line is recorded as it is, and the
    # summary warns, counting the lines of the first half received before the second half's last line.
    lines = SEED.read_text().splitlines()
    early, late = tmp_path / "early.jsonl", tmp_path / "late.jsonl"
    early.write_text("\n".join(lines[:30]) + "\n")
    late.write_text("\n".join(lines[30:]) + "\n")
    received = [datetime.fromisoformat(json.loads(line)["observedAt"]) for line in lines]
    latest = max(received[30:])
    back = [latest - t for t in received[:30] if t < latest]
    url = ledger.engine.url.render_as_string(hide_password=False)

    result = CliRunner().invoke(app, ["replay", str(late), str(early), "--database-url", url, "--cluster", "c"])
    again = CliRunner().invoke(app, ["replay", str(early), str(late), "--database-url", url, "--cluster", "in-order"])

    assert result.exit_code == 0, result.output
    assert f"{len(lines)} lines: {len(lines)} recorded" in result.stderr
    assert len(back) == 30
    assert (f"warning: 30 lines received (observedAt) before a line read ahead of them, up to "
            f"{max(back).total_seconds():g} s back: a file out of order, or files given out of order?") in result.stderr
    assert again.exit_code == 0 and "warning" not in again.stderr


def test_a_bad_line_is_reported_stored_and_does_not_stop_the_lines_after_it(ledger: LedgerHandle,
                                                                            tmp_path: Path) -> None:
    lines = _lines(SEED)
    broken = json.loads(lines[7])  # the first allocation of train-0's claim
    broken["object"]["status"]["allocation"]["devices"]["results"][0]["device"] = 7
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text("\n".join([*lines[:5], lines[5][:80], *lines[6:7], json.dumps(broken), *lines[8:]]) + "\n")
    url = ledger.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(app, ["replay", str(bad_file), "--database-url", url])
    assert result.exit_code == 1
    assert f"{bad_file}:6: invalid JSON" in result.output
    assert f"{bad_file}:8: MODIFIED ResourceClaim ml-train/train-0-gpu-4fj8q: " \
           "status.allocation.devices.results[0].device: expected a string, got 7" in result.output
    with ledger.engine.connect() as conn:
        rejected = conn.execute(text("SELECT origin FROM observations WHERE status = 'rejected' ORDER BY origin")).all()
    assert [r.origin for r in rejected] == [f"{bad_file}:6", f"{bad_file}:8"]
    # The lines after the bad ones were all recorded: the pair, pick-seven and ext-0 claims are held.
    occupancy: Any = ledger.occupancy(at=_t("2026-11-02T09:30:00Z"))
    held = sorted(d["device"] for d in occupancy["devices"] if d["allocations"])
    # train-0 never got its allocation (the line was rejected, and line 6 was its pod) ...
    assert held == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-7"]
    # A second run of the same bad file adds nothing but still reports its bad lines and fails.
    again = CliRunner().invoke(app, ["replay", str(bad_file), "--database-url", url])
    assert again.exit_code == 1
    assert f"{bad_file}:6: invalid JSON" in again.output and "(already recorded as rejected)" in again.output
    # Both bad lines are among the lines already recorded, and the summary says so (the counts add up to n + 2).
    n = len(lines)
    assert (f"{n} lines: 0 recorded, {n} already recorded, 2 rejected (already recorded as rejected, so also among "
            f"the {n} already recorded); 0 events appended") in again.output


def _t(value: str) -> Any:
    from ledger.recorded import parse_time

    return parse_time(value)


def test_observation_and_event_rows_hold_each_line_and_event_as_json_objects(ledger: LedgerHandle,
                                                                           tmp_path: Path) -> None:
    # The append writes these tables with a binary COPY of JSON text encoded once: what is stored must be the
    # object itself (not a JSON string holding its text), with every column where a text COPY put it.
    lines = _lines(SEED)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], lines[1][:50], lines[2]]) + "\n")
    ledger.replay(bad)
    with ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT origin, status, kind, name, uid, resource_version, watch_type, observed_at, "
                                 "body, json_typeof(body) AS shape FROM observations ORDER BY origin")).all()
        event = conn.execute(text("SELECT stream, stream_position, type, schema_version, payload, source, "
                                  "jsonb_typeof(payload) AS shape FROM events ORDER BY global_position LIMIT 1")).one()
    first, broken, third = rows
    sent = json.loads(lines[0])
    assert (first.status, first.kind, first.watch_type, first.shape) == ("recorded", sent["object"]["kind"],
                                                                         sent["type"], "object")
    assert first.body == sent["object"]
    assert (first.name, first.uid, first.resource_version) == (
        sent["object"]["metadata"]["name"], sent["object"]["metadata"].get("uid"),
        sent["object"]["metadata"].get("resourceVersion"))
    assert first.observed_at == _t(sent["observedAt"])
    assert third.body == json.loads(lines[2])["object"]
    # A broken line keeps its text, as a JSON string.
    assert (broken.status, broken.shape, broken.body, broken.kind) == ("rejected", "string", lines[1][:50], None)
    # The first event: the first line's, on its stream at position 1, with an object payload and its source.
    assert (event.stream_position, event.schema_version, event.shape) == (1, 1, "object")
    assert event.source["watchType"] == sent["type"] and event.source["kind"] == sent["object"]["kind"]
    assert event.source["digest"].startswith(f"{ledger.cluster}/")


def test_kubectl_watch_output_and_yaml_lists_replay_like_recorded_lines(ledger: LedgerHandle,
                                                                        tmp_path: Path) -> None:
    # `kubectl get resourceclaims -o json --watch --output-watch-events`: pretty-printed events back to back.
    claims = [json.loads(line) for line in _lines(SEED) if '"kind":"ResourceClaim"' in line
              and '"name":"pick-seven"' in line]
    watch = tmp_path / "watch.json"
    watch.write_text("\n".join(json.dumps({"type": c["type"], "object": c["object"]}, indent=4) for c in claims))
    # `kubectl get resourceslices -o yaml`: a List holding the lab node's slice.
    slice_obj = next(json.loads(line)["object"] for line in _lines(SEED) if '"kind":"ResourceSlice"' in line)
    slices = tmp_path / "slices.yaml"
    slices.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [slice_obj]}))
    report = ledger.replay(slices, watch, at=_t("2026-11-02T10:00:00Z"))
    assert report.rejected == []
    held: Any = ledger.occupancy(at=_t("2026-11-02T10:00:00Z"))
    assert held["totals"] == {"devices": 8, "allocated": 1, "free": 7, "shared": 0}
    assert [d["device"] for d in held["devices"] if d["allocations"]] == ["gpu-7"]


def test_the_same_history_replays_into_two_clusters_side_by_side(ledger: LedgerHandle) -> None:
    ledger.replay(SEED)
    other = LedgerHandle(engine=ledger.engine, cluster="lab-2")
    report = other.replay(SEED)
    assert (report.recorded, report.events, report.rejected) == (39, 51, [])
    assert other.occupancy(_t("2026-11-02T09:30:00Z"))["totals"] == ledger.occupancy(_t("2026-11-02T09:30:00Z"))[
        "totals"]
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(DISTINCT cluster) FROM events")).scalar_one() == 2


def test_nul_characters_are_rejected_with_a_reason_and_the_neighbours_kept(ledger: LedgerHandle,
                                                                          tmp_path: Path) -> None:
    lines = _lines(SEED)[:4]
    poisoned = json.loads(lines[1])
    poisoned["object"]["metadata"]["labels"]["team"] = "nl\u0000p"
    path = tmp_path / "nul.jsonl"
    path.write_bytes(("\n".join([lines[0], json.dumps(poisoned), "\x00\x00garbage", lines[2], lines[3]])
                      + "\n").encode())
    report = ledger.replay(path)
    assert [r.origin.rsplit(":", 1)[1] for r in report.rejected] == ["2", "3"]
    assert "NUL" in report.rejected[0].reason
    assert report.recorded == 3  # lines 1, 4 and 5
    with ledger.engine.connect() as conn:
        kinds = conn.execute(text("SELECT kind FROM observations WHERE status = 'recorded' ORDER BY 1")).scalars()
        assert list(kinds) == ["DeviceClass", "Namespace", "ResourceSlice"]


def test_times_outside_years_1_to_9999_are_rejected_not_crashed(ledger: LedgerHandle, tmp_path: Path) -> None:
    lines = _lines(SEED)[:3]
    early = json.loads(lines[1])
    early["observedAt"] = "0001-01-01T00:00:00+14:00"
    path = tmp_path / "early.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(early), lines[2]]) + "\n")
    report = ledger.replay(path)
    assert len(report.rejected) == 1 and "out of range" in report.rejected[0].reason
    assert report.recorded == 2


def test_concurrent_replays_of_one_file_both_succeed_and_add_it_once(ledger_factory: Callable[[], LedgerHandle]
                                                                     ) -> None:
    shared, clean = ledger_factory(), ledger_factory()
    clean.replay(SEED)

    failures = _in_threads(3, lambda: LedgerHandle(engine=shared.engine).replay(SEED))

    assert failures == []
    assert shared.snapshot() == clean.snapshot()


def test_concurrent_replays_of_many_batches_add_the_history_once(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    # Three writers racing over the same 40-line batches keep losing races (digests recorded, streams
    # moved): each lost batch is translated again from the reloaded state, and nothing is doubled.
    from ledger import services
    from ledger.simulate import FleetSpec, write_history

    history = tmp_path / "fleet.jsonl"
    summary = write_history(FleetSpec(nodes=3, gpus_per_node=4, hours=8.0, seed=3), history)
    assert summary.lines > 200  # several batches of 40
    shared, clean = ledger_factory(), ledger_factory()
    alone = services.replay_files(clean.db, [history], cluster=clean.cluster, batch_size=40)
    reports: list[services.IngestReport] = []

    failures = _in_threads(3, lambda: reports.append(services.replay_files(
        LedgerHandle(engine=shared.engine).db, [history], cluster=shared.cluster, batch_size=40)))

    assert failures == []
    assert shared.snapshot() == clean.snapshot()
    assert sum(r.recorded for r in reports) == alone.recorded == summary.lines - len(alone.rejected)
    assert sum(r.events for r in reports) == alone.events
    assert all(r.lines == summary.lines for r in reports)


def test_tombstones_stay_in_the_database_and_still_stop_late_events_after_a_restart(ledger: LedgerHandle,
                                                                                   tmp_path: Path) -> None:
    from ledger import services
    from ledger.recorded import read_history
    from ledger.translator.translate import TranslatorSettings

    lines = _lines(SEED)
    ledger.replay(SEED)
    db = ledger.db
    deleted_claim = json.loads(lines[32])  # line 33: the DELETED train-0 claim
    deleted_pod = json.loads(lines[33])  # line 34: the DELETED train-0 pod
    claim_key = f"claim:{deleted_claim['object']['metadata']['uid']}"
    pod_key = f"pod:{deleted_pod['object']['metadata']['uid']}"
    with ledger.engine.connect() as conn:
        stored = {str(k): dict(v) for k, v in conn.execute(text("SELECT key, state FROM translator_state")).all()}
    assert stored[claim_key]["deleted"] is True and stored[pod_key]["deleted"] is True

    # A restarted worker loads live objects only ...
    state = db.load_state(ledger.cluster)
    assert claim_key not in state.entries and pod_key not in state.entries
    live = {k: v for k, v in stored.items() if not (k.startswith(("claim:", "pod:")) and v.get("deleted"))}
    assert state.entries == live  # the values as stored, whatever form memory keeps them in
    # ... and a late re-delivery of each (new receive time, so a new line) is recorded and ignored.
    late = tmp_path / "late.jsonl"
    late.write_text("\n".join(json.dumps({**x, "type": "MODIFIED", "observedAt": "2026-11-02T13:00:00Z"})
                              for x in (deleted_claim, deleted_pod)) + "\n")
    before = ledger.snapshot()
    report = services.ingest(db, read_history(late), cluster=ledger.cluster, state=state,
                             settings=TranslatorSettings(team_label=ledger.team_label))

    assert (report.recorded, report.events, report.rejected) == (2, 0, [])
    assert ledger.snapshot() == before
    assert claim_key not in state.entries and pod_key not in state.entries  # dropped again once written


def test_a_replay_failing_mid_file_commits_the_batch_in_flight_and_resumes(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    # A file replay writes batch N in a second thread while it translates batch N + 1. When reading the
    # file fails during batch 3, batch 2 (in flight) still commits, batch 3 writes nothing, the translator
    # memory is the database's again, and a second run records the rest: the same ledger as one clean run.
    from ledger import services
    from ledger.recorded import read_history
    from ledger.simulate import FleetSpec, write_history

    history = tmp_path / "fleet.jsonl"
    write_history(FleetSpec(nodes=3, gpus_per_node=4, hours=8.0, seed=3), history)
    lines = list(read_history(history))
    broken, clean = ledger_factory(), ledger_factory()
    clean.replay(history)

    def failing() -> Iterator[WatchLine | BrokenLine]:
        yield from lines[:100]
        raise OSError("the disk went away")

    state = broken.db.load_state(broken.cluster)
    with pytest.raises(OSError, match="the disk went away"):
        services.ingest(broken.db, failing(), cluster=broken.cluster, batch_size=40, state=state)

    assert _count(broken, "observations") == 80  # batches 1 and 2 of 40 lines; none of the 20 read of batch 3
    assert state.dirty == set()
    assert dict(state.entries) == dict(broken.db.load_state(broken.cluster).entries)
    resumed = services.ingest(broken.db, read_history(history), cluster=broken.cluster, batch_size=40, state=state)
    assert (resumed.duplicates, resumed.recorded + len(resumed.rejected)) == (80, len(lines) - 80)
    assert broken.snapshot() == clean.snapshot()


def test_the_duplicate_check_finds_every_stored_digest_whatever_its_characters(ledger: LedgerHandle) -> None:
    # known_digests sends a batch's digests as one comma-joined text the server splits, and keeps a list
    # parameter for digests the join cannot carry. An empty digest is one of those: string_to_array('', ',')
    # is the empty array, so a lone empty digest was never found and its line would be written twice. Keys
    # with a receive time are looked up by (time, digest), keys without one among the rows without one.
    from ledger.store import postgres as pg
    from ledger.store.postgres import ObservationRow

    digests = ["", ",", "a,b", "plain", " spaced "]
    times = [None, _t("2026-11-02T09:00:00Z"), None, _t("2026-11-02T09:00:00.000001Z"), _t("2026-11-02T10:00:00Z")]
    rows = [ObservationRow(digest=d, status="rejected", kind=None, api_version=None, namespace=None, name=None,
                           uid=None, resource_version=None, watch_type=None, observed_at=t,
                           recorded_at=_t("2026-11-02T09:00:00Z"), origin=f"test:{i}", error=f"reason {i}",
                           body=b"\"x\"") for i, (d, t) in enumerate(zip(digests, times, strict=True))]
    with ledger.engine.begin() as conn:
        pg.insert_observations(conn, ledger.cluster, rows)
    keys = list(zip(times, digests, strict=True))
    with ledger.engine.connect() as conn:
        for i, key in enumerate(keys):
            digest = key[1]
            assert pg.known_digests(conn, ledger.cluster, [key]) == {digest: f"reason {i}"}, digest
            assert pg.known_digests(conn, ledger.cluster, [key, (None, "absent"), (times[1], "absent")]) == {
                digest: f"reason {i}"}, digest
            # The same digest at another receive time is another key (a digest covers its line's time).
            other = _t("2026-11-02T11:00:00Z") if key[0] is None else None
            assert pg.known_digests(conn, ledger.cluster, [(other, digest)]) == {}, digest
        assert pg.known_digests(conn, ledger.cluster, keys) == {d: f"reason {i}" for i, d in enumerate(digests)}
        assert pg.known_digests(conn, ledger.cluster, []) == {}


def test_the_duplicate_check_looks_up_no_key_newer_than_the_newest_stored_observation(ledger: LedgerHandle) -> None:
    # A stored row matches a key only at the key's receive time, so keys after the cluster's newest observation
    # are answered by one max(observed_at) instead of a lookup; a key at that very time is still looked up.
    from ledger.store import postgres as pg
    from ledger.store.postgres import ObservationRow

    first, newest, later = _t("2026-11-02T09:00:00Z"), _t("2026-11-02T10:00:00Z"), _t("2026-11-02T10:00:00.000001Z")
    stored = [(first, "d-first"), (newest, "d-newest"), (None, "d-untimed")]
    rows = [ObservationRow(digest=d, status="rejected", kind=None, api_version=None, namespace=None, name=None,
                           uid=None, resource_version=None, watch_type=None, observed_at=t, recorded_at=first,
                           origin=f"test:{i}", error=f"reason {i}", body=b"\"x\"") for i, (t, d) in enumerate(stored)]
    with ledger.engine.begin() as conn:
        pg.insert_observations(conn, ledger.cluster, rows)
        elsewhere = msgspec.structs.replace(rows[0], observed_at=_t("2030-01-01T00:00:00Z"))
        pg.insert_observations(conn, "another", [elsewhere])
    def known(keys: list[tuple[datetime | None, str]]) -> tuple[dict[str, str | None], list[str]]:
        with statements_run(ledger.engine) as statements, ledger.engine.connect() as conn:
            found = pg.known_digests(conn, ledger.cluster, keys)
        return found, ["max" if "max(observed_at)" in sql else "lookup" for sql, _ in statements]

    # After the newest: only the max query runs (another cluster's later rows do not count).
    assert known([(later, "d-first"), (later, "d-newest")]) == ({}, ["max"])
    # At the newest instant itself: looked up, and found.
    assert known([(newest, "d-newest"), (later, "x")]) == ({"d-newest": "reason 1"}, ["max", "lookup"])
    # One key reaching back makes the whole batch looked up.
    assert known([(later, "x"), (first, "d-first")]) == ({"d-first": "reason 0"}, ["max", "lookup"])
    # Keys without a receive time are looked up whatever the times beside them.
    assert known([(later, "x"), (None, "d-untimed")]) == ({"d-untimed": "reason 2"}, ["max", "lookup"])
    # The max is read from the end of the unique key's index, not by a scan: cheap on any ledger.
    with ledger.engine.begin() as conn:
        conn.execute(text("ANALYZE observations"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))  # a small table is cheapest to scan whole
        plan = "\n".join(str(r[0]) for r in conn.execute(
            text("EXPLAIN SELECT max(observed_at) FROM observations WHERE cluster = :c"), {"c": ledger.cluster}))
    assert "Index Only Scan Backward using observations_cluster_observed_at_digest_key" in plan, plan


def test_a_live_broken_line_is_a_duplicate_at_its_receive_time_only(ledger: LedgerHandle) -> None:
    # A broken line of a live stream keeps its receive time, and observations are keyed by (time, digest): the
    # same delivery handed over twice is stored once, the same text received again later is a new observation.
    from ledger import services
    from ledger.recorded import broken_watch_line

    def line(minute: int) -> BrokenLine:
        return broken_watch_line(source="watch:ResourceClaim", line=1, reason="missing field 'type'",
                                 observed_at=_t(f"2026-11-02T09:{minute:02d}:00Z"), text='{"object": {}}')

    first = services.ingest(ledger.db, [line(0)], cluster=ledger.cluster)
    again = services.ingest(ledger.db, [line(0)], cluster=ledger.cluster)
    later = services.ingest(ledger.db, [line(5)], cluster=ledger.cluster)
    assert [(r.duplicates, len(r.rejected)) for r in (first, again, later)] == [(0, 1), (1, 1), (0, 1)]
    with ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT observed_at, status, error FROM observations ORDER BY observed_at")).all()
    assert [tuple(r) for r in stored] == [(_t("2026-11-02T09:00:00Z"), "rejected", "missing field 'type'"),
                                          (_t("2026-11-02T09:05:00Z"), "rejected", "missing field 'type'")]


class _WritesHeldBack:
    """Stands in for the pipelined ingest's one-thread executor: a write handed over runs at once, except the
    ``held``-th, which runs only when the executor shuts down (a write still in progress when the ingest fails)."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.submitted = 0
        self.pending: list[tuple[Any, Callable[[], None]]] = []

    def __enter__(self) -> _WritesHeldBack:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown(wait=True)

    def submit(self, fn: Callable[..., None], /, *args: Any, **kwargs: Any) -> Any:
        from concurrent.futures import Future

        future: Future[None] = Future()
        self.submitted += 1
        self.pending.append((future, lambda: fn(*args, **kwargs)))
        if self.submitted != self.held:
            self._run()
        return future

    def shutdown(self, wait: bool = True, **_: Any) -> None:
        self._run()

    def _run(self) -> None:
        while self.pending:
            future, call = self.pending.pop(0)
            try:
                call()
            except Exception as e:  # noqa: BLE001  # kept in the future, as the real executor does
                future.set_exception(e)
            else:
                future.set_result(None)


def test_an_error_right_after_a_batch_was_handed_to_the_writer_leaves_memory_equal_to_the_database(
        ledger: LedgerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Batch 2 is handed to the writer thread, then the ingest fails before it records that batch as in flight
    # (a MemoryError or a Ctrl-C while it lists the batch's digests). Its error handling waited only for the
    # batch it knew of and read the state back while batch 2 was still being written: batch 2 committed after
    # that, and the translator memory (reused by the caller) lacked it.
    from ledger import services
    from ledger.recorded import read_history
    from ledger.simulate import FleetSpec, write_history

    history = tmp_path / "fleet.jsonl"
    write_history(FleetSpec(nodes=3, gpus_per_node=4, hours=8.0, seed=3), history)
    made: list[object] = []

    def in_flight(*args: Any, **kwargs: Any) -> object:
        if len(made) == 1:
            raise MemoryError("while recording batch 2 as in flight")
        made.append(real_in_flight(*args, **kwargs))
        return made[-1]

    real_in_flight = services._InFlight
    monkeypatch.setattr(services, "_InFlight", in_flight)
    monkeypatch.setattr(services, "ThreadPoolExecutor", lambda **_: _WritesHeldBack(held=2))
    state = ledger.db.load_state(ledger.cluster)
    with pytest.raises(MemoryError):
        services.ingest(ledger.db, read_history(history), cluster=ledger.cluster, batch_size=40, state=state)

    assert _count(ledger, "observations") == 80  # both batches handed over committed
    assert dict(state.entries) == dict(ledger.db.load_state(ledger.cluster).entries)



def test_an_interrupt_while_the_write_waits_for_the_append_lock_stops_the_replay_at_once(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # Ctrl-C reaches the thread that reads and translates, never the writer thread. With the write of batch 1
    # waiting for the append lock (another session holds it), the interrupted replay waited for that write
    # without end: Ctrl-C, even repeated, did nothing until the other session let go, and then batch 1
    # committed after all. A sequential replay stops at once (psycopg cancels the statement it waits in).
    import threading
    import time

    from ledger import services
    from ledger.recorded import read_history
    from ledger.simulate import FleetSpec, write_history
    from ledger.store.postgres import APPEND_LOCK_KEY

    history = tmp_path / "fleet.jsonl"
    write_history(FleetSpec(nodes=3, gpus_per_node=4, hours=8.0, seed=3), history)
    lines = list(read_history(history))
    guard = 60.0  # only against a hang: the holder lets go after this even when the replay never returned
    locked, replay_returned = threading.Event(), threading.Event()
    outcome: list[str] = []

    def hold_the_append_lock() -> None:
        with ledger.engine.connect() as conn, conn.begin():
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": APPEND_LOCK_KEY})
            locked.set()
            outcome.append("replay returned first" if replay_returned.wait(guard) else "lock released first")

    def waiting_for_the_lock() -> bool:
        with ledger.engine.connect() as conn:
            return bool(conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")).scalar_one())

    def interrupted() -> Iterator[WatchLine | BrokenLine]:
        yield from lines[:40]  # batch 1: handed to the writer, which waits for the lock
        for _ in range(int(guard / 0.05)):
            if waiting_for_the_lock():
                break
            time.sleep(0.05)
        raise KeyboardInterrupt

    holder = threading.Thread(target=hold_the_append_lock)
    holder.start()
    try:
        assert locked.wait(guard)
        state = ledger.db.load_state(ledger.cluster)
        with pytest.raises(KeyboardInterrupt):
            services.ingest(ledger.db, interrupted(), cluster=ledger.cluster, batch_size=40, state=state)
    finally:
        replay_returned.set()
        holder.join()

    assert outcome == ["replay returned first"]
    assert _count(ledger, "observations") == 0  # batch 1 was stopped, not written once the lock came free
    assert dict(state.entries) == dict(ledger.db.load_state(ledger.cluster).entries)


def test_translator_state_rows_are_split_over_json_documents_of_bounded_size(
        ledger: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch's state rows go to the server as JSON documents {key: entry}. One jsonb value may not exceed
    # 268,435,455 bytes, which one document for a batch of 5,000 large pools did (a pool entry is ~850 bytes
    # per device), so documents are cut at STATE_DOCUMENT_CHARS. Here the bound is lowered to 10,000
    # characters so that 60 entries of ~1,000 need several documents: none is longer than the bound, together
    # they hold every entry once, and every row is stored as given (an entry longer than the bound goes alone).
    from ledger.store import postgres as pg

    monkeypatch.setattr(pg, "STATE_DOCUMENT_CHARS", 10_000)
    upserts = {f'pool:gpu.example.com/node-{i:02}"\\ü': json.dumps({"devices": "d" * (990 + i)}) for i in range(60)}
    upserts["pool:gpu.example.com/huge"] = json.dumps({"devices": "h" * 25_000})
    documents = list(pg._state_documents(upserts))
    assert len(documents) >= 7
    assert all(len(d) <= 10_000 for d in documents if '"h' not in d)
    assert sorted(k for d in documents for k in json.loads(d)) == sorted(upserts)
    with ledger.engine.begin() as conn:
        pg.save_state_rows(conn, ledger.cluster, pg.StateRows(upserts=upserts, deletes=[]), appends=0)
    with ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT key, state::text FROM translator_state WHERE cluster = :c"),
                            {"c": ledger.cluster}).all()
    stored: dict[str, str] = {str(k): str(v) for k, v in rows}
    assert {k: json.loads(v) for k, v in stored.items()} == {k: json.loads(v) for k, v in upserts.items()}
