"""The committed configuration reference is what the generator writes from the installed jobs."""

from __future__ import annotations

import importlib.util
import re
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


def settable_keys() -> dict[str, str]:
    """Every key a user can set, with where it comes from: the schema of each job of the documented
    distributions and the keys of each of their components (what selecting it adds to a job's)."""
    from theseus.cli.running import job_schema
    from theseus.config import declared_fields
    from theseus.registry import COMPONENT_KINDS, get_registry
    from theseus.training.declarations import contributed_classes

    documented = generator().DISTRIBUTIONS
    registry = get_registry()
    found: dict[str, str] = {}
    for name, entry in registry.jobs.items():
        if entry.distribution in documented:
            found.update((spec.key, f"job {name}") for spec in job_schema(name)[1] if spec.key not in found)
    for kind in COMPONENT_KINDS:
        for entry in registry.components_of(kind):
            if entry.distribution not in documented:
                continue
            for klass in contributed_classes(registry.load_component(kind, entry.name)):
                fields = declared_fields(klass) if isinstance(klass, type) else []
                found.update((spec.key, f"{kind}/{entry.name}") for spec in fields if spec.key not in found)
    return found


def test_reference_lists_every_key_a_user_can_set() -> None:
    """The architecture keys of every model (``architecture/moe/*``, ``architecture/mla/*``, the per-layer
    lists), every optimizer's, schedule's, environment's... keys are on the page, not only the defaults'."""
    page = generator().PAGE.read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE))
    settable = settable_keys()
    missing = {key: source for key, source in settable.items() if key not in listed}
    assert missing == {}
    assert {"architecture/moe/n_experts", "architecture/mla/kv_lora_rank", "optimizer/lion/beta1"} <= listed
    component_part = page.split('<a id="component-keys"></a>', 1)[1]
    assert "| `architecture/moe/n_experts` |" in component_part and "`model/deepseek_v3`" in component_part


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
