"""README "Operating it" tells an operator what the defaults do to their jobs,
and stays true to the configuration it describes."""

from __future__ import annotations

import re
from pathlib import Path

from sepp.server.config import load_config

REPO = Path(__file__).resolve().parent.parent


def operating_section() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"^## Operating it\n(.*?)^## ", text, re.S | re.M)
    assert match, "README.md has no '## Operating it' section"
    return " ".join(match.group(1).split())


def test_operating_it_says_dead_letters_are_dropped_unless_retention_is_set(
    tmp_path: Path, monkeypatch
) -> None:
    section = operating_section()
    assert "Dead letters are **dropped** unless `storage.dead_letter_retention_ms` is set" in (
        section
    )
    # ...which is what the default does.
    monkeypatch.chdir(tmp_path)  # no ./sepp.toml
    assert load_config(None, env={}).get("storage", "dead_letter_retention_ms") == 0
