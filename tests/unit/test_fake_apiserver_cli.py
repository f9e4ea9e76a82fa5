"""``dra-ledger fake-apiserver`` refuses what it cannot serve (exit code 2) and says which lines it skips."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger.recorded import read_history
from tests.factories import plugin_commands
from tests.paths import HISTORIES
from workers.cli import report_broken

WIDE = {"COLUMNS": "300"}
SEED_LAB = HISTORIES / "seed-lab.jsonl"


class _NoServer:
    """Stands in for ``FakeApiServer``: a command that gets as far as serving fails at once instead of
    serving until interrupted (so a refusal that is missing fails the test rather than hanging it)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the command went on to serve")


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may start serving."""
    monkeypatch.setattr("workers.cli.FakeApiServer", _NoServer)


@pytest.mark.parametrize(("args", "said"), [
    (["--speed", "-1"], "Invalid value for '--speed': Input should be greater than or equal to 0"),
    (["--speed", "fast"], "Invalid value for '--speed': Input should be a valid number, unable to parse string"),
    (["--serve", "v9"], "Invalid value for --serve: v9 cannot be served; give one or more of v1, v1beta2, "
                        "v1beta1, v1alpha3, comma-separated"),
    (["--serve", "v1,v2beta7"], "v2beta7 cannot be served"),
    (["--serve", ","], "nothing cannot be served"),
])
def test_a_speed_below_zero_or_an_unknown_version_is_a_usage_error(args: list[str], said: str) -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["fake-apiserver", "--history", str(SEED_LAB), "--port", "0", *args],
                                    env=WIDE)

    assert result.exit_code == 2, result.output
    assert said in result.output


@pytest.mark.parametrize("speed", ["nan", "NaN", "inf", "-inf", "infinity", "1e400"])
def test_a_speed_that_is_not_a_finite_number_is_a_usage_error_saying_so(speed: str) -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["fake-apiserver", "--history", str(SEED_LAB), "--port", "0",
                                          "--speed", speed], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--speed': Input should be a finite number" in result.output
    assert "greater than or equal" not in result.output  # nan is not below 0


@pytest.mark.parametrize(("speed", "played"), [("0", 0.0), ("2.5", 2.5), ("1e6", 1e6)])
def test_a_finite_speed_of_at_least_0_is_played_at(speed: str, played: float,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    speeds: list[float] = []

    class _Started(Exception):
        pass

    class _Recorder:
        """Stands in for ``FakeApiServer`` as far as ``start_playing``, then stops the command."""

        remaining = 0

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        async def start(self, host: str, port: int) -> str:
            return f"http://{host}:{port}"

        def start_playing(self, *, speed: float) -> None:
            speeds.append(speed)
            raise _Started

        async def stop(self) -> None:
            pass

    monkeypatch.setattr("workers.cli.FakeApiServer", _Recorder)
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["fake-apiserver", "--history", str(SEED_LAB), "--port", "0",
                                          "--speed", speed], env=WIDE)

    assert speeds == [played], result.output
    assert isinstance(result.exception, _Started)


def test_a_missing_history_is_named_plainly(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["fake-apiserver", "--history", str(missing), "--port", "0"], env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"error: no such file: {missing}" in result.output
    assert "FileNotFoundError" not in result.output


def test_lines_that_cannot_be_read_are_counted_and_the_first_named(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    good = SEED_LAB.read_text(encoding="utf-8").splitlines()[:3]
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join([good[0], "{not json", good[1], "[]", "{}", '"x"', good[2]]) + "\n", encoding="utf-8")

    report_broken(list(read_history(path)))

    err = capsys.readouterr().err.splitlines()
    assert err[0] == "skipped 4 lines that cannot be read (not served):"
    assert [line.split(": ", 1)[0] for line in err[1:4]] == [f"  {path}:2", f"  {path}:4", f"  {path}:5"]
    assert err[4] == "  ... and 1 more"
    assert len(err) == 5


def test_a_clean_history_reports_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    report_broken(list(read_history(SEED_LAB)))

    assert capsys.readouterr().err == ""
