"""Options and settings that would be ignored or absurd are refused with exit code 2 (or a named config error)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest
from typer.testing import CliRunner

from ledger.cli import app, render_quotas
from ledger.cli_typer import LedgerCommand
from ledger.config import load_config
from ledger.errors import Invalid
from ledger.interrupts import Terminated
from ledger.types import JSONObject
from tests.factories import config_error

WIDE = {"COLUMNS": "300", "LEDGER_DATABASE_URL": None}


@pytest.mark.parametrize("command", ["quotas", "shared"])
def test_at_with_a_window_is_refused_instead_of_one_being_ignored(command: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [command, "--at", "2026-11-02T10:00:00Z", "--from", "2026-11-02T09:00:00Z",
                                      "--to", "2026-11-02T12:00:00Z", "--data-dir", str(tmp_path / "x")], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "either for one instant (--at) or over a window (--from/--to), not both" in result.output


@pytest.mark.parametrize("command", ["quotas", "shared"])
def test_half_a_window_is_still_refused(command: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [command, "--from", "2026-11-02T09:00:00Z", "--data-dir", str(tmp_path)],
                                env=WIDE)

    assert result.exit_code == 2, result.output
    assert "give both --from and --to, or neither" in result.output


@pytest.mark.parametrize(("value", "problem"), [
    ("1e400", "Input should be a finite number"),  # TOML reads it as infinity
    ("1e20", "less than or equal to 3153600000"),  # past 100 years, the bound of --min-idle
    ("-1", "greater than or equal to 0"),
    ("true", "Input should be a valid number"),  # a boolean is no number of seconds
])
def test_an_idle_threshold_past_100_years_or_infinite_is_a_namedconfig_error(tmp_path: Path, value: str,
                                                                            problem: str) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(f"[idle]\nunreferencedSeconds = {value}\n", encoding="utf-8")

    with pytest.raises(Invalid, match=r"idle\.unreferencedSeconds") as caught:
        load_config(path)

    assert problem in str(caught.value)


FINITE = "Input should be a finite number"
NOT_EMPTY = "String should have at least 1 character"


@pytest.mark.parametrize(("body", "says"), [
    # An infinite or NaN quota or price has no meaning, and JSON (serve's hand-over to its workers) cannot carry it.
    ('[[quotas]]\nteam = "a"\nresourceName = "gpu"\nnominalQuota = inf\n', rf"quotas\.0\.nominalQuota: {FINITE}"),
    ('[[quotas]]\nteam = "a"\nresourceName = "gpu"\nnominalQuota = nan\n', rf"quotas\.0\.nominalQuota: {FINITE}"),
    ('[[quotas]]\nteam = "a"\nresourceName = "mem"\nnominalQuota = "1e400"\n',
     rf"quotas\.0\.nominalQuota: .*{FINITE}"),
    ('[[prices]]\ndeviceClass = "gpu.example.com"\nperDeviceHour = inf\n', rf"prices\.0\.perDeviceHour: {FINITE}"),
    ('[[prices]]\nmodel = "A100"\nperDeviceHour = nan\n', rf"prices\.0\.perDeviceHour: {FINITE}"),
    # An empty team billed its hours to no team (usage showed "-", the JSON null); other empty names matched nothing.
    ('[teams.overrides]\nml-train = ""\n', rf"teams\.overrides\.ml-train: {NOT_EMPTY}"),
    ('[teams.overrides]\n"" = "vision"\n', rf'teams\.overrides\.""\.\[key\]: {NOT_EMPTY}'),
    ('[teams]\nlabel = ""\n', rf"teams\.label: {NOT_EMPTY}"),
    ('[[quotas]]\nteam = ""\nresourceName = "gpu"\nnominalQuota = 4\n', rf"quotas\.0\.team: {NOT_EMPTY}"),
    ('[[quotas]]\nteam = "a"\nresourceName = ""\nnominalQuota = 4\n', rf"quotas\.0\.resourceName: {NOT_EMPTY}"),
    ('[[prices]]\ndeviceClass = ""\nperDeviceHour = 1\n', rf"prices\.0\.deviceClass: {NOT_EMPTY}"),
    ('[[api.tokens]]\nname = "ci"\ntoken = "0123456789abcdef"\nteams = [""]\n',
     rf"api\.tokens\.0\.teams\.0: {NOT_EMPTY}"),
    ('[[api.tokens]]\nname = ""\ntoken = "0123456789abcdef"\n', rf"api\.tokens\.0\.name: {NOT_EMPTY}"),
    # Names of blanks, or padded: a team printed as nothing; a padded class priced nothing, and the cost went away.
    ('[teams.overrides]\nml-train = "  "\n', r"teams\.overrides\.ml-train: only blanks"),
    ('[[quotas]]\nteam = " "\nresourceName = "gpu"\nnominalQuota = 4\n', r"quotas\.0\.team: only blanks"),
    ('[[prices]]\ndeviceClass = " gpu.example.com"\nperDeviceHour = 1\n',
     r"prices\.0\.deviceClass: a blank at the start or the end"),
])
def test_a_bad_value_in_the_configuration_is_an_error_naming_its_location(tmp_path: Path, body: str,
                                                                        says: str) -> None:
    assert re.search(says, config_error(tmp_path, body)), config_error(tmp_path, body)


PRICE = '[[prices]]\n{key} = "{name}"\nperDeviceHour = {value}\ncurrency = "{currency}"\n'


@pytest.mark.parametrize(("body", "says"), [
    # 1e308 is finite, but 9.4 device-hours at that price are not: the cost became Infinity.
    (PRICE.format(key="deviceClass", name="gpu.example.com", value="1e308", currency="USD"),
     r"prices\.0\.perDeviceHour.*less than or equal to 1000000000"),
    # The second price of a class silently won (and was shown in the first one's currency).
    (PRICE.format(key="deviceClass", name="gpu.example.com", value="1", currency="USD")
     + PRICE.format(key="deviceClass", name="gpu.example.com", value="2", currency="USD"),
     r"prices: deviceClass 'gpu\.example\.com' is priced twice \(prices\[0\] and prices\[1\]\)"),
    (PRICE.format(key="model", name="A100", value="1", currency="USD")
     + PRICE.format(key="deviceClass", name="A100", value="1", currency="USD")
     + PRICE.format(key="model", name="A100", value="3", currency="USD"),
     r"prices: model 'A100' is priced twice \(prices\[0\] and prices\[2\]\)"),
    # Costs of all rows add up into one total: one currency for every price.
    (PRICE.format(key="deviceClass", name="gpu.example.com", value="1", currency="USD")
     + PRICE.format(key="model", name="A100", value="2", currency="EUR"),
     r"prices: every price needs the same currency, got EUR, USD"),
    # A cost printed with no unit, or with a unit that differs from another price's by a blank only.
    (PRICE.format(key="deviceClass", name="gpu.example.com", value="1", currency=""),
     r"prices\.0\.currency: String should have at least 1 character"),
    (PRICE.format(key="deviceClass", name="gpu.example.com", value="1", currency="USD "),
     r"prices\.0\.currency: a blank at the start or the end"),
])
def test_a_price_that_would_overflow_repeats_a_key_or_mixes_currencies_is_aconfig_error(
        tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(body, encoding="utf-8")

    with pytest.raises(Invalid, match=says):
        load_config(path)


def test_a_check_of_the_whole_file_reads_as_the_check_wrote_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(PRICE.format(key="deviceClass", name="a.b", value="1", currency="USD")
                    + PRICE.format(key="deviceClass", name="c.d", value="1", currency="EUR"), encoding="utf-8")

    with pytest.raises(Invalid) as caught:
        load_config(path)

    # Not "(top): Value error, prices: ...": no location for the whole file, and no prefix of pydantic's.
    assert str(caught.value) == f"{path}: prices: every price needs the same currency, got EUR, USD"


@pytest.mark.parametrize(("body", "key", "line"), [
    # A second prices list replaced the first: billed at 100 instead of 2.5 without a word.
    ("prices:\n  - deviceClass: gpu.example.com\n    perDeviceHour: 2.5\n"
     "prices:\n  - deviceClass: gpu.example.com\n    perDeviceHour: 100\n", "prices", 4),
    ("prices:\n  - deviceClass: gpu.example.com\n    perDeviceHour: 2.5\n    currency: USD\n    currency: EUR\n",
     "currency", 5),
    ("teams:\n  overrides:\n    ml-train: alpha\n    ml-train: beta\n", "ml-train", 4),
])
def test_a_key_given_twice_in_a_yaml_file_is_refused_as_toml_refuses_it(tmp_path: Path, body: str, key: str,
                                                                        line: int) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text(body, encoding="utf-8")

    with pytest.raises(Invalid) as caught:
        load_config(path)

    message = str(caught.value)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert f"found the key {key!r} twice" in message and f'in "{path}", line {line}, column' in message
    toml = tmp_path / "ledger.toml"
    toml.write_text('[teams.overrides]\nml-train = "alpha"\nml-train = "beta"\n', encoding="utf-8")
    with pytest.raises(Invalid, match="not valid TOML"):
        load_config(toml)


@pytest.mark.parametrize(("written", "read_as", "line"), [
    # Namespaces named 2024, no and null are valid Kubernetes names; unquoted, YAML reads an int, a bool, nothing.
    ("2024", "int", 3), ("no", "bool", 3), ("null", "NoneType", 3), ("1.50", "float", 3)])
def test_an_unquoted_yaml_key_that_is_not_a_string_is_refused_with_its_line_and_the_quoted_form(
        tmp_path: Path, written: str, read_as: str, line: int) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text(f"teams:\n  overrides:\n    {written}: vision\n", encoding="utf-8")

    with pytest.raises(Invalid) as caught:
        load_config(path)

    message = str(caught.value)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert f"found the key {written!r}, which YAML reads as {read_as}, not a string" in message
    assert f'quote it if it is a name ("{written}")' in message and f'in "{path}", line {line}, column 5' in message
    path.write_text(f'teams:\n  overrides:\n    "{written}": vision\n', encoding="utf-8")
    assert load_config(path).teams.overrides == {written: "vision"}


@pytest.mark.parametrize(("body", "found"), [
    ("[]\n", "a list"), ("- teams\n", "a list"), ("teams\n", "a string"), ("42\n", "a number"), ("no\n", "a boolean")])
def test_a_yaml_file_whose_top_level_is_not_a_mapping_is_refused_saying_what_it_holds(
        tmp_path: Path, body: str, found: str) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text(body, encoding="utf-8")

    with pytest.raises(Invalid) as caught:
        load_config(path)

    assert str(caught.value) == (f"{path}: the configuration file must hold a mapping of sections (teams, prices, "
                                 f"...), not {found}")
    path.write_text("# nothing set yet\n", encoding="utf-8")
    assert load_config(path).teams.overrides == {}  # comments only: the defaults


def test_yaml_merge_keys_may_still_override_what_they_bring_in(tmp_path: Path) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text("prices:\n  - &gpu {deviceClass: gpu.example.com, perDeviceHour: 2.5, currency: EUR}\n"
                    "  - <<: *gpu\n    deviceClass: nic.example.com\n", encoding="utf-8")

    config = load_config(path)

    assert [(p.device_class, p.per_device_hour, p.currency) for p in config.prices] == [
        ("gpu.example.com", 2.5, "EUR"), ("nic.example.com", 2.5, "EUR")]


def test_a_price_of_a_billion_and_one_price_a_class_and_a_model_are_taken(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(PRICE.format(key="deviceClass", name="A100", value="1e9", currency="JPY")
                    + PRICE.format(key="model", name="A100", value="0", currency="JPY"), encoding="utf-8")

    config = load_config(path)

    assert [(p.device_class, p.model, p.per_device_hour, p.currency) for p in config.prices] == [
        ("A100", None, 1e9, "JPY"), (None, "A100", 0.0, "JPY")]


def test_an_idle_threshold_of_exactly_100_years_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text("[idle]\nunreservedSeconds = 3153600000\n", encoding="utf-8")

    assert load_config(path).idle.unreserved_seconds == 36_500 * 86_400


def test_ctrl_c_while_the_plugins_load_is_one_line_and_exit_code_130(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from ledger import cli

    def interrupted() -> None:
        raise KeyboardInterrupt  # what SIGINT raises in the middle of an import

    monkeypatch.setattr(cli, "_load_plugins", interrupted)

    with pytest.raises(SystemExit) as stopped:
        cli.main()

    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_while_typer_builds_the_commands_is_one_line_and_exit_code_130(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # After the plugins loaded, Typer reads every command's signature before Click runs one: a Ctrl-C there printed
    # a 50-line traceback ending in inspect.get_annotations.
    import typer.main

    from ledger import cli

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_load_plugins", lambda: None)
    monkeypatch.setattr(typer.main, "get_command", interrupted)
    with pytest.raises(SystemExit) as stopped:
        cli.main()

    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize(("interrupt", "said", "code"), [(KeyboardInterrupt, "interrupted\n", 130),
                                                         (Terminated, "terminated (SIGTERM)\n", 143)])
def test_an_interrupt_while_typer_reads_the_command_line_is_said(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], interrupt: type[KeyboardInterrupt],
        said: str, code: int) -> None:
    # Before the command runs, Typer turns a KeyboardInterrupt (SIGTERM's Terminated too) into exit code 130 without
    # a word: a SIGTERM then ended with 130 and nothing on stderr.
    from ledger import cli

    def interrupted(*_: object, **__: object) -> NoReturn:
        raise interrupt

    monkeypatch.setattr(cli, "_load_plugins", lambda: None)
    monkeypatch.setattr(LedgerCommand, "make_context", interrupted)
    monkeypatch.setattr(sys, "argv", ["dra-ledger", "occupancy"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()

    assert (stopped.value.code, capsys.readouterr().err) == (code, said)


def test_sigterm_after_the_command_answered_leaves_exit_code_0(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The answer written, SIGTERM lands while Click closes the command's context: Typer made it exit code 130
    # without a word, for a complete answer.
    from typer._click.core import Context

    from ledger import cli

    leave, invoke = Context.__exit__, LedgerCommand.invoke
    returned = False

    def answered(self: LedgerCommand, ctx: Context) -> object:
        nonlocal returned
        answer = invoke(self, ctx)
        returned = True
        return answer

    def terminated(self: Context, *exc_info: object) -> None:
        if returned and self.parent is not None:  # the command's context, once the command returned
            raise Terminated
        leave(self, *exc_info)  # type: ignore[arg-type]  # (type, value, traceback) as Python passes them

    monkeypatch.setattr(cli, "_load_plugins", lambda: None)
    monkeypatch.setattr(LedgerCommand, "invoke", answered)
    monkeypatch.setattr(Context, "__exit__", terminated)
    output = tmp_path / "h.jsonl"
    monkeypatch.setattr(sys, "argv", ["dra-ledger", "simulate", "--nodes", "1", "--gpus-per-node", "1", "--hours",
                                      "1", "--output", str(output)])
    with pytest.raises(SystemExit) as stopped:
        cli.main()

    answer = json.loads(capsys.readouterr().out)
    assert stopped.value.code == 0
    assert answer["lines"] == len(output.read_text().splitlines())


@pytest.mark.parametrize(("value", "taken"), [("9998-12-31T23:59:59.999999Z", True),
                                               ("9999-01-01T00:00:00Z", False),
                                               ("9999-12-31T23:59:59.999999Z", False)])
def test_the_cli_takes_the_times_the_api_takes(value: str, taken: bool, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["occupancy", "--at", value, "--data-dir", str(tmp_path)], env=WIDE)

    # A time taken gets as far as the ledger (none here: exit 2, "no ledger in"); one refused never does.
    assert result.exit_code == 2, result.output
    assert ("no ledger in" in result.output) is taken
    assert ("too far in the future; the latest time accepted is 9998-12-31T23:59:59.999999Z" in result.output) \
        is not taken


def test_ctrl_c_while_the_cli_imports_is_one_line_and_exit_code_130(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # `dra-ledger` imports SQLAlchemy, pydantic and Rich before any command runs; a Ctrl-C then printed a traceback.
    import importlib.abc
    import sys

    from ledger import entry

    class InterruptedImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, *_: object) -> None:
            if name == "ledger.cli":
                raise KeyboardInterrupt  # what Ctrl-C raises in the middle of an import

    monkeypatch.delitem(sys.modules, "ledger.cli")
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as exited:
            entry.main()
        after = {signum: signal.getsignal(signum) for signum in before}
    finally:
        for signum, handler in before.items():  # this test process's, and those of the processes it starts later
            signal.signal(signum, handler)

    assert exited.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert set(after.values()) == {signal.SIG_IGN}  # the console script is done: its teardown ignores both


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "in-set-name"])
@pytest.mark.parametrize("module", ["ledger.cli", "api.cli"])
def test_sigterm_while_the_cli_imports_is_one_line_and_exit_code_143(module: str, wrapped: bool) -> None:
    # A pod stopped, or a CronJob's deadline, in the second the CLI imports: the default action ended the process
    # without a word (exit status -15); once the handler was in, one during the plugins' imports (api.cli) was said
    # as Ctrl-C ("interrupted", 130). The signal is sent by the process to itself at the import of ``module``:
    # bare, or from a __set_name__ (a class made while a module imports, as dataclass fields are), where Python 3.11
    # wraps the exception in a RuntimeError: that one printed a traceback and exited 1.
    send = "class Holder:\n                field = Named()" if wrapped else "os.kill(os.getpid(), signal.SIGTERM)"
    code = f"""
