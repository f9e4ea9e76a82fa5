"""Reading recorded histories and kubectl output (``ledger.recorded``): formats, lines, never raising."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ledger.errors import Invalid
from ledger.recorded import (
    MAX_DEPTH,
    MAX_TEXT_CHARS,
    BrokenLine,
    WatchLine,
    parse_duration,
    parse_time,
    read_history,
    read_text,
)
from tests.paths import HISTORIES, REAL

SEED_LAB = HISTORIES / "seed-lab.jsonl"
T = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)

# Counted by hand in each file: `- apiVersion:` entries under `items:` for Lists, else one object.
REAL_FILES: dict[str, tuple[int, str]] = {
    "cni-dra-driver_deviceclass_network-interface_v1.yaml": (1, "DeviceClass"),
    "cni-dra-driver_resourceslice_eth0-consumable-capacity-metadata-gen71_v1.yaml": (1, "ResourceSlice"),
    "devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml": (1, "ResourceClaim"),
    "devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml": (1, "ResourceSlice"),
    "devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml": (1, "ResourceSlice"),
    "dra-driver-cpu_resourceclaim_pending-2-capacity-requests-distinctattribute-numa_v1.yaml": (
        1,
        "ResourceClaim",
    ),
    "dranet-gke_deviceclass_dranet_v1beta1.yaml": (1, "DeviceClass"),
    "dranet-gke_resourceclaim_allocationmode-all-8nics_v1beta1.yaml": (1, "ResourceClaim"),
    "dranet-gke_resourceclaimtemplate_count-8-rdma-nics_v1beta1.yaml": (1, "ResourceClaimTemplate"),
    "example-driver_pod_claim-from-template-no-status_v1.yaml": (1, "Pod"),
    "example-driver_pod_extended-resource-limit-implicit-deviceclass-name_v1.yaml": (1, "Pod"),
    "example-driver_resourceclaim_pending-capacity-requests-memory-compute_v1.yaml": (1, "ResourceClaim"),
    "example-driver_resourceclaimtemplate_adminaccess-allocationmode-all_v1.yaml": (
        1,
        "ResourceClaimTemplate",
    ),
    "example-driver_resourceclaimtemplate_firstavailable-3-subrequests_v1.yaml": (1, "ResourceClaimTemplate"),
    "example-driver_resourceclaimtemplate_toleration-noexecute_v1.yaml": (1, "ResourceClaimTemplate"),
    "example-driver_resourceslice-list_8gpus-basic-wrapper-same-uid-as-v1_v1beta1.yaml": (1, "ResourceSlice"),
    "example-driver_resourceslice-list_8gpus_v1.yaml": (1, "ResourceSlice"),
    "google-tpu_resourceslice-list_2-tpus-duplicate-uuid-no-owner_v1beta1.yaml": (1, "ResourceSlice"),
    "k8s-api-testdata_resourceclaim_every-field_v1.yaml": (1, "ResourceClaim"),
    "k8s-api-testdata_resourceslice_every-field_v1.yaml": (1, "ResourceSlice"),
    "k8s-website-examples_resourceclaim_some-gpu-manifest-odd-indentation-no-eol_v1.yaml": (
        1,
        "ResourceClaim",
    ),
    "k8s-website-tutorial_resourceclaim-list_some-gpu-allocated-reserved_v1beta2.yaml": (1, "ResourceClaim"),
    "kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml": (1, "ResourceSlice"),
    "kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml": (
        1,
        "ResourceSlice",
    ),
    "kep5004_deviceclass_extendedresourcename-example.com-gpu_v1beta1.yaml": (1, "DeviceClass"),
    "kubevirt-vep_pod_resourceclaimstatuses-template-claim_v1.yaml": (1, "Pod"),
    "kubevirt-vep_resourceclaim_from-template-allocated-pgpu0_v1.yaml": (1, "ResourceClaim"),
    "kueue_resourceclaimtemplate_capacity-request-qualified-name-4Gi_v1.yaml": (1, "ResourceClaimTemplate"),
    "nvidia-gpu_deviceclass_mig-1g12gb-extendedresourcename_v1.yaml": (1, "DeviceClass"),
    "nvidia-gpu_pod_extended-resource-limit-mig-1g12gb_v1.yaml": (1, "Pod"),
    "nvidia-gpu_resourceclaim_extended-resource-claim-mig-1g12gb-scheduler-generated_v1.yaml": (
        1,
        "ResourceClaim",
    ),
    "nvidia-gpu_resourceclaimtemplate_4-mig-requests-matchattribute-parentuuid_v1beta1.yaml": (
        1,
        "ResourceClaimTemplate",
    ),
    "vks-v1.35_resourceslice-list_gpu-and-compute-domain-4nodes_v1.yaml": (8, "ResourceSlice"),
    "vks-v1.36_resourceclaim-list_from-template-allocated-reserved_v1.yaml": (1, "ResourceClaim"),
    "vks-v1.36_resourceslice-list_vgpu-2nodes_v1.yaml": (2, "ResourceSlice"),
}

# What `kubectl get resourceclaims -o json --watch --output-watch-events` prints: one pretty-printed
# document per event, each starting in column 0. Events start on lines 1, 14 and 29.
KUBECTL_WATCH = """\
{
    "type": "ADDED",
    "object": {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "some-gpu",
            "namespace": "default",
            "resourceVersion": "100"
        }
    }
}

