"""The committed configuration reference is what the generator writes from the installed jobs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.conftest import REPO, run_cli

GENERATOR = REPO / "docs" / "gen_config_reference.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_matches_the_installed_jobs() -> None:
    gen = generator()
    committed = gen.PAGE.read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "docs/reference/configuration.md is out of date; run: python docs/gen_config_reference.py"
    )


def test_reference_agrees_with_theseus_configure(tmp_path: Path) -> None:
    """The page shows what ``theseus configure`` writes: spot-check one job's YAML against its table."""
    from theseus.config import read_yaml

    out = tmp_path / "example.yaml"
    done = run_cli(["configure", "example/gpt/deterministic-inspection", str(out)])
    assert done.returncode == 0, done.stderr
    written = read_yaml(out)
    page = generator().PAGE.read_text(encoding="utf-8")
    section = page.split('<a id="job-example-gpt-deterministic-inspection"></a>', 1)[1].split("<a id=", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    shown = {row[0].strip("| `"): row[2] for row in rows}
    assert set(shown) == set(written)
    assert shown["training/steps"] == f"`{written['training/steps']}`" == "`200`"
    assert shown["metrics/csv/file"] == '`"metrics.csv"`' and written["metrics/csv/file"] == "metrics.csv"
