"""Where the shared test inputs live: ``../shared`` next to the repository root.

Import these instead of building paths in each test, so a moved checkout needs one change.
"""

from __future__ import annotations

from pathlib import Path

SHARED: Path = Path(__file__).resolve().parents[1].parent / "shared"
"""The shared directory beside the repository (DESIGN and fixtures written by the seed)."""
REAL: Path = SHARED / "fixtures" / "real"
"""Real ``resource.k8s.io`` objects and Lists as published (YAML); see its README.md."""
HISTORIES: Path = SHARED / "fixtures" / "histories"
"""Recorded watch histories (JSON Lines, DESIGN §9) and their ``*.expected.json`` answers."""
