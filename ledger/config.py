"""The ledger's configuration file (TOML or YAML), validated with pydantic.

Settings that are lists or tables (team overrides, Kueue ``deviceClassMappings``, quotas, prices, API
tokens) live in this file; scalar settings stay in the environment (:mod:`ledger.settings`). The file
is named by ``LEDGER_CONFIG`` (or ``--config``); without one, :data:`DEFAULT` applies. Every unknown
key or bad value is an error naming its location, e.g. ``quotas[0].nominalQuota: Input should be
greater than or equal to 0``.

Example (TOML)::

    [teams]
    label = "team"                          # namespace label naming the team
    overrides = { "kube-system" = "platform" }

    [[deviceClassMappings]]                 # Kueue's shape: resource name -> DeviceClasses
    name = "example.com/gpu"
    deviceClassNames = ["gpu.example.com"]

    [[deviceClassMappings]]                 # a counter source: charge MIG partitions by memory
    name = "gpu.memory"
    deviceClassNames = ["mig.nvidia.com"]
    sources = [{ counter = "memory" }]

    [[quotas]]                              # in every cluster: each cluster's Kueue has its own
    team = "vision"
    resourceName = "example.com/gpu"
    nominalQuota = 3

    [[quotas]]                              # in one cluster only, in place of the one above
    cluster = "lab-east"
    team = "vision"
    resourceName = "example.com/gpu"
    nominalQuota = 8

    [[prices]]                              # per device-hour, by DeviceClass or model
    deviceClass = "gpu.example.com"
    perDeviceHour = 2.5

    [idle]
    unreservedSeconds = 1800

    [[api.tokens]]
    name = "chargeback"
    token = "change-me"                     # or tokenEnv = "CHARGEBACK_TOKEN"
    teams = ["vision"]                      # omit for all teams; never empty
"""

from __future__ import annotations

import io
import math
import os
import re
import tomllib
import unicodedata
from collections.abc import Hashable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from ledger.errors import Invalid, shorten_repr
from ledger.quantities import parse_quantity
from ledger.recorded import MAX_DURATION, check_mapping_keys

QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
"""Kubernetes qualified name (label-key syntax), as Kueue requires for mapping and class names."""


def _no_blanks(value: str) -> str:
    if not value.strip():
        raise ValueError("only blanks")
    if value != value.strip():
        raise ValueError("a blank at the start or the end")
    return value


Name = Annotated[str, Field(min_length=1), AfterValidator(_no_blanks)]
"""A team, namespace, label, class, resource or token name: never empty, blank, or padded with blanks (an empty
team billed its hours to no team, an empty namespace key matched nothing, and `" gpu.example.com"` priced no
class while the cost column silently went away)."""

MAX_CLUSTER_NAME = 253
"""Longest cluster name, in characters: as long as a Kubernetes object name (a DNS subdomain), which is what a
cluster is usually named after. Every row of the ledger is keyed by it, and every message that names a cluster
repeats it."""
CLUSTER_NAME_RULE = (f"a cluster name is 1 to {MAX_CLUSTER_NAME} characters, with no blank at either end and no "
                     "control character")
"""The cluster-name rule as the error messages state it."""


def _cluster_name(value: str) -> str:
    # Length first: a 300-character name of blanks is refused for its length, the rule stated once.
    if len(value) > MAX_CLUSTER_NAME:
        raise ValueError(f"{len(value)} characters")
    _no_blanks(value)
    if (control := next((c for c in value if unicodedata.category(c) == "Cc"), None)) is not None:
        raise ValueError(f"a control character ({control!r})")
    return value


ClusterName = Annotated[str, Field(min_length=1), AfterValidator(_cluster_name)]
"""A cluster name (``LEDGER_CLUSTER``, ``--cluster``): see :func:`check_cluster_name`."""


def check_cluster_name(value: str) -> str:
    """Return ``value`` when it may name a cluster: 1 to :data:`MAX_CLUSTER_NAME` characters, no blank at either
    end, no control character (Unicode category Cc: tabs, line ends, escapes).

    Why: every row is keyed by the name, so ``" lab"`` recorded a second cluster beside ``lab`` that no query for
    ``lab`` showed, and a name with a line end or an escape broke the one-line messages and tables that print it.

    Raises:
        Invalid: the name breaks the rule; the message says how (the value echoed at most 100 characters long)
            and states the rule. An empty name says only ``empty`` (the callers add what leaving it out means).
    """
    if value == "":
        raise Invalid("empty")
    try:
        return _cluster_name(value)
    except ValueError as e:
        raise Invalid(f"{shorten_repr(value)} has {e}; {CLUSTER_NAME_RULE}") from e