{
    "type": "MODIFIED",
    "object": {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "some-gpu",
            "namespace": "default",
            "resourceVersion": "101"
        },
        "status": {
            "allocation": {"devices": {"results": []}}
        }
    }
}
{
    "type": "DELETED",
    "object": {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "some-gpu",
            "namespace": "default",
            "resourceVersion": "102"
        }
    }
}
"""

RESOURCE_SLICE_LIST = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSliceList
metadata:
  resourceVersion: "42"
items:
- metadata:
    name: node-a-gpu
  spec:
    driver: gpu.example.com
    pool: {name: node-a, generation: 1, resourceSliceCount: 1}
- apiVersion: resource.k8s.io/v1beta1
  kind: ResourceSlice
  metadata:
    name: node-b-gpu
"""


def split(results: Iterable[WatchLine | BrokenLine]) -> tuple[list[WatchLine], list[BrokenLine]]:
    """Partition read results into watch lines and broken lines, keeping order."""
    watch: list[WatchLine] = []
    broken: list[BrokenLine] = []
    for result in results:
        if isinstance(result, WatchLine):
            watch.append(result)
        else:
            broken.append(result)
    return watch, broken


def read_ok(text: str, *, at: datetime | None = None) -> list[WatchLine]:
    """Read ``text`` and fail the test if any BrokenLine comes out."""
    watch, broken = split(read_text(text, source="test", at=at))
    assert broken == []
    return watch


def history_ok(path: Path, *, at: datetime | None = None) -> list[WatchLine]:
    """Read the file at ``path`` and fail the test if any BrokenLine comes out."""
    watch, broken = split(read_history(path, at=at))
    assert broken == []
    return watch


def seed_lines() -> list[str]:
    return SEED_LAB.read_text(encoding="utf-8").splitlines()


# --- Format 1: recorded JSON Lines ---------------------------------------------------------------


def test_the_seed_lab_history_reads_as_39_watch_lines_with_their_observed_times() -> None:
    watch, broken = split(read_history(SEED_LAB))

    assert broken == []
    assert len(watch) == 39
    assert [w.line for w in watch] == list(range(1, 40))
    assert {w.source for w in watch} == {str(SEED_LAB)}
    first, last = watch[0], watch[-1]
    assert first.type == "ADDED"
    assert first.observed_at == datetime(2026, 11, 2, 9, 0, 1, tzinfo=UTC)
    assert first.object["kind"] == "Namespace"
    assert last.type == "BOOKMARK"
    assert last.observed_at == datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
    assert last.object == {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"resourceVersion": "1037"},
    }


def test_a_truncated_line_in_the_middle_is_broken_and_both_neighbours_still_read(tmp_path: Path) -> None:
    first, middle, last = seed_lines()[:3]
    path = tmp_path / "cut.jsonl"
    path.write_text(f"{first}\n\n{middle[: len(middle) // 2]}\n{last}\n", encoding="utf-8")

    results = list(read_history(path))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, WatchLine]
    before, broken, after = results
    assert isinstance(broken, BrokenLine)
    assert (before.line, broken.line, after.line) == (1, 3, 4)
    assert broken.reason.startswith("invalid JSON: ")
    assert "(column " in broken.reason
    assert broken.source == str(path)
    assert broken.text == middle[: len(middle) // 2]


def test_a_line_that_decodes_but_is_refused_keeps_its_text_and_digest(tmp_path: Path) -> None:
    # JSON Lines are decoded from the bytes read; a refused one becomes text only then: it must be the line's own.
    first = seed_lines()[0]
    no_time = '{"type":"ADDED","object":{"kind":"Namespace","metadata":{"name":"équipe-ü"}}}'
    error = '{"type":"ERROR","object":{"kind":"Status","message":"trop ancien: résumé"}}'
    path = tmp_path / "refused.jsonl"
    path.write_bytes(f"{first}\r\n{no_time}\r\n{error}\n".encode())

    results = list(read_history(path))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, BrokenLine]
    missing, status = results[1], results[2]
    assert isinstance(missing, BrokenLine) and isinstance(status, BrokenLine)
    assert (missing.line, missing.text) == (2, no_time)
    assert missing.reason == "missing field 'observedAt' (and no default time given)"
    assert missing.digest == hashlib.sha256(no_time.encode()).hexdigest()
    assert (status.line, status.text) == (3, error)
    assert status.digest == hashlib.sha256(error.encode()).hexdigest()


