"""Shared fixtures: where HPCToolkit's reference data lives (``../shared`` beside the checkout)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO.parent / "shared" / "reference" / "hpctoolkit-testdata"


@pytest.fixture(scope="session")
def reference() -> Path:
    """The reference data directory; a missing one is an error, never a skip."""
    if not REFERENCE.is_dir():
        raise FileNotFoundError(
            f"HPCToolkit reference data not found at {REFERENCE}: "
            "check out the shared folder beside the repository"
        )
    return REFERENCE