MAX_LABEL_NAME = 63
"""Longest name part of a label key (after ``/``), in characters, as Kubernetes allows."""
MAX_LABEL_PREFIX = 253
"""Longest prefix of a label key (a DNS subdomain, before ``/``), in characters, as Kubernetes allows."""


def _label_key(value: str) -> str:
    prefix, _, name = value.rpartition("/")
    # Kubernetes' limits on each part: a key past them is on no namespace, and every namespace would bill itself.
    if len(name) > MAX_LABEL_NAME or len(prefix) > MAX_LABEL_PREFIX or not re.match(QUALIFIED_NAME, value):
        raise ValueError(f"{shorten_repr(value)} is not a label key (a Kubernetes qualified name such as team or "
                         "example.com/team: letters, digits, '-', '_' and '.', no blank; the name after '/' at "
                         f"most {MAX_LABEL_NAME} characters, the prefix before it at most {MAX_LABEL_PREFIX})")
    return value


LabelKey = Annotated[str, Field(min_length=1), AfterValidator(_no_blanks), AfterValidator(_label_key)]
"""A namespace label key (``LEDGER_TEAM_LABEL``, ``teams.label``): never empty, never blank, a Kubernetes qualified
name (an empty label was looked up on every namespace and never found, so every namespace silently billed itself)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TeamsConfig(_Model):
    """How namespaces map to teams."""

    label: LabelKey = "team"
    """Namespace label whose value names the team; the namespace name when absent. Read when a Namespace is
    recorded (:func:`ledger.services.translator_settings`); the same rule as ``LEDGER_TEAM_LABEL``."""
    overrides: dict[Name, Name] = Field(default_factory=dict)
    """namespace -> team, winning over the label."""


class MappingSource(_Model):
    """A non-count charge of a mapping (Kueue v0.18+ counter sources, v0.19+ capacity sources).

    Exactly one of ``counter`` or ``capacity``: the charge of a request of a mapped class becomes
    ``count`` x the largest ``consumesCounters[].counters[counter]`` among the devices the class
    selects (counter), or ``count`` x ``exactly.capacity.requests[capacity]`` (else the device's
    ``requestPolicy.default``, else its full capacity) (capacity). Units: the quantity's base unit.
    """

    counter: str | None = None
    """Counter name in ``consumesCounters[].counters`` (e.g. ``memory``)."""
    capacity: str | None = None
    """Capacity name in ``capacity.requests`` / device ``capacity`` (e.g. ``gpu.example.com/memory``)."""

    @model_validator(mode="after")
    def _one_kind(self) -> MappingSource:
        if (self.counter is None) == (self.capacity is None):
            raise ValueError("give exactly one of counter or capacity")
        return self


class DeviceClassMapping(_Model):
    """Kueue ``resources.deviceClassMappings[]``: a logical resource name and the classes counted under it."""

    name: str = Field(pattern=QUALIFIED_NAME, max_length=253)
    device_class_names: list[str] = Field(alias="deviceClassNames", min_length=1, max_length=8)
    sources: list[MappingSource] = Field(default_factory=list)
    """Empty (the default): each request counts ``count`` devices. Otherwise the summed charges of
    these sources, in the source's unit (bytes for a memory counter)."""

    @field_validator("device_class_names")
    @classmethod
    def _qualified(cls, names: list[str]) -> list[str]:
        for name in names:
            if len(name) > 253 or not re.match(QUALIFIED_NAME, name):
                raise ValueError(f"{name!r} is not a valid qualified name (label-key syntax, at most 253 "
                                 "characters)")
        return names


MAX_NOMINAL_QUOTA = 2**53
"""The largest ``nominalQuota`` accepted: 9,007,199,254,740,992. Why a bound: a quota is kept as a float (the
API's schema, the quota snapshots' ``double precision`` column), which holds every whole number up to 2**53 and
not all above it; ``99999999999999999999999999999999999`` was printed as ``99,999,999,999,999,996,863,...``.
Refusing is simpler than carrying decimals through every answer, and 2**53 is still 8 PiB of memory in bytes."""