def test_a_line_observed_in_the_last_hour_a_query_takes_is_read() -> None:
    (line,) = read_ok('{"observedAt": "9999-01-01T00:30:00+01:00", "type": "ADDED", '
                      '"object": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}}}')

    assert line.observed_at == datetime(9998, 12, 31, 23, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[1, 2]", "not a JSON object (found array)"),
        ('{"observedAt": "2026-11-02T09:00:00Z", "object": {}}', "missing field 'type'"),
        ('{"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED"}', "missing field 'object'"),
        (
            '{"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED", "object": []}',
            "object: not a JSON object",
        ),
        ('{"observedAt": "2026-11-02T09:00:00Z", "type": "UPDATED", "object": {}}', "type: 'UPDATED' is not"),
        (
            '{"observedAt": "2026-11-02T09:00:00", "type": "ADDED", "object": {}}',
            "observedAt: not an RFC 3339",
        ),
        ('{"observedAt": 1762074000, "type": "ADDED", "object": {}}', "observedAt: not an RFC 3339"),
        # Past the latest time a query takes: what the line records could never be asked about.
        ('{"observedAt": "9999-12-31T23:30:00Z", "type": "ADDED", "object": {}}',
         "observedAt: '9999-12-31T23:30:00Z' is too far in the future: no query can ask about it (the latest time "
         "accepted is 9998-12-31T23:59:59.999999Z)"),
        ('{"observedAt": "9999-01-01T01:30:00+01:00", "type": "ADDED", "object": {}}',
         "observedAt: '9999-01-01T01:30:00+01:00' is too far in the future"),
        # Past year 9999 in UTC (datetime cannot hold it): the same words, not "out of range".
        ('{"observedAt": "9999-12-31T23:30:00-05:00", "type": "ADDED", "object": {}}',
         "observedAt: '9999-12-31T23:30:00-05:00' is too far in the future: no query can ask about it"),
        ('{"type": "ADDED", "object": {}}', "missing field 'observedAt'"),
        (
            '{"observedAt": "2026-11-02T09:00:00Z", "type": "ERROR", "object": {"message": "too old"}}',
            "type: ERROR events cannot be replayed (message: 'too old')",
        ),
    ],
)
def test_a_json_line_with_a_bad_envelope_is_broken_at_its_line(line: str, reason: str) -> None:
    good = seed_lines()[0]

    results = list(read_text(f"{good}\n{line}\n{good}", source="h.jsonl"))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, WatchLine]
    broken = results[1]
    assert isinstance(broken, BrokenLine)
    assert broken.line == 2
    assert broken.reason.startswith(reason), broken.reason


def test_a_json_line_without_observed_at_takes_the_given_time_and_its_own_time_wins() -> None:
    text = (
        '{"type": "ADDED", "object": {"kind": "Pod"}}\n'
        '{"observedAt": "2026-11-02T10:00:00+01:00", "type": "DELETED", "object": {"kind": "Pod"}}\n'
    )

    watch = read_ok(text, at=T)

    assert [w.observed_at for w in watch] == [T, datetime(2026, 11, 2, 9, 0, tzinfo=UTC)]


def test_a_damaged_first_line_does_not_hide_that_the_file_is_json_lines() -> None:
    lines = seed_lines()
    text = "\n".join([lines[0][:40], *lines[1:4]])

    results = list(read_text(text, source="h.jsonl"))

    assert [type(r) for r in results] == [BrokenLine, WatchLine, WatchLine, WatchLine]
    assert all(r.observed_at is not None for r in results if isinstance(r, WatchLine))


@pytest.mark.parametrize("first", [b"garbage", b"# copied from the cluster on Monday", b"\xff\xfe not text",
                                   b"- a: 1"])
def test_a_first_line_that_is_not_json_is_one_broken_line_not_the_whole_file(tmp_path: Path, first: bytes) -> None:
    # Read as YAML, text above the events once made the whole file a single bad document (nothing recorded).
    lines = seed_lines()
    path = tmp_path / "pasted.jsonl"
    path.write_bytes(first + b"\n" + "\n".join(lines).encode() + b"\n")

    results = list(read_history(path))

    assert [type(r) for r in results] == [BrokenLine] + [WatchLine] * len(lines)
    assert results[0].line == 1
    assert [r.line for r in results[1:]] == list(range(2, len(lines) + 2))


def test_several_damaged_lines_before_the_first_event_are_each_broken() -> None:
    lines = seed_lines()
    text = "\n".join(["oops", lines[0][:30], "", "not json either", *lines[:3]])

    results = list(read_text(text, source="h.jsonl"))

    assert [(type(r), r.line) for r in results] == [(BrokenLine, 1), (BrokenLine, 2), (BrokenLine, 4),
                                                    (WatchLine, 5), (WatchLine, 6), (WatchLine, 7)]


def test_lines_that_are_not_utf8_are_broken_and_the_rest_of_the_file_reads(tmp_path: Path) -> None:
    first, second = seed_lines()[:2]
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + first.encode() + b"\n" + b'{"caf\xe9"}\n' + second.encode() + b"\n")

    results = list(read_history(path))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, WatchLine]
    assert isinstance(results[1], BrokenLine)
    assert results[1].reason.startswith("not UTF-8")
    assert results[1].digest == hashlib.sha256(b'{"caf\xe9"}').hexdigest()


def test_two_files_joined_read_as_one_though_the_second_starts_with_a_byte_order_mark(tmp_path: Path) -> None:
    # `cat a.jsonl b.jsonl` where b was written with a BOM: the mark then opens a line inside the file.
    lines = seed_lines()[:4]
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes("\n".join(lines[:2]).encode() + b"\n\xef\xbb\xbf" + "\n".join(lines[2:]).encode() + b"\n")
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")

    results = list(read_history(joined))

    assert [type(r) for r in results] == [WatchLine] * 4
    assert [r.digest for r in results] == [r.digest for r in read_history(plain)]
    assert [r.digest for r in read_text(joined.read_text(encoding="utf-8"), source="joined.jsonl")] == [
        r.digest for r in results]


