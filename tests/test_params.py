"""The one parameter table (edgellama/params.py) and its page: docs/parameters.md is generated from the table
and must be what the table says now; every field names its spelling on every door that takes it."""

from __future__ import annotations

from pathlib import Path

from edgellama import params as R

ROOT = Path(__file__).resolve().parents[1]


def test_docs_parameters_md_is_generated_from_the_table() -> None:
    page = (ROOT / "docs" / "parameters.md").read_text(encoding="utf-8")
    assert page == R.markdown(), "docs/parameters.md is stale: python -m edgellama.params > docs/parameters.md"


def test_every_sampling_field_is_spelled_on_every_door() -> None:
    for f in R.FIELDS:
        assert set(f.names) == {R.CLI, R.V1, R.OPENAI, R.PYTHON}, f.name
        assert set(f.notes) <= set(f.names), f.name
    assert {r.name for r in R.REQUEST_FIELDS} >= {"prompt", "messages", "grammar", "json_schema", "logprobs", "tools"}
