"""CSV written for spreadsheets (usage export, idle-claim report): formula-like text stays text."""

from __future__ import annotations

import csv
import io

import pytest

from ledger.services import csv_table, idle_report_csv
from ledger.types import JSONObject


def read(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


@pytest.mark.parametrize(("text", "written"), [
    ("=1+1", "'=1+1"), ("+1", "'+1"), ("-1", "'-1"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("team-a", "team-a"), ("a=b", "a=b"), ("'=x", "'=x"), ("", ""),
])
def test_only_text_cells_starting_like_a_formula_get_a_quote(text: str, written: str) -> None:
    # Numbers pass untouched even when negative: they must stay numbers in the sheet.
    assert read(csv_table(["a", "b", "c"], [[text, -0.5, -2]])) == [["a", "b", "c"], [written, "-0.5", "-2"]]


def test_a_carriage_return_inside_a_cell_does_not_split_the_row() -> None:
    text = csv_table(["a", "b"], [["x\ry", 1]])

    assert text == 'a,b\r\n"x\ry",1\r\n'
    assert read(text) == [["a", "b"], ["x\ry", "1"]]


def test_the_idle_claim_report_writes_a_formula_like_team_as_text() -> None:
    body: JSONObject = {"at": "2026-11-02T12:00:00Z", "claims": [
        {"cluster": "lab", "namespace": "ml", "name": "c", "team": "=cmd|' /C calc'!A0", "category": "unreserved",
         "idleSince": "2026-11-02T11:00:00Z", "devices": ["gpu.example.com/p/gpu-0", "gpu.example.com/p/gpu-1"],
         "wastedDeviceHours": 2.0}]}

    assert read(idle_report_csv(body))[1] == [
        "lab", "ml", "c", "'=cmd|' /C calc'!A0", "unreserved", "2026-11-02T11:00:00Z",
        "gpu.example.com/p/gpu-0 gpu.example.com/p/gpu-1", "2.0"]


def test_a_small_number_is_written_as_the_api_json_writes_it_not_in_exponent_form() -> None:
    # 0.2 s of a device is 0.000056 h: str() gave 5.6e-05 in the CSV where the JSON body says 0.000056.
    text = csv_table(["a", "b", "c", "d"], [[round(0.2 / 3600, 6), 14.8825, -1.5, 3]])

    assert text == "a,b,c,d\r\n0.000056,14.8825,-1.5,3\r\n"
