"""Settings of the watch workers, read from the environment (prefix ``LEDGER_WATCH_``).

Kept apart from :class:`ledger.settings.Settings` (database, cluster, team label), which the workers
read as well: these only make sense for a process that follows a cluster.
"""

from __future__ import annotations

import json
import random
import re
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

STOP_GRACE_S = 3.0
"""Default of :attr:`WatchSettings.stop_grace_s`, s."""

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def _lease_name(value: str) -> str:
    # The API server refuses any other name, and the worker retried that refusal for ever.
    if len(value) > 253 or not re.fullmatch(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*", value):
        raise ValueError(f"{value!r} is not a Lease name (a DNS subdomain: lowercase letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit, at most 253 characters)")
    return value


def _namespace(value: str) -> str:
    if len(value) > 63 or not re.fullmatch(_DNS_LABEL, value):
        raise ValueError(f"{value!r} is not a namespace name (a DNS label: lowercase letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63 characters)")
    return value


class WatchSettings(BaseSettings):
    """Timing and sizing of list/watch, backoff, leader election and health; ``LEDGER_WATCH_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="LEDGER_WATCH_", extra="ignore")

    server_timeout_s: int = Field(default=300, ge=1)
    """``timeoutSeconds`` asked of each watch request, s: the API server ends the stream after it and
    the worker watches again from the last resourceVersion (kube's default range is 300-600 s)."""
    request_timeout_s: float = Field(default=60.0, gt=0.0, allow_inf_nan=False)
    """Client timeout of list requests and of one read on a watch stream, s (a silent stream longer
    than this, bookmarks included, is treated as dropped)."""
    list_page_size: int = Field(default=500, ge=1)
    """``limit`` of each list page: bounds the memory of one response for 100,000 claims."""
    batch_size: int = Field(default=500, ge=1)
    """Most watch events written in one transaction: a burst is written as the events that arrived
    together (one network read), split into batches of at most this many."""
    error_backoffs_s: Annotated[tuple[Annotated[float, Field(ge=0.0, allow_inf_nan=False)], ...], NoDecode] = Field(
        default=(0.5, 1.0, 2.0, 5.0, 10.0, 30.0), min_length=1)
    """Delays after consecutive transient failures (5xx, 429, connection loss, database down), s; the
    last repeats. A 429's ``Retry-After`` wins when longer. In the environment a JSON list (``[0.5, 1, 5]``): at
    least one delay, each finite and not negative."""
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    """Each backoff delay is multiplied by a random factor in ``[1 - jitter, 1 + jitter]`` so that
    replicas and kinds do not retry in lockstep."""
    lease_name: Annotated[str, AfterValidator(_lease_name)] = "dra-ledger-watch"
    """Name of the coordination.k8s.io/v1 Lease the replicas compete for (a DNS subdomain, as Kubernetes names it)."""
    lease_namespace: Annotated[str, AfterValidator(_namespace)] = "dra-ledger"
    """Namespace of the Lease (in a pod: its own namespace is a good choice; a DNS label)."""
    lease_duration_s: int = Field(default=15, ge=1)
    """``leaseDurationSeconds``: a standby takes over once the lease went unrenewed this long, s."""
    renew_deadline_s: float = Field(default=10.0, gt=0.0, allow_inf_nan=False)
    """The leader steps down when it could not renew for this long, s (< lease_duration_s, so it
    stops writing before a standby may start)."""
    retry_period_s: float = Field(default=2.0, gt=0.0, allow_inf_nan=False)
    """Interval between acquire/renew attempts, s."""
    catch_up_interval_s: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    """How often the leader brings the read models up to date after it appended events, s (projection
    catch-up, DESIGN §8); 0 = never (queries, ``dra-ledger rebuild`` or another process do it)."""
    stop_grace_s: float = Field(default=STOP_GRACE_S, ge=0.0, allow_inf_nan=False)
    """At a stop (SIGTERM, Ctrl-C) or when the Lease is lost, how long the append transaction in flight may go on
    to commit before its statement is cancelled and it rolls back, s (its watch events are delivered again, so
    nothing is lost). A write commits within milliseconds unless it waits for a lock held elsewhere. Kept below
    ``lease_duration_s - renew_deadline_s`` (5 s by default), so that a former leader's write has ended before a
    standby may take over, and well inside Kubernetes' 30 s ``terminationGracePeriodSeconds``."""
    health_host: str = "0.0.0.0"
    """Address of the /healthz, /readyz and /metrics server."""
    health_port: int = Field(default=8081, ge=-1, le=65535)
    """Port of the health server (-1 to 65535: a TCP port); 0 = pick a free one, -1 = no health server."""

    @field_validator("error_backoffs_s", mode="before")
    @classmethod
    def _backoffs_from_json(cls, value: object) -> object:
        """Read the variable's text as JSON here (``NoDecode`` above), so that text that is no JSON is refused as this
        setting's error, naming the variable, where pydantic-settings' own decoding said only 'error parsing value for
        field "error_backoffs_s"'."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as e:
            raise ValueError("not a JSON list (write it as [0.5, 1, 5])") from e

    def grace_outlives_the_lease(self) -> str | None:
        """Why the Lease timings and :attr:`stop_grace_s` are unsafe with leader election, or ``None``: the renew
        deadline must be below the Lease duration, and the grace below the difference. A leader that lost its Lease
        stops renewing ``renew_deadline_s`` after its last renewal and a standby may take over at
        ``lease_duration_s``, so a longer grace would let a former leader's write commit while the standby writes."""
        if self.renew_deadline_s >= self.lease_duration_s:
            return (f"LEDGER_WATCH_RENEW_DEADLINE_S ({self.renew_deadline_s:g} s) must be below "
                    f"LEDGER_WATCH_LEASE_DURATION_S ({self.lease_duration_s:g} s), so that a leader steps down before "
                    "a standby may take over")
        margin = self.lease_duration_s - self.renew_deadline_s
        if self.stop_grace_s < margin:
            return None
        return (f"LEDGER_WATCH_STOP_GRACE_S ({self.stop_grace_s:g} s) must be below LEDGER_WATCH_LEASE_DURATION_S - "
                f"LEDGER_WATCH_RENEW_DEADLINE_S ({self.lease_duration_s:g} - {self.renew_deadline_s:g} = {margin:g} s) "
                "with leader election, so that a former leader's write ends before a standby may take over")


def backoff_delay_s(settings: WatchSettings, failures: int, *, retry_after_s: float | None = None,
                    rng: random.Random | None = None) -> float:
    """Delay before the next attempt after ``failures`` consecutive failures (0-based), s.

    ``settings.error_backoffs_s[failures]`` (the last entry repeats) times a jitter factor in
    ``[1 - jitter, 1 + jitter]``; a server's ``Retry-After`` wins when it is longer.
    """
    delays = settings.error_backoffs_s or (1.0,)
    base = delays[min(max(failures, 0), len(delays) - 1)]
    factor = 1.0 + (rng or random).uniform(-settings.jitter, settings.jitter)
    delay = max(0.0, base * factor)
    return max(delay, retry_after_s) if retry_after_s is not None else delay
