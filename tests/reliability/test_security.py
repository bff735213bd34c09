"""Loading data, configurations and checkpoints never executes code: no pickle, no unsafe YAML, no eval."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.training.conftest import write_byte_corpus

SOURCES = [REPO / d / "src" for d in ("theseus-core", "theseus-models", "theseus-data", "theseus-plugins-example")]
#: Modules whose loaders run code from the bytes they read.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib", "torch"}
UNSAFE_YAML = {"load", "unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all"}


def source_files() -> list[Path]:
    files = [p for root in SOURCES for p in sorted(root.rglob("*.py"))]
    assert len(files) > 50
    return files


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def findings(path: Path) -> list[str]:
    """Code-executing loaders used in one source file, as ``file:line: what``."""
    found: list[str] = []
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(REPO)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"{where}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            unsafe_yaml = name.split(".")[0] == "yaml" and name.split(".")[-1] in UNSAFE_YAML
            if name in ("eval", "exec") or unsafe_yaml:
                found.append(f"{where}:{node.lineno}: {name}()")
            elif name.endswith(".load") and name.split(".")[0] in ("np", "numpy", "jnp"):
                flag = keywords.get("allow_pickle")
                if not (isinstance(flag, ast.Constant) and flag.value is False):
                    found.append(f"{where}:{node.lineno}: {name}() without allow_pickle=False")
    return found


def test_no_code_executing_loaders_in_the_sources() -> None:
    problems = [problem for path in source_files() for problem in findings(path)]
    assert problems == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.reliability.test_security.REPO", tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nimport numpy as np\nimport yaml\n"
        "np.load('a.npy')\nnp.load('b.npy', allow_pickle=True)\nnp.load('c.npy', allow_pickle=False)\n"
        "yaml.load(open('x'))\nyaml.safe_load('a: 1')\neval('1')\n"
    )
    assert findings(bad) == [
        "bad.py:1: import pickle",
        "bad.py:4: np.load() without allow_pickle=False",
        "bad.py:5: np.load() without allow_pickle=False",
        "bad.py:7: yaml.load()",
        "bad.py:9: eval()",
    ]


def test_prepared_data_and_checkpoints_load_without_unpickling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jax
    import jax.numpy as jnp

    from theseus.checkpoint import CheckpointStore
    from theseus.training.flywheel import Flywheel

    write_byte_corpus(tmp_path, "corpus", documents=16)
    header = json.loads((tmp_path / "data" / "corpus" / "header.json").read_text())  # plain JSON
    assert header["tokenizer"] == {"kind": "byte"}
    store = CheckpointStore(tmp_path / "checkpoints", async_save=False)
    store.save(1, {"params": {"w": jnp.arange(4.0)}}, {"step": 1})

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a load path tried to unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(np, "load", refuse)
    with Flywheel("corpus", root=tmp_path, block_size=8, batch_size=2) as flywheel:
        assert flywheel.batch(0)["x"].shape == (2, 8)
    restored = store.restore_latest({"params": {"w": jax.ShapeDtypeStruct((4,), jnp.float32)}})
    store.close()
    assert restored is not None
    step, tree, meta = restored
    assert step == 1 and meta == {"step": 1} and np.array_equal(np.asarray(tree["params"]["w"]), [0, 1, 2, 3])


def test_a_run_record_cannot_choose_code_to_import() -> None:
    import sys

    from theseus.errors import ConfigError
    from theseus.model.loading.run import model_class
    from theseus.model.models import GPT

    assert "this" not in sys.modules  # importing it prints to stdout: a stand-in for any side effect
    for record in ({"model": "this:s"}, {"job_class": "this:s"}):
        with pytest.raises(ConfigError, match="'this:s', which is neither loaded nor a registered model or job"):
            model_class(record, "evil")
    assert "this" not in sys.modules
    assert model_class({"model": "theseus.model.models.gpt.model:GPT"}, "good") is GPT
    assert model_class({"model": "theseus.model.models.gpt:GPT"}, "recorded before families were folders") is GPT