def _class_yaml(name: str) -> bytes:
    return f"apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: {name}\n  uid: u-{name}\n".encode()


def test_a_yaml_document_with_bytes_that_are_not_utf8_is_rejected_once_and_the_others_are_read(
        tmp_path: Path) -> None:
    bad = b"apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: caf\xe9\n  uid: u-bad\n"
    path = tmp_path / "classes.yaml"
    path.write_bytes(_class_yaml("first") + b"---\n" + bad + b"---\n" + _class_yaml("third"))

    results = list(read_history(path, at=T))

    # Lines: first 1-5, '---' 6, bad 7-11 (the byte on line 10), '---' 12, third 13-17.
    assert [(type(r), r.line) for r in results] == [(WatchLine, 1), (BrokenLine, 7), (WatchLine, 13)]
    broken = results[1]
    assert isinstance(broken, BrokenLine)
    # Line 10 is "  name: caf\xe9": the byte follows 2 + 6 + 3 characters, and starts a sequence the line ends.
    assert broken.reason == "not UTF-8: unexpected end of data at byte 11 on line 10; the document is not read"
    # Digested as a broken YAML document is: its text from the '---' that opens it (recorded once, however often
    # the file is replayed).
    assert broken.digest == hashlib.sha256(b"---\n" + bad.rstrip(b"\n")).hexdigest()
    assert [r.object["metadata"] for r in results if isinstance(r, WatchLine)] == [
        {"name": "first", "uid": "u-first"}, {"name": "third", "uid": "u-third"}]


def test_json_documents_with_bytes_that_are_not_utf8_reject_only_the_document_holding_them(tmp_path: Path) -> None:
    def doc(name: bytes) -> bytes:
        return (b'{\n  "apiVersion": "resource.k8s.io/v1",\n  "kind": "DeviceClass",\n  "metadata": {"name": "'
                + name + b'", "uid": "u"}\n}\n')

    path = tmp_path / "classes.json"
    path.write_bytes(doc(b"first") + doc(b"caf\xe9") + doc(b"third"))

    results = list(read_history(path, at=T))

    assert [(type(r), r.line) for r in results] == [(WatchLine, 1), (BrokenLine, 6), (WatchLine, 11)]
    assert isinstance(results[1], BrokenLine)
    # Line 9 is '  "metadata": {"name": "caf\xe9", ...': 2 + 12 + 10 + 3 bytes before it, a quote after it.
    assert results[1].reason == ("not UTF-8: invalid continuation byte at byte 27 on line 9; "
                                 "the document is not read")


@pytest.mark.parametrize(("content", "reason"), [
    # Random bytes with newlines in them: one rejection, not one per line plus one for the YAML after them.
    (bytes(range(128, 256)) + b"\n\x00\x01\n" + bytes(range(200, 256)),
     "not UTF-8: invalid start byte at byte 0 on line 1; the document is not read"),
    ("{}\n".encode("utf-16"), "not UTF-8: invalid start byte at byte 0 on line 1; the document is not read"),
    # The bad byte on the second line: still one rejection, reported where the document starts.
    (b"hello\n\xff\n", "not UTF-8: invalid start byte at byte 0 on line 2; the document is not read"),
])
def test_a_file_of_bytes_that_are_not_utf8_is_one_rejected_document(tmp_path: Path, content: bytes,
                                                                     reason: str) -> None:
    path = tmp_path / "garbage.bin"
    path.write_bytes(content)

    results = list(read_history(path, at=T))

    assert [(type(r), r.line) for r in results] == [(BrokenLine, 1)]
    assert isinstance(results[0], BrokenLine)
    assert results[0].reason == reason


def test_broken_text_is_cut_to_4096_characters_but_digested_whole() -> None:
    long_line = '{"type": "ADDED", "object": {"kind": "Pod", "x": "' + "y" * 10_000
    good = seed_lines()[0]

    broken = [r for r in read_text(f"{good}\n{long_line}", source="h") if isinstance(r, BrokenLine)]

    assert len(broken) == 1
    assert len(broken[0].text) == MAX_TEXT_CHARS
    assert broken[0].digest == hashlib.sha256(long_line.encode()).hexdigest()


# --- Format 2: kubectl --output-watch-events ----------------------------------------------------


def test_kubectl_watch_events_read_as_three_lines_at_their_start_lines() -> None:
    watch = read_ok(KUBECTL_WATCH)

    assert [(w.line, w.type) for w in watch] == [(1, "ADDED"), (14, "MODIFIED"), (29, "DELETED")]
    assert [w.object["metadata"] for w in watch] == [
        {"name": "some-gpu", "namespace": "default", "resourceVersion": str(rv)} for rv in (100, 101, 102)
    ]
    assert all(w.observed_at is None for w in watch)
    assert all(w.observed_at == T for w in read_ok(KUBECTL_WATCH, at=T))


def test_a_watch_document_broken_midway_is_reported_and_reading_resumes_at_the_next_document() -> None:
    lines = KUBECTL_WATCH.splitlines()
    # Cut the MODIFIED event (lines 14-28) after its metadata name, as a killed kubectl would.
    text = "\n".join(lines[:13] + lines[13:20] + lines[28:])

    results = list(read_text(text, source="watch.json"))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, WatchLine]
    broken, after = results[1], results[2]
    assert isinstance(broken, BrokenLine)
    assert broken.line == 14
    assert broken.reason.startswith("invalid JSON: ")
    assert broken.text.startswith('{\n    "type": "MODIFIED"')
    assert isinstance(after, WatchLine)
    assert (after.line, after.type) == (21, "DELETED")


