"""Settings read from the environment (prefix ``LEDGER_``) by pydantic-settings.

The same names serve the CLI, the API, the workers and ``compose.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger.config import ClusterName, LabelKey

MAX_BATCH_SIZE: Final = 100_000
"""Most watch events per append transaction: twenty times the default. A batch is held in memory and written
in one transaction, so a larger one is a typo (``5000000``), not a tuning."""


class Settings(BaseSettings):
    """Process-wide settings; every field can be set as ``LEDGER_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="LEDGER_", extra="ignore")

    database_url: str | None = None
    """SQLAlchemy/libpq URL of the ledger database. Unset: an embedded PostgreSQL in ``data_dir``."""
    data_dir: Path | None = None
    """Data directory of the embedded PostgreSQL. Unset: the user's data dir (root: /var/lib/dra-ledger)."""
    cluster: ClusterName = "default"
    """Name of the cluster the recorded objects come from; every row is keyed by it. 1 to 253 characters, no blank
    at either end, no control character (:func:`ledger.config.check_cluster_name`)."""
    team_label: LabelKey = "team"
    """Namespace label naming the team billed for the namespace; the namespace name when absent. A label key:
    never empty, no blank (an empty one was found on no namespace, so every namespace billed itself)."""
    config: Path | None = None
    """Configuration file (TOML or YAML, see :mod:`ledger.config`); unset = built-in defaults."""
    @field_validator("database_url", "data_dir", "config", mode="before")
    @classmethod
    def _not_blank(cls, value: object) -> object:
        """Refuse a set but empty (or blank) value: ``LEDGER_DATA_DIR=""`` read as the current directory (an embedded
        server was made in whatever directory the command ran from), ``LEDGER_DATABASE_URL=""`` as unset (a
        container whose URL came out empty wrote to a throwaway embedded server), ``LEDGER_CONFIG=""`` as ``.``."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty; unset the variable for its default")
        return value

    batch_size: int = Field(default=5000, ge=1, le=MAX_BATCH_SIZE)
    """Watch events per append transaction during replay (bigger batches, fewer commits and fewer rewrites of
    the same translator state rows: 5,000 replayed ~11% faster than 1,000, measured on a simulated fleet). 1 to
    :data:`MAX_BATCH_SIZE`: 0 or less is no size at all (it was taken without a word, a commit a line)."""