SMALLEST_NOMINAL_QUOTA = Decimal("1e-9")
"""The smallest quota above 0: ``1n``, the finest Kubernetes Quantity (what a claim consumes is never finer)."""


class Quota(_Model):
    """Nominal quota of a team for one logical resource name in a cluster (a count, like Kueue's nominalQuota).

    Kueue admits workloads per cluster (each cluster's ClusterQueues hold their own nominal quotas), so usage is
    counted per cluster and compared with the quota of that cluster: without ``cluster`` the entry applies in every
    cluster the ledger holds, with it only in that one, where it takes the place of an entry without ``cluster``.
    """

    cluster: ClusterName | None = None
    """The cluster the quota applies in (``LEDGER_CLUSTER`` of its watch worker); left out (``None``): every
    cluster."""
    team: Name
    resource_name: Name = Field(alias="resourceName")
    nominal_quota: float = Field(alias="nominalQuota", ge=0, allow_inf_nan=False)
    """A count, or a quantity string (``"80Gi"``) parsed to its base unit for counter/capacity sources; 0 to
    :data:`MAX_NOMINAL_QUOTA`, so that every whole quota is kept exactly."""

    @field_validator("cluster")
    @classmethod
    def _some_cluster(cls, cluster: str | None, info: ValidationInfo) -> str | None:
        # As ApiToken.teams: an explicit null in a file (YAML's `cluster:` with its value forgotten) would have meant
        # every cluster, the widest reading of a mistake; a dumped configuration handed to the API's workers writes
        # None for "left out", and is taken as it is.
        if cluster is None and info.context is FILE_CONTEXT:
            raise ValueError("empty (null): leave cluster out for a quota in every cluster, or name the cluster")
        return cluster

    @field_validator("nominal_quota", mode="before")
    @classmethod
    def _quantity(cls, value: object) -> object:
        if isinstance(value, bool):
            # pydantic would read true as 1.0: TOML's true and YAML's yes are no count.
            raise ValueError(f"{value!r} is a boolean, not a count or a quantity (such as 4 or \"80Gi\")")
        if isinstance(value, str):
            try:
                exact = parse_quantity(value)
            except Invalid as e:
                raise ValueError(str(e)) from e
        elif isinstance(value, int | float) and not isinstance(value, bool):
            exact = Decimal(value)  # exact: an int as it was written, a float as the value it holds
        else:
            return value  # pydantic says what is wrong with it
        # Compared exactly, before the float: 2**53 + 1 would become 2**53 and pass. NaN and infinities (and a
        # quantity too large for a float) are left to the finite-number check.
        if exact.is_finite() and math.isfinite(float(exact)) and exact > MAX_NOMINAL_QUOTA:
            raise ValueError(f"{shorten_repr(value)} is above {MAX_NOMINAL_QUOTA:,} (2**53), the largest quota "
                             "kept exactly")
        if exact.is_finite() and 0 < exact < SMALLEST_NOMINAL_QUOTA:
            # Nothing a claim uses is finer than 1n, so such a quota is a typo (1e-300 printed 300 digits).
            raise ValueError(f"{shorten_repr(value)} is above 0 but below 1n (0.000000001), the finest Kubernetes "
                             "quantity")
        return float(exact) if isinstance(value, str) else value


MAX_PRICE = 1e9
"""The largest ``perDeviceHour`` accepted. Why a bound: a cost is device-hours x price, and a price near the
largest float (``1e308``) made it infinite, which JSON cannot carry (the API answered ``null``, the CLI an
invalid ``Infinity``, the CSV ``inf``). A billion a device-hour is far beyond any real price in any currency, and
keeps the cost of a century of a million devices finite."""


class Price(_Model):
    """Price per device-hour for a DeviceClass or a device model (exactly one of them)."""

    device_class: Name | None = Field(default=None, alias="deviceClass")
    model: Name | None = None
    per_device_hour: float = Field(alias="perDeviceHour", ge=0, le=MAX_PRICE, allow_inf_nan=False)
    """Price of one device-hour, from 0 to :data:`MAX_PRICE` in ``currency``."""
    currency: Annotated[str, Field(min_length=1, max_length=32), AfterValidator(_no_blanks)] = "USD"
    """What the price is in, printed beside every cost (an ISO 4217 code such as ``USD``, or an in-house unit):
    1 to 32 characters, no blank at either end (an empty one printed costs with no unit)."""

    @model_validator(mode="after")
    def _one_key(self) -> Price:
        if (self.device_class is None) == (self.model is None):
            raise ValueError("give exactly one of deviceClass or model")
        return self