def test_garbage_between_watch_documents_is_broken_and_skipped() -> None:
    lines = KUBECTL_WATCH.splitlines()
    text = "\n".join([*lines[:13], "W1102 09:00:00 warning from kubectl", *lines[13:]])

    results = list(read_text(text, source="watch.json"))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, WatchLine, WatchLine]
    assert [r.line for r in results] == [1, 14, 15, 30]


# --- Format 3: Lists and objects in YAML or JSON ------------------------------------------------


@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_every_real_fixture_reads_without_broken_lines(name: str) -> None:
    count, kind = REAL_FILES[name]
    path = REAL / name

    watch, broken = split(read_history(path, at=T))

    assert broken == []
    assert len(watch) == count
    assert {w.object["kind"] for w in watch} == {kind}
    assert {(w.type, w.observed_at) for w in watch} == {("ADDED", T)}
    assert all(json.loads(json.dumps(w.object)) == w.object for w in watch)  # only JSON types


def test_the_real_fixture_table_lists_every_file() -> None:
    assert {p.name for p in REAL.glob("*.yaml")} == set(REAL_FILES)


def test_list_items_start_at_their_own_line_in_yaml() -> None:
    watch = list(read_history(REAL / "vks-v1.35_resourceslice-list_gpu-and-compute-domain-4nodes_v1.yaml"))

    assert [w.line for w in watch] == [3, 38, 88, 123, 173, 208, 258, 293]


def test_a_leading_comment_is_skipped_and_the_object_starts_after_it() -> None:
    watch = list(read_history(REAL / "example-driver_resourceclaimtemplate_firstavailable-3-subrequests_v1.yaml"))

    assert [w.line for w in watch] == [3]


def test_the_item_cut_out_of_a_truncated_list_reads_as_one_claim() -> None:
    (claim,) = list(read_history(REAL / "dranet-gke_resourceclaim_allocationmode-all-8nics_v1beta1.yaml"))

    assert isinstance(claim, WatchLine)
    assert (claim.line, claim.object["apiVersion"]) == (1, "resource.k8s.io/v1beta1")
    metadata = claim.object["metadata"]
    assert isinstance(metadata, dict)
    assert metadata["name"] == "nccl-gib-test-0-rdma-net-interface-mdsfv"
    status = claim.object["status"]
    assert isinstance(status, dict)
    assert "reservedFor" not in status  # the author cut the output after the results


def test_the_same_list_gives_the_same_objects_as_plain_yaml_parsing() -> None:
    path = REAL / "vks-v1.36_resourceslice-list_vgpu-2nodes_v1.yaml"
    as_json = json.dumps({"apiVersion": "v1", "kind": "List", "items": [w.object for w in history_ok(path)]})

    again = read_ok(as_json)

    assert [w.object for w in again] == [w.object for w in history_ok(path)]
    assert [w.line for w in again] == [1, 1]  # JSON items share their List's line


def test_yaml_timestamps_and_other_non_json_scalars_stay_strings() -> None:
    text = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: c
  creationTimestamp: 2025-06-12T17:01:57Z
  deletionTimestamp: !!timestamp 2025-06-12 17:01:57
  labels:
    day: 2025-06-12
    operator: =
data: !!binary aGVsbG8=
2: two
yes: on
null: ~
"""
    (claim,) = read_ok(text)

    assert claim.object["metadata"] == {
        "name": "c",
        "creationTimestamp": "2025-06-12T17:01:57Z",
        "deletionTimestamp": "2025-06-12 17:01:57",
        "labels": {"day": "2025-06-12", "operator": "="},
    }
    assert claim.object["data"] == "aGVsbG8="
    assert (claim.object["2"], claim.object["true"], claim.object["null"]) == ("two", True, None)


def test_items_of_a_typed_list_inherit_api_version_and_kind_when_they_lack_them() -> None:
    watch = read_ok(RESOURCE_SLICE_LIST)

    assert [(w.line, w.object["apiVersion"], w.object["kind"]) for w in watch] == [
        (6, "resource.k8s.io/v1", "ResourceSlice"),
        (11, "resource.k8s.io/v1beta1", "ResourceSlice"),
    ]
    assert watch[0].object["spec"] == {
        "driver": "gpu.example.com",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
    }


def test_items_of_a_plain_list_must_name_their_kind() -> None:
    text = '{"apiVersion": "v1", "kind": "List", "items": [{"metadata": {}}, 3, {"kind": "Pod"}]}'

    results = list(read_text(text, source="l.json"))

    assert [type(r) for r in results] == [BrokenLine, BrokenLine, WatchLine]
    assert [r.reason for r in results if isinstance(r, BrokenLine)] == [
        "items[0]: missing field 'kind'",
        "items[1]: not an object (found number)",
    ]


def test_the_given_time_is_applied_to_every_list_item_and_changes_their_digests() -> None:
    path = REAL / "vks-v1.36_resourceslice-list_vgpu-2nodes_v1.yaml"

    at_t = history_ok(path, at=T)
    untimed = history_ok(path)

    assert [w.observed_at for w in at_t] == [T, T]
    assert [w.observed_at for w in untimed] == [None, None]
    assert {w.digest for w in at_t}.isdisjoint(w.digest for w in untimed)


def test_a_broken_yaml_document_is_reported_and_the_next_documents_still_read() -> None:
    text = """\
