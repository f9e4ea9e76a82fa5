"""The occupancy table of the CLI marks what the JSON flags: devices held off-slice, counter sets allocated past
their hardware, double bookings, and free partitions whose counters other devices hold."""

from __future__ import annotations

import pytest
from rich.console import Console

from ledger import cli
from ledger.types import JSONObject


def holder(claim: str, *, conflict: bool = False, admin: bool = False) -> JSONObject:
    return {"namespace": "ml", "claim": claim, "team": "vision", "request": "gpu", "deviceClass": "gpu.example.com",
            "shareID": None, "consumedCapacity": {}, "adminAccess": admin, "conflict": conflict, "consumers": []}


def device(name: str, *allocations: JSONObject, off_slice: bool = False, over: bool = False,
           held_by: tuple[str, ...] = ()) -> JSONObject:
    return {"cluster": "default", "driver": "gpu.example.com", "pool": "node-1", "device": name, "node": "node-1",
            "model": "A100", "offSlice": off_slice, "counterSetConflict": over, "counterSetHeldBy": list(held_by),
            "allocations": list(allocations)}


def printed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *devices: JSONObject) -> list[str]:
    monkeypatch.setattr(cli, "out", Console(width=200, no_color=True))
    cli.render_occupancy({"at": "2026-11-02T09:30:00Z", "devices": list(devices),
                          "totals": {"devices": 3, "allocated": 2, "free": 1, "shared": 1}})
    return [" ".join(line.replace("│", " ").replace("┃", " ").split()) for line in capsys.readouterr().out.splitlines()]


def test_each_flag_of_a_device_or_an_allocation_is_marked_and_plain_rows_are_not(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lines = printed(monkeypatch, capsys,
                    device("gpu-0", holder("whole"), over=True),
                    device("gpu-1", holder("a", conflict=True), holder("b", conflict=True)),
                    device("gpu-2", holder("plain"), off_slice=True),
                    device("gpu-3"),
                    device("gpu-4-mig-1", held_by=("gpu-4", "gpu-4-mig-0")),
                    device("gpu-4-mig-2", holder("audit", admin=True), held_by=("gpu-4",)))

    assert "node-1/gpu-0 (counter set over-committed) node-1 ml/whole vision - -" in lines
    assert "node-1/gpu-1 node-1 ml/a [conflict] vision - -" in lines
    assert "node-1/gpu-1 node-1 ml/b [conflict] vision - -" in lines
    assert "node-1/gpu-2 (off-slice) node-1 ml/plain vision - -" in lines
    assert "node-1/gpu-3 node-1 free" in lines
    assert "node-1/gpu-4-mig-1 node-1 (counters held by gpu-4, gpu-4-mig-0)" in lines
    assert "node-1/gpu-4-mig-2 (counters held by gpu-4) node-1 ml/audit [adminAccess] vision - -" in lines
    assert "devices 3, allocated 2, free 1, shared 1" in lines