IdleSeconds = Annotated[float, Field(ge=0, le=MAX_DURATION.total_seconds(), allow_inf_nan=False, strict=True)]
"""An idle threshold in seconds, from 0 to 100 years: the bound ``--min-idle`` and ``minIdle`` have (a threshold
beyond it is a typo, and ``1e400`` reads as infinity). Strict: ``true`` is not 1 second."""


class IdleConfig(_Model):
    """Idle-claim thresholds per category, in seconds from 0 to 100 years (DESIGN §5: 30 minutes each by default)."""

    unreserved_seconds: IdleSeconds = Field(default=1800, alias="unreservedSeconds")
    inactive_consumers_seconds: IdleSeconds = Field(default=1800, alias="inactiveConsumersSeconds")
    unreferenced_seconds: IdleSeconds = Field(default=1800, alias="unreferencedSeconds")


MIN_TOKEN_LENGTH = 16
"""Shortest API token accepted, in characters."""
PADDED_TOKEN = ("a blank at the start or the end (a line end, perhaps): the API strips the token a request sends, "
                "so this one could never be presented")
"""Why a token padded with blanks is refused: it was accepted, and every request bearing it was a 401."""


UNSENDABLE_TOKEN = ("a character outside printable ASCII (a letter such as 'Ä', a control character): HTTP clients "
                    "send an Authorization header as bytes the API does not read back as this text, so it could "
                    "never be presented")
"""Why a token with a non-ASCII or control character is refused: accepted, it matched no request (401)."""


def token_problem(value: str) -> str | None:
    """Why ``value`` cannot serve as a bearer token (:data:`PADDED_TOKEN`, :data:`UNSENDABLE_TOKEN`), or ``None``.

    The reason never holds the value: it is a secret.
    """
    if value != value.strip():
        return PADDED_TOKEN
    if not all(" " <= c <= "~" for c in value):
        return UNSENDABLE_TOKEN
    return None


def _unpadded_token(value: str) -> str:
    if (problem := token_problem(value)) is not None:
        raise ValueError(problem)
    return value


def _variable_name(value: str) -> str:
    # An empty name read as "environment variable  is unset", and a name holding `=` cannot be set (the environment
    # holds NAME=VALUE pairs). Blanks, control characters and non-ASCII are refused as well: a shell cannot export
    # such a name, and a Pod's env entry that holds one is most likely a typo.
    if not value:
        raise ValueError("empty: name the environment variable that holds the token")
    if "=" in value or not all("!" <= c <= "~" for c in value):
        raise ValueError(f"{value!r} is refused as an environment variable name: use printable ASCII without blanks "
                         "or '='")
    return value


FILE_CONTEXT: dict[str, bool] = {"written": True}
"""Validation context of a configuration read from its file (:func:`load_config`): checks that apply to what a
person wrote, not to a configuration the ledger dumped itself, test for this very object."""