# three documents
apiVersion: v1
kind: ConfigMap
metadata: {name: one}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: two
   bad: indentation
---
apiVersion: v1
kind: ConfigMap
metadata: {name: three}
---
"""
    results = list(read_text(text, source="docs.yaml"))

    assert [type(r) for r in results] == [WatchLine, BrokenLine, WatchLine]
    broken = results[1]
    assert isinstance(broken, BrokenLine)
    assert broken.line == 6  # its first line after the `---` marker, as the good documents are counted
    assert broken.reason.startswith("invalid YAML: ")
    assert "line 10" in broken.reason
    assert [r.line for r in results] == [2, 6, 12]


def test_a_yaml_document_that_gives_a_key_twice_is_broken_and_the_next_document_still_reads() -> None:
    text = """\
apiVersion: v1
kind: Namespace
kind: Pod
metadata: {name: one}
---
apiVersion: v1
kind: Namespace
metadata: {name: two, labels: {team: a, "yes": b, true: c}}
"""
    results = list(read_text(text, source="twice.yaml"))

    assert [type(r) for r in results] == [BrokenLine, WatchLine]
    broken, good = results
    assert isinstance(broken, BrokenLine) and isinstance(good, WatchLine)
    # PyYAML kept the last: a Pod named one, recorded although the API server refuses such a document.
    assert broken.reason.startswith("invalid YAML: while reading a mapping: found the key 'kind' twice"), broken.reason
    assert "line 3" in broken.reason
    # A key YAML reads as a boolean is no repeat of the string "yes"; kept as the JSON conversion decides.
    assert good.object["metadata"] == {"name": "two", "labels": {"team": "a", "yes": "b", "true": "c"}}


def test_a_secret_with_a_type_field_is_an_object_not_a_watch_event() -> None:
    (secret,) = read_ok('{"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {}}')

    assert (secret.type, secret.object["type"]) == ("ADDED", "Opaque")


def test_a_single_pretty_printed_watch_event_is_a_watch_event() -> None:
    (event,) = read_ok(KUBECTL_WATCH.split("\n\n")[0])

    assert (event.type, event.object["kind"]) == ("ADDED", "ResourceClaim")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("just some words\n", "not a Kubernetes object (found string)"),
        ("- a\n- b\n", "not a Kubernetes object (found array)"),
        ("metadata: {name: x}\n", "missing field 'kind'"),
        ("kind: List\nitems: {a: 1}\n", "items: not a list (found object)"),
        ("kind: Pod\nx: !!python/object:os.system {}\n", "invalid YAML: "),
        ("kind: Pod\nx: !!int nope\n", "invalid YAML: "),
        ("a: &a [*a]\nkind: Pod\n", "invalid YAML: recursive alias"),
    ],
)
def test_yaml_that_is_not_a_kubernetes_object_is_broken(text: str, reason: str) -> None:
    (broken,) = list(read_text(text, source="x.yaml"))

    assert isinstance(broken, BrokenLine)
    assert broken.reason.startswith(reason), broken.reason


# --- Times and digests --------------------------------------------------------------------------


def test_parse_time_rejects_a_time_without_a_zone() -> None:
    with pytest.raises(Invalid):
        parse_time("2026-11-02T09:00:00")


@pytest.mark.parametrize("value", ["", "yesterday", "2026-11-02", "2026-13-02T09:00:00Z", "2026-11-02T09:00:00+25:00"])
def test_parse_time_rejects_garbage(value: str) -> None:
    with pytest.raises(Invalid):
        parse_time(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-02T09:00:00.123456Z", datetime(2026, 11, 2, 9, 0, 0, 123456, tzinfo=UTC)),
        ("2026-11-02T09:00:00Z", datetime(2026, 11, 2, 9, 0, tzinfo=UTC)),
        ("2026-11-02T10:30:00+01:30", datetime(2026, 11, 2, 9, 0, tzinfo=UTC)),
        ("2026-11-02T09:00:00.123456789-00:00", datetime(2026, 11, 2, 9, 0, 0, 123456, tzinfo=UTC)),
    ],
)
def test_parse_time_accepts_rfc3339_with_a_zone_and_returns_utc(value: str, expected: datetime) -> None:
    parsed = parse_time(value)

    assert parsed == expected
    assert parsed.tzinfo is UTC


def test_identical_content_gives_identical_digests_whatever_the_format_or_source() -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}}
    recorded = json.dumps({"observedAt": "2026-11-02T09:30:00.000000Z", "type": "ADDED", "object": obj})
    pretty = json.dumps({"type": "ADDED", "object": dict(reversed(obj.items()))}, indent=4)
    as_yaml = "kind: Pod\napiVersion: v1\nmetadata:\n  namespace: n\n  name: p\n"

    digests = {
        w.digest for text in (recorded, pretty, as_yaml, recorded) for w in read_text(text, source=f"{len(text)}", at=T)
    }
    other_time = {w.digest for w in read_text(pretty, source="s", at=datetime(2026, 1, 1, tzinfo=UTC))}

    assert len(digests) == 1
    assert other_time.isdisjoint(digests)


def test_broken_lines_have_the_same_digest_in_any_file() -> None:
    text = '{"type": "ADDED", "object": {"kind": "Pod"}}\n{"truncated'

    digests = {
        r.digest for source in ("a", "b") for r in read_text(text, source=source, at=T) if isinstance(r, BrokenLine)
    }

    assert digests == {hashlib.sha256(b'{"truncated').hexdigest()}


def test_a_naive_time_is_refused_at_once() -> None:
    with pytest.raises(Invalid):
        read_text("", source="x", at=datetime(2026, 11, 2, 9, 0))


# --- Never raising ------------------------------------------------------------------------------


def fixture_texts() -> list[str]:
    texts = [p.read_text(encoding="utf-8") for p in sorted(REAL.glob("*.yaml"))]
    return [*texts, SEED_LAB.read_text(encoding="utf-8"), KUBECTL_WATCH, RESOURCE_SLICE_LIST]


@pytest.mark.parametrize("cut_every", [37, 101])
def test_every_truncation_of_every_input_reads_without_raising(cut_every: int) -> None:
    for text in fixture_texts():
        for cut in range(0, len(text), cut_every):
            for result in read_text(text[:cut], source="cut"):
                assert isinstance(result, WatchLine | BrokenLine)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n  \n",
        "{",
        "}",
        "\x00\x01",
        "[" * 100_000,
        "{" + '"a":[' * 100_000,
        "a: " + "[" * 100_000,
        "kind: Pod\nx: " + "- " * 5000 + "1\n",
        '{"type": "ADDED", "object": {"kind": "Pod", "n": ' + "9" * 5000 + "}}",
        "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
        + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
        + "kind: Pod\n",
        "kind: Pod\nx: !!timestamp not-a-time\n",
        "kind: Pod\n? [a, b]\n: c\n",
        "%YAML 1.1\n---\nkind: Pod\n",
        "--- |\n  text\n",
        "kind: Pod\n...\nkind: Pod\n",
    ],
)
def test_hostile_input_never_raises(text: str) -> None:
    for result in read_text(text, source="hostile"):
        assert isinstance(result, WatchLine | BrokenLine)


def _nested_claim_line(levels: int) -> str:
    """A watch line whose object is ``levels`` deep: the object itself, its annotations, then arrays."""
    arrays = levels - 3  # object -> metadata -> annotations -> "a": [[...]]
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {"a": "["}}}
    text = json.dumps({"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED", "object": obj})
    return text.replace('"a": "["', '"a": ' + "[" * arrays + "]" * arrays, 1)


def test_an_object_nested_to_the_limit_is_read_and_one_level_more_is_a_broken_line() -> None:
    at_limit = read_ok(_nested_claim_line(MAX_DEPTH))
    watch, broken = split(read_text(_nested_claim_line(MAX_DEPTH + 1), source="test"))

    assert len(at_limit) == 1 and at_limit[0].object["kind"] == "Pod"
    assert watch == []
    assert [b.reason for b in broken] == [f"object: nested too deeply (more than {MAX_DEPTH} levels of objects and "
                                          "arrays)"]


def test_a_nul_escape_in_any_string_is_flagged_and_a_plain_object_is_not() -> None:
    plain = read_ok('{"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED", "object": '
                    '{"kind": "Pod", "metadata": {"name": "p"}}}')
    in_key = read_ok('{"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED", "object": '
                     '{"kind": "Pod", "metadata": {"name": "p", "labels": {"a\\u0000": "x"}}}}')
    in_value = read_ok('{"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED", "object": '
                       '{"kind": "Pod", "metadata": {"name": "p\\u0000"}}}')

    assert [x.holds_nul for x in plain + in_key + in_value] == [False, True, True]


@pytest.mark.parametrize(("value", "expected"), [
    ("PT30M", timedelta(minutes=30)), ("P1DT2H", timedelta(days=1, hours=2)), ("P2W", timedelta(weeks=2)),
    ("PT0.5S", timedelta(seconds=0.5)), ("1800", timedelta(minutes=30)), ("0.25", timedelta(seconds=0.25)),
])
def test_a_duration_is_iso_8601_or_seconds(value: str, expected: timedelta) -> None:
    assert parse_duration(value, "minIdle") == expected


@pytest.mark.parametrize(("value", "reason"), [
    ("PT1H1H", "ISO 8601"), ("PT30M30M", "ISO 8601"), ("PT1M1H", "ISO 8601"), ("P", "ISO 8601"), ("PT", "ISO 8601"),
    ("soon", "ISO 8601"), ("1 day", "ISO 8601"), ("P1M", "no fixed length"), ("P1Y2D", "no fixed length"),
    ("P1.5W1D", "ISO 8601"), ("nan", "ISO 8601"),  # a fraction is only allowed in the last unit
    # Seconds are ASCII decimals: float() alone also reads these.
    ("1e3", "ASCII decimal"), ("1e300", "ASCII decimal"), ("inf", "ASCII decimal"), ("1_800", "ASCII decimal"),
    ("１８００", "ASCII decimal"), ("PT１H", "ASCII decimal"), (" 1800", "ASCII decimal"), ("+1800", "ASCII decimal"),
    ("-PT1H", "out of range"), ("-1", "out of range"), ("P36600D", "out of range"), ("P36500DT1S", "out of range"),
])
def test_a_duration_in_another_shape_is_refused_naming_the_parameter(value: str, reason: str) -> None:
    with pytest.raises(Invalid, match=f"^minIdle: .*{reason}"):
        parse_duration(value, "minIdle")


@pytest.mark.parametrize("value", ["P99999999999D", "P999999999W", "PT99999999999999999999H", "9" * 40,
                                   "99999999999999999999"])
def test_a_duration_too_long_for_timedelta_says_out_of_range_and_the_longest_accepted(value: str) -> None:
    # These overflow pydantic's (and timedelta's) arithmetic; the message used to call them not a duration.
    with pytest.raises(Invalid) as caught:
        parse_duration(value, "minIdle")

    assert str(caught.value) == (f"minIdle: {value!r} is out of range; the longest duration accepted is P36500D "
                                 "(100 years, 3153600000 seconds), the shortest 0")


def test_the_longest_duration_accepted_is_exactly_100_years_in_either_form() -> None:
    # 36,500 days x 86,400 s = 3,153,600,000 s; 5,214 weeks + 2 days = 36,500 days.
    assert {parse_duration(v, "minIdle") for v in ("P36500D", "P5214W2D", "PT876000H", "3153600000")} == \
        {timedelta(days=36_500)}


@pytest.mark.parametrize("value", ["P36500DT0.0000001S", "PT3153600000.0000004S", "3153600000.0000004",
                                   "P36500DT0.00000049999S", "3153600000.00000049999"])
def test_a_duration_under_half_a_microsecond_past_100_years_rounds_to_100_years_in_either_form(value: str) -> None:
    # Rounded to whole microseconds first, then checked: 0.0000004 s is 0 microseconds past P36500D. The
    # seconds form was checked as a float before rounding (3153600000.0000004 read as 3153600000.000000477), so
    # it was out of range while the same value in ISO 8601 was accepted.
    assert parse_duration(value, "minIdle") == timedelta(days=36_500)


@pytest.mark.parametrize("value", ["P36500DT0.0000005S", "PT3153600000.0000005S", "3153600000.0000005"])
def test_half_a_microsecond_past_100_years_rounds_up_and_is_out_of_range_in_either_form(value: str) -> None:
    with pytest.raises(Invalid, match="is out of range; the longest duration accepted is P36500D"):
        parse_duration(value, "minIdle")


@pytest.mark.parametrize(("value", "expected"), [
    # 3,153,599,999 s = 36,499 days + 86,399 s; half a microsecond rounds up. As a float, 3153599999.0000005 is
    # 3153599999.000000477 (the nearest float), which rounded down to no microsecond at all.
    ("3153599999.0000005", timedelta(days=36_499, seconds=86_399, microseconds=1)),
    ("PT3153599999.0000005S", timedelta(days=36_499, seconds=86_399, microseconds=1)),
    ("P36499DT86399.0000005S", timedelta(days=36_499, seconds=86_399, microseconds=1)),
    # A fraction longer than any parser's digits: half a microsecond and a tiny bit more still rounds up.
    ("0.0000005" + "0" * 40 + "1", timedelta(microseconds=1)),
    ("PT0.0000005" + "0" * 40 + "1S", timedelta(microseconds=1)),
    ("0.0000004" + "9" * 40, timedelta(0)),
    # 1.0000005 days = 86,400 s + 0.0432 s.
    ("P1.0000005D", timedelta(days=1, microseconds=43_200)),
])
def test_a_duration_is_rounded_to_the_nearest_microsecond_from_its_exact_digits(value: str,
                                                                               expected: timedelta) -> None:
    assert parse_duration(value, "minIdle") == expected


def test_a_duration_of_a_million_digits_is_out_of_range_not_a_decimal_overflow() -> None:
    # Past 999,999 digits, decimal's default exponent limit raised decimal.Overflow (a traceback, a 500).
    with pytest.raises(Invalid, match="is out of range; the longest duration accepted is P36500D"):
        parse_duration("9" * 1_000_001, "minIdle")


@pytest.mark.parametrize("value", ["-0.0000004", "-PT0.0000004S", "-0", "-PT0S"])
def test_a_negative_duration_that_rounds_to_no_microsecond_is_zero(value: str) -> None:
    assert parse_duration(value, "minIdle") == timedelta(0)


@pytest.mark.parametrize("value", ["-0.0000005", "-PT0.0000005S"])
def test_a_negative_duration_of_half_a_microsecond_rounds_away_from_zero_and_is_out_of_range(value: str) -> None:
    with pytest.raises(Invalid, match="is out of range"):
        parse_duration(value, "minIdle")


def test_a_broken_yaml_document_after_a_commented_marker_is_reported_at_its_first_content_line() -> None:
    text = "kind: ConfigMap\napiVersion: v1\nmetadata: {name: one}\n--- # second\n\n# note\nkind: [\n"
    results = list(read_text(text, source="docs.yaml"))

    assert [type(r) for r in results] == [WatchLine, BrokenLine]
    assert results[1].line == 7  # `kind: [`: the marker (4), the blank line (5) and the comment (6) skipped