import importlib.abc, os, signal, sys

class Named:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1_000_000):
            pass

class SignalledImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, *_):
        if name == {module!r}:
            {send}

sys.meta_path.insert(0, SignalledImport())
sys.argv[0] = "dra-ledger"
from ledger.entry import main
main()
"""
    done = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=120,
                          check=False)

    assert (done.returncode, done.stderr, done.stdout) == (143, "terminated (SIGTERM)\n", "")


QUOTA = '[[quotas]]\nteam = "vision"\nresourceName = "example.com/gpu"\nnominalQuota = {value}\n'
ABOVE = "is above 9,007,199,254,740,992 (2**53), the largest quota kept exactly"


@pytest.mark.parametrize(("value", "echoed"), [
    # The tester's value: as a float it printed 99,999,999,999,999,996,863,366,107,917,975,552.
    ("99999999999999999999999999999999999", "99999999999999999999999999999999999"),
    # One past 2**53 would become 2**53 as a float and pass a check made on the float.
    ("9007199254740993", "9007199254740993"),
    ("1e300", "1e+300"),
    # 10 * 10**15 = 10,000,000,000,000,000 > 9,007,199,254,740,992; "8Pi" (2**53 itself) is taken, below.
    ('"10P"', "'10P'"),
])
def test_a_nominal_quota_above_2_to_the_53_is_refused_instead_of_rounded(tmp_path: Path, value: str,
                                                                        echoed: str) -> None:
    assert f"quotas.0.nominalQuota: {echoed} {ABOVE}" in config_error(tmp_path, QUOTA.format(value=value))


@pytest.mark.parametrize(("value", "said"), [
    # A boolean read as 1.0 by pydantic: a quota of 1.
    ("true", "True is a boolean, not a count or a quantity"),
    ("false", "False is a boolean, not a count or a quantity"),
    # Quantities as Kubernetes writes them: ASCII digits, nothing around them.
    ('" 1"', "not a quantity: ' 1'"),
    ('"1Ki "', "not a quantity: '1Ki '"),
    ('"\u0661"', "not a quantity: '\u0661'"),  # an Arabic-Indic one, which Python's int() reads as 1
    # Above 0 but finer than 1n: printed as 300 digits.
    ("1e-300", "1e-300 is above 0 but below 1n (0.000000001), the finest Kubernetes quantity"),
    ('"0.1n"', "'0.1n' is above 0 but below 1n (0.000000001), the finest Kubernetes quantity"),
])
def test_a_nominal_quota_that_is_no_count_and_no_quantity_is_refused(tmp_path: Path, value: str, said: str) -> None:
    assert f"quotas.0.nominalQuota: {said}" in config_error(tmp_path, QUOTA.format(value=value))


def test_a_yaml_yes_is_no_quota(tmp_path: Path) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text("quotas:\n- team: vision\n  resourceName: example.com/gpu\n  nominalQuota: yes\n", encoding="utf-8")
    with pytest.raises(Invalid, match="nominalQuota: True is a boolean, not a count or a quantity"):
        load_config(path)


def test_the_quotas_command_refuses_it_with_exit_code_2_before_the_database(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(QUOTA.format(value="99999999999999999999999999999999999"), encoding="utf-8")

    result = CliRunner().invoke(app, ["quotas", "--config", str(path), "--data-dir", str(tmp_path / "none")],
                                env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"quotas.0.nominalQuota: 99999999999999999999999999999999999 {ABOVE}" in result.output
    assert not (tmp_path / "none").exists()


def quota_table(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> tuple[float | None, str]:
    """The nominal quota a file giving ``nominalQuota = value`` yields, and the quotas table printing it."""
    path = tmp_path / "ledger.toml"
    path.write_text(QUOTA.format(value=value), encoding="utf-8")
    quota = load_config(path).quota_of(cluster="lab", team="vision", resource_name="example.com/gpu")
    body: JSONObject = {"at": "2026-11-02T09:30:00Z", "rows": [{
        "cluster": "lab", "team": "vision", "resourceName": "example.com/gpu", "used": 4, "nominalQuota": quota,
        "overQuota": False, "reasons": []}]}
    render_quotas(body)
    return quota, capsys.readouterr().out


@pytest.mark.parametrize("value", ["9007199254740992", '"8Pi"'])
def test_a_nominal_quota_of_2_to_the_53_is_kept_and_printed_exactly(tmp_path: Path, value: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    quota, table = quota_table(tmp_path, value, capsys)

    assert quota == 2**53
    assert "9,007,199,254,740,992" in table


@pytest.mark.parametrize(("value", "printed"), [
    ('"123456789m"', "123,456.789"),  # 123456.789: was 123457 (six significant digits)
    ("1234567.5", "1,234,567.5"),  # was 1.23457e+06
    ('"1500m"', "1.5"),
    ('"1u"', "0.000001"),  # was 1e-06
    ('"1n"', "0.000000001"),  # the smallest Quantity suffix; was 1e-09
])
def test_a_fractional_nominal_quota_is_printed_in_full(tmp_path: Path, value: str, printed: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, table = quota_table(tmp_path, value, capsys)

    assert f" {printed} " in table