class ApiToken(_Model):
    """A bearer token of the REST API; ``teams`` limits what it sees (``None`` = every team)."""

    name: Name
    token: Annotated[str, Field(min_length=MIN_TOKEN_LENGTH), AfterValidator(_unpadded_token)] | None = None
    """The token itself: at least :data:`MIN_TOKEN_LENGTH` characters, no blank at either end."""
    token_env: Annotated[str, AfterValidator(_variable_name)] | None = Field(default=None, alias="tokenEnv")
    """The environment variable holding the token instead, read when the app is built (same rules): its name is
    printable ASCII, with no blank and no ``=``."""
    teams: list[Name] | None = None
    """The teams whose rows the token sees (a team listed twice counts once); left out (``None``): every team.
    Never empty: ``[]`` reads as "no limit" to some and saw no team here, so it is refused rather than guessed."""

    @field_validator("teams")
    @classmethod
    def _some_team(cls, teams: list[str] | None, info: ValidationInfo) -> list[str] | None:
        # Only a value given is validated (the default is not): None read from a file (FILE_CONTEXT) is an explicit
        # null, as YAML reads `teams:` with its items commented out, and would have meant every team. A dumped
        # configuration handed to the API's workers writes None for "left out", and is taken as it is.
        if teams is None and info.context is FILE_CONTEXT:
            raise ValueError("empty (null): leave teams out for a token that sees every team, or list the teams "
                             "it sees")
        if teams == []:
            raise ValueError("an empty list: leave teams out for a token that sees every team, or list the teams "
                             "it sees")
        return teams

    @model_validator(mode="after")
    def _one_source(self) -> ApiToken:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("give exactly one of token or tokenEnv")
        return self

    def secret(self) -> str:
        """Return the token value (read from the environment for ``tokenEnv``).

        Raises:
            Invalid: the named environment variable is unset, shorter than :data:`MIN_TOKEN_LENGTH` characters, or
                has a blank at either end or a character outside printable ASCII (:func:`token_problem`).
        """
        if self.token is not None:
            return self.token
        value = os.environ.get(str(self.token_env), "")
        if len(value) < MIN_TOKEN_LENGTH:
            raise Invalid(f"api.tokens[{self.name}]: environment variable {self.token_env} is unset or "
                          f"shorter than {MIN_TOKEN_LENGTH} characters")
        if (problem := token_problem(value)) is not None:
            raise Invalid(f"api.tokens[{self.name}]: environment variable {self.token_env} has {problem}")
        return value


class ApiConfig(_Model):
    """REST API access."""

    tokens: list[ApiToken] = Field(default_factory=list)
    """One entry per token: no two entries share a name or a token (see :meth:`secrets` for ``tokenEnv``)."""
    metrics_public: bool = Field(default=True, alias="metricsPublic")
    """Serve ``/metrics`` without a token (default); ``false``: any configured token is needed (when tokens are
    configured at all)."""

    @field_validator("tokens")
    @classmethod
    def _one_entry_per_token(cls, tokens: list[ApiToken]) -> list[ApiToken]:
        # A token is one identity: with two entries a request matched both and the last entry's teams applied, so
        # the order of the file decided whether the token saw one team or every team and the audit log.
        if (pair := _first_repeat([token.name for token in tokens])) is not None:
            first, second = pair
            raise ValueError(f"the name {tokens[first].name!r} is given twice (api.tokens[{first}] and "
                             f"api.tokens[{second}]); give each entry its own name")
        # Equal literal tokens, or one tokenEnv variable named twice; two variables holding one value: secrets().
        sources = [("tokenEnv", t.token_env) if t.token is None else ("token", t.token) for t in tokens]
        if (pair := _first_repeat(sources)) is not None:
            raise ValueError(_same_token(tokens, *pair))
        return tokens

    def secrets(self) -> list[str]:
        """Return each token's value, in the order of :attr:`tokens` (``tokenEnv`` variables read now).

        Raises:
            Invalid: a ``tokenEnv`` variable is unset or too short (:meth:`ApiToken.secret`), or two entries give
                the same value (two variables, or a variable and a ``token``); the message names both entries by
                position and name, never the value.
        """
        secrets = [token.secret() for token in self.tokens]
        if (pair := _first_repeat(secrets)) is not None:
            raise Invalid(f"api.tokens: {_same_token(self.tokens, *pair)}")
        return secrets


def _first_repeat(values: Sequence[Hashable]) -> tuple[int, int] | None:
    """The positions (0-based) of the first value given twice, where it first and next appears; ``None`` if none."""
    seen: dict[Hashable, int] = {}
    for position, value in enumerate(values):
        if value in seen:
            return seen[value], position
        seen[value] = position
    return None


def _same_token(tokens: Sequence[ApiToken], first: int, second: int) -> str:
    """Why two entries of ``api.tokens`` cannot share a token, naming both (position, name, variable), never it."""

    def entry(position: int) -> str:
        token = tokens[position]
        source = f" (tokenEnv {token.token_env})" if token.token_env is not None else ""
        return f"api.tokens[{position}] {token.name!r}{source}"

    return (f"{entry(first)} and {entry(second)} have the same token, so the API could not tell whose teams "
            "apply; give each entry its own token")


