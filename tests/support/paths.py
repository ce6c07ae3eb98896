"""Where the repository's parts are, for the tests that read its files or start its scripts."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent   # tests/: on sys.path, so that `support` imports
REPO = TESTS.parent
