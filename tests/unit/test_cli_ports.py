"""Every port option refuses a number no TCP port has, as ``demo --port`` does: exit code 2 and Typer's
range message (``Input should be less than or equal to 65535``), before anything binds (no
``OverflowError`` traceback from ``bind()``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.factories import plugin_commands, taken_port

WIDE = {"COLUMNS": "300"}
"""A terminal wide enough that Typer's error box keeps each message on one line."""


@pytest.mark.parametrize(("args", "option", "bounds"), [
    (["serve", "--port", "99999"], "--port", "less than or equal to 65535"),
    (["serve", "--port", "65536"], "--port", "less than or equal to 65535"),
    (["serve", "--port", "-5"], "--port", "greater than or equal to 1"),
    (["fake-apiserver", "--history", "h.jsonl", "--port", "99999"], "--port", "less than or equal to 65535"),
    (["fake-apiserver", "--history", "h.jsonl", "--port", "-5"], "--port", "greater than or equal to 0"),
    (["watch", "--health-port", "99999"], "--health-port", "less than or equal to 65535"),
    (["watch", "--health-port", "-2"], "--health-port", "greater than or equal to -1"),
])
def test_a_port_outside_0_to_65535_is_refused_with_exit_code_2_naming_the_option_and_its_range(
        args: list[str], option: str, bounds: str) -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, args, env=WIDE)

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"Invalid value for '{option}': Input should be {bounds}" in result.output
    assert "Traceback" not in result.output


def test_the_demo_refuses_an_impossible_port_the_same_way() -> None:
    from ledger.cli import app

    result = CliRunner().invoke(app, ["demo", "--port", "99999"], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port': Input should be less than or equal to 65535" in result.output


NOWHERE = "postgresql://nobody@127.0.0.1:1/none"
"""A database URL that leads nowhere: the address checks must come first."""


@pytest.mark.parametrize(("host", "said"), [
    # Not a dotted quad (256 > 255) and no name: the resolver's EAI_NONAME.
    ("256.1.1.1", "the host 256.1.1.1 cannot be resolved ("),
    # TEST-NET-1 (RFC 5737): a real address, but never one of this machine's (EADDRNOTAVAIL).
    ("192.0.2.1", "192.0.2.1 is not an address of this machine (Cannot assign requested address); give --host"),
])
def test_a_host_that_cannot_be_bound_is_named_without_the_hint_about_a_taken_port(host: str, said: str) -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["serve", "--host", host, "--port", "9999", "--allow-unauthenticated",
                                          "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"error: cannot listen on {host}:9999: {said}" in result.output
    assert "another process may hold the port" not in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("host", "said"), [
    # .invalid never resolves (RFC 6761).
    ("nosuchhost.invalid", "the host nosuchhost.invalid cannot be resolved ("),
    ("192.0.2.1", "192.0.2.1 is not an address of this machine (Cannot assign requested address); give --host"),
])
def test_a_host_that_cannot_be_bound_is_named_before_the_missing_tokens(host: str, said: str) -> None:
    # No --allow-unauthenticated and no token configured: the refusal to serve without tokens was said instead,
    # as if serving there would have worked with a token.
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["serve", "--host", host, "--port", "9999", "--database-url", NOWHERE],
                                    env={**WIDE, "LEDGER_CONFIG": None})

    assert result.exit_code == 2, result.output
    assert f"error: cannot listen on {host}:9999: {said}" in result.output
    assert "refusing to serve" not in result.output


@pytest.mark.parametrize("host", ["", "  "])
def test_an_empty_host_is_refused_not_served_on_every_interface(host: str) -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["serve", "--host", host, "--port", "9999", "--allow-unauthenticated",
                                          "--database-url", NOWHERE], env=WIDE)

    # uvicorn listened on every interface for "" (http://:9999), even with no token configured.
    assert result.exit_code == 2, result.output
    assert "error: --host is empty; give an address or name of this machine (default 127.0.0.1; 0.0.0.0 for every " \
        "IPv4 interface)" in result.output


def test_only_a_port_in_use_gets_the_hint_about_another_process() -> None:
    with plugin_commands() as app, taken_port() as port:
        result = CliRunner().invoke(app, ["serve", "--host", "127.0.0.1", "--port", str(port),
                                          "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert (f"error: cannot listen on 127.0.0.1:{port}: Address already in use; another process may hold the port: "
            "stop it or pass --port") in result.output


def test_an_ipv6_host_on_a_machine_without_ipv6_is_named_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import socket

    from ledger import embedded
    from ledger.errors import LedgerError

    real_socket = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)  # type: ignore[arg-type]  # the rest as socket.socket takes them

    monkeypatch.setattr(socket, "socket", no_ipv6)
    # The socket could not even be made: bind_error used to let that OSError out of require_port.
    with pytest.raises(LedgerError,
                       match=r"^cannot listen on \[::1\]:8472: Address family not supported by protocol$"):
        embedded.require_port("::1", 8472)


def test_an_ipv6_address_is_written_in_brackets_and_a_scoped_one_of_no_interface_is_named() -> None:
    from ledger import embedded
    from ledger.errors import LedgerError

    # 2001:db8::/32 is for documentation (RFC 3849): never this machine's.
    with pytest.raises(LedgerError, match=r"^cannot listen on \[2001:db8::1\]:8472: 2001:db8::1 is not an address"):
        embedded.require_port("2001:db8::1", 8472)
    # A scope naming no interface: the resolver refuses it (the scope used to be dropped, and the bind said only
    # "Invalid argument").
    with pytest.raises(LedgerError, match=r"^cannot listen on \[fe80::1%nosuchif0\]:8472: the host .* cannot be "
                                          r"resolved"):
        embedded.require_port("fe80::1%nosuchif0", 8472)


def test_a_host_with_a_label_too_long_to_resolve_is_named_not_a_traceback() -> None:
    from ledger import embedded
    from ledger.errors import LedgerError

    # The resolver's IDNA encoding raised UnicodeError (not an OSError) out of require_port for a 64-letter label.
    host = "a" * 64 + ".example"
    with pytest.raises(LedgerError, match=rf"^cannot listen on {host}:8472: the host {host} cannot be resolved \(no "
                                          r"host name: each dot-separated label must have 1 to 63 characters\); give "
                                          r"LEDGER_WATCH_HEALTH_HOST an address"):
        embedded.require_port(host, 8472, host_option="LEDGER_WATCH_HEALTH_HOST")


@pytest.mark.parametrize("host", ["", "  "])
def test_an_empty_host_is_named_as_empty(host: str) -> None:
    from ledger import embedded
    from ledger.errors import LedgerError

    with pytest.raises(LedgerError, match=r"^cannot serve the health checks: LEDGER_WATCH_HEALTH_HOST is empty; give "
                                          r"it an address or name of this machine \(0\.0\.0\.0: every IPv4 address\)$"):
        embedded.require_port(host, 8472, doing="serve the health checks", host_option="LEDGER_WATCH_HEALTH_HOST")