class LedgerConfig(_Model):
    """The whole configuration file."""

    teams: TeamsConfig = Field(default_factory=TeamsConfig)
    device_class_mappings: list[DeviceClassMapping] = Field(default_factory=list, alias="deviceClassMappings",
                                                            max_length=16)
    quotas: list[Quota] = Field(default_factory=list)
    prices: list[Price] = Field(default_factory=list)
    idle: IdleConfig = Field(default_factory=IdleConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)

    @model_validator(mode="after")
    def _kueue_rules(self) -> LedgerConfig:
        names: set[str] = set()
        owner: dict[str, DeviceClassMapping] = {}
        for mapping in self.device_class_mappings:
            if mapping.name in names:
                raise ValueError(f"deviceClassMappings: name {mapping.name!r} appears twice")
            names.add(mapping.name)
            for cls in mapping.device_class_names:
                first = owner.get(cls)
                # Kueue v0.19: a class may be in two mappings only when both charge different counters.
                if first is not None and not _distinct_counters(first, mapping):
                    raise ValueError(f"deviceClassMappings: device class {cls!r} already mapped to "
                                     f"resource {first.name!r}")
                owner.setdefault(cls, mapping)
        priced: dict[tuple[str, str], int] = {}
        for i, price in enumerate(self.prices):
            key = ("deviceClass", price.device_class) if price.device_class is not None else ("model", str(price.model))
            if key in priced:
                # One price a DeviceClass or model: a second one silently overrode the first.
                raise ValueError(f"prices: {key[0]} {key[1]!r} is priced twice (prices[{priced[key]}] and prices[{i}])")
            priced[key] = i
        currencies = sorted({price.currency for price in self.prices})
        if len(currencies) > 1:
            # Costs are added up across rows and classes: two currencies cannot share one total.
            raise ValueError(f"prices: every price needs the same currency, got {', '.join(currencies)}")
        seen: set[tuple[str | None, str, str]] = set()
        for quota in self.quotas:
            if (quota.cluster, quota.team, quota.resource_name) in seen:
                where = "every cluster" if quota.cluster is None else f"cluster {quota.cluster!r}"
                raise ValueError(f"quotas: team {quota.team!r} has two quotas for {quota.resource_name!r} in {where}")
            seen.add((quota.cluster, quota.team, quota.resource_name))
        return self

    def mappings_of(self, device_class: str) -> list[DeviceClassMapping]:
        """Return every mapping a DeviceClass is counted under (empty if unmapped; two only for two
        counter mappings with different counters), in configuration order."""
        return [m for m in self.device_class_mappings if device_class in m.device_class_names]

    def mapping_of(self, device_class: str) -> DeviceClassMapping | None:
        """Return the first mapping a DeviceClass is counted under, or ``None`` if unmapped."""
        found = self.mappings_of(device_class)
        return found[0] if found else None

    def team_of(self, namespace: str, recorded: str) -> str:
        """Return the team billed for ``namespace``: an override from ``teams.overrides``, else ``recorded``
        (the team the ledger recorded from the namespace label). The read queries take the same mapping as
        ``overrides`` and apply it the same way (``ledger.projections.queries.NO_OVERRIDES`` when none)."""
        return self.teams.overrides.get(namespace, recorded)

    def quota_of(self, *, cluster: str, team: str, resource_name: str) -> float | None:
        """Return the nominal quota of ``team`` for ``resource_name`` in ``cluster``: the entry naming ``cluster``,
        else the entry without one (``None`` when neither is configured)."""
        everywhere = None
        for quota in self.quotas:
            if quota.team == team and quota.resource_name == resource_name:
                if quota.cluster == cluster:
                    return quota.nominal_quota
                if quota.cluster is None:
                    everywhere = quota.nominal_quota
        return everywhere

    def quota_keys_of(self, cluster: str) -> set[tuple[str, str]]:
        """Return the (team, resource name) pairs with a nominal quota in ``cluster`` (entries naming it or none)."""
        return {(q.team, q.resource_name) for q in self.quotas if q.cluster in (None, cluster)}

    def resource_name_of(self, device_class: str) -> str | None:
        """Return the logical resource name a DeviceClass is counted under, or ``None`` if unmapped."""
        for mapping in self.device_class_mappings:
            if device_class in mapping.device_class_names:
                return mapping.name
        return None


def _distinct_counters(a: DeviceClassMapping, b: DeviceClassMapping) -> bool:
    counters_a = {s.counter for s in a.sources}
    counters_b = {s.counter for s in b.sources}
    only_counters = all(s.counter is not None for s in (*a.sources, *b.sources))
    return bool(a.sources and b.sources and only_counters and not counters_a & counters_b)


DEFAULT = LedgerConfig()


def load_config(path: Path | str | None) -> LedgerConfig:
    """Read and validate the configuration file at ``path`` (``.toml``, ``.yaml`` or ``.yml``).

    Returns :data:`DEFAULT` when ``path`` is ``None``.

    Raises:
        Invalid: the file cannot be read or parsed (nested too deeply included), or a key is unknown or has a bad
            value; the message names the file and every bad location.
    """
    if path is None:
        return DEFAULT
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading byte-order mark is tolerated
    except OSError as e:
        raise Invalid(f"{path}: cannot read the configuration file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise Invalid(f"{path}: the configuration file is not UTF-8 text (byte {e.start})") from e
    try:
        if path.suffix == ".toml":
            data: object = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            stream = io.StringIO(text)
            stream.name = str(path)  # PyYAML names the file in its messages by this attribute
            data = yaml.load(stream, Loader=_UniqueKeyLoader)  # a SafeLoader: plain data only (see the class)
            data = {} if data is None else data  # an empty file, or one of comments only: the defaults
        else:
            raise Invalid(f"{path}: the configuration file must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise Invalid(f"{path}: not valid {path.suffix[1:].upper()}: {e}") from e
    except RecursionError as e:
        # Both parsers recurse once per nesting level: a few hundred levels of [ or { reach Python's limit. No
        # setting of this file nests deeper than four.
        raise Invalid(f"{path}: nested too deeply to read (no setting here nests more than a few levels)") from e
    if not isinstance(data, dict):
        # Not pydantic's "Input should be a valid dictionary or instance of LedgerConfig": say what the file holds.
        raise Invalid(f"{path}: the configuration file must hold a mapping of sections (teams, prices, ...), "
                      f"not {_yaml_kind(data)}")
    try:
        return LedgerConfig.model_validate(data, context=FILE_CONTEXT)
    except ValidationError as e:
        raise Invalid(f"{path}: {'; '.join(_problem(err) for err in e.errors())}") from e


def _yaml_kind(value: object) -> str:
    """What a YAML document's top level is, in words: ``a list``, ``a string``, ``a number``, ``a boolean``."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else f"a {type(value).__name__}"


def error_message(err: ErrorDetails) -> str:
    """The message of one pydantic validation error as the check wrote it (pydantic prefixes the text of a
    ``ValueError`` with ``Value error, ``); the settings' messages use it too."""
    return str(err["ctx"]["error"]) if err["type"] == "value_error" and "ctx" in err else err["msg"]


def _problem(err: ErrorDetails) -> str:
    """One validation error as ``location: message`` (:func:`error_message`); a check of the whole file has no
    location."""
    message = error_message(err)
    given = err.get("input")
    if err["type"] == "string_type" and isinstance(given, bool | int | float):
        # YAML reads an unquoted 2024 as a number and no as false (TOML 2024 too): pydantic only says a string was
        # expected, without the value it got or the remedy.
        message += f" (got {given!r}, a value written without quotes read as a number or a boolean: quote it)"
    where = ".".join('""' if p == "" else str(p) for p in err["loc"])  # an empty key shown, not left out
    return f"{where}: {message}" if where else message


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only, no Python objects), refusing a mapping that holds a key twice.

    Why: YAML says keys are unique, but PyYAML keeps the last of two silently, so a second ``prices:`` or a
    ``currency`` given twice replaced the first without a word (TOML refuses the same file). The check uses the
    loader's own hook and error type, so the message names the line as PyYAML's other errors do. Merge keys
    (``<<``) are left to PyYAML: a key they bring in may be overridden, as YAML allows.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        """The mapping of ``node``; raises ``yaml.constructor.ConstructorError`` for a key given twice, or a key
        that YAML reads as something other than a string (every key of the file is a section, a field or a name).

        Why the second: a namespace called ``2024``, ``no`` or ``null`` written unquoted as an ``overrides`` key
        is an int, a bool or nothing to YAML, and the model could only say "Input should be a valid string" at
        ``teams.overrides.0``, without the line or the text as written; here the message names both.
        """
        check_mapping_keys(self, node, deep=deep, names_only=True)
        return super().construct_mapping(node, deep=deep)
