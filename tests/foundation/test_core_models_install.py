"""``pip install theseus-core theseus-models`` is a complete framework for the offline path.

A fresh venv holds exactly the core and models wheels (theseus-data and its ``datasets`` /
``pyarrow`` / ``tokenizers`` stack absent as far as theseus can tell): the offline jobs are listed
and a shortened ``demo/gpt`` prepares the standard-library corpus
and train, without importing any of the heavy data dependencies.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT, clean_env, make_venv, pip_install, run_cli
from tests.models.conftest import forward

pytestmark = pytest.mark.slow

OFFLINE_JOBS = ["demo/gpt", "generate", "train/pretrain", "train/sft"]
HEAVY = ["datasets", "pyarrow", "tokenizers", "tiktoken"]
#: A one-layer, 32-wide model, 3 steps of 4 x 32 bytes, on the first 48 standard-library files.
TINY = [
    *TINY_GPT,
    "training/steps=3",
    "training/log_interval=1",
    "training/eval_batches=1",
    "training/checkpoint_interval=0",
    "training/async_checkpoints=false",
    "data/max_documents=48",
    "data/val_fraction=0.125",
]
#: Runs the CLI in-process, then fails when a heavy data dependency was imported along the way.
RUN_AND_CHECK_IMPORTS = f"""
import sys
from theseus.cli.main import main
try:
    main(sys.argv[1:])
finally:
    loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
    if loaded:
        sys.exit("imported " + ", ".join(loaded))
"""


#: Imports every module of the installed theseus-core and theseus-models with the heavy data
#: libraries made unimportable (the test venv could otherwise import them from its parent).
IMPORT_EVERY_MODULE = f"""
import importlib, importlib.metadata as md, sys
for name in {HEAVY!r}:
    sys.modules[name] = None
failed, count = [], 0
for dist in ("theseus-core", "theseus-models"):
    for file in md.distribution(dist).files:
        if file.suffix != ".py" or not file.parts[0] == "theseus":
            continue
        module = ".".join(file.with_suffix("").parts).removesuffix(".__init__")
        try:
            importlib.import_module(module)
            count += 1
        except Exception as exc:
            failed.append(f"{{module}}: {{type(exc).__name__}}: {{exc}}")
print(count)
sys.exit("\\n".join(failed) or None)
"""


@pytest.fixture(scope="module")
def core_models_python(wheelhouse: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = make_venv(tmp_path_factory.mktemp("core-models-venv"), inherit="packages")
    pip_install(python, wheelhouse["theseus-core"], wheelhouse["theseus-models"])
    return python


def run_offline(python: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(python), "-c", RUN_AND_CHECK_IMPORTS, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=cwd,
        timeout=600,
    )
    assert done.returncode == 0, f"theseus {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done


def test_only_core_and_models_are_installed(core_models_python: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.metadata as m, importlib.util as u\n"
        "print(sorted(d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].startswith('theseus')))\n"
        "print(u.find_spec('theseus.data.datasets.fineweb'), u.find_spec('theseus.data.jobs'))\n"
        "print(u.find_spec('theseus.data.datasets').origin, u.find_spec('theseus.data.datasets.stdlib').name)\n"
    )
    done = subprocess.run([str(core_models_python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # theseus.data.datasets is then a plain namespace holding theseus-core's modules only
    assert done.stdout.splitlines() == [
        "['theseus-core', 'theseus-models']",
        "None None",
        "None theseus.data.datasets.stdlib",
    ]


def test_every_module_imports_without_the_data_libraries(core_models_python: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(core_models_python), "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 60  # every module of both distributions was imported


def test_jobs_lists_the_offline_jobs(core_models_python: Path, tmp_path: Path) -> None:
    done = run_cli(["jobs"], python=core_models_python, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()[1:] if line.strip()}
    assert set(OFFLINE_JOBS) <= set(listed), done.stdout
    assert set(listed.values()) == {"theseus-core", "theseus-models"}, done.stdout
    components = run_cli(["components", "--kind", "dataset"], python=core_models_python, cwd=tmp_path)
    assert "dataset/python-stdlib  theseus-core" in components.stdout, components.stdout


@pytest.fixture(scope="module")
def demo(core_models_python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """One shortened ``demo/gpt`` in the core-and-models venv (its root, stdout and stderr): the demo test
    checks what it prepared and trained, the export test exports the run it left."""
    folder = tmp_path_factory.mktemp("core-models-demo")
    root = folder / "root"
    args = ["run", "demo/gpt", *TINY, "demo/max_new_tokens=8", "--root", str(root)]
    done = run_offline(core_models_python, args, folder)
    return root, done.stdout, done.stderr


def test_a_short_demo_prepares_the_corpus_and_trains(demo: tuple[Path, str, str]) -> None:
    root, stdout, stderr = demo
    assert "preparing the Python standard library (byte-level)" in stderr
    header = json.loads((root / "data" / "python-stdlib" / "header.json").read_text())
    assert header["tokenizer"] == {"kind": "byte"} and header["vocab_size"] == 257
    assert header["source"]["class"] == "theseus.data.datasets.stdlib:PythonStdlib"
    assert header["splits"]["train"]["documents"] + header["splits"]["val"]["documents"] == 48
    records = [json.loads(line) for line in (root / "runs" / "demo-gpt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3]
    assert any(r["split"] == "val" and r["loss"] > 0 for r in records)
    assert "samples from step 3" in stdout


def test_the_demo_run_exports_without_a_tokenizer_library_and_loads_in_transformers(
    core_models_python: Path, demo: tuple[Path, str, str], tmp_path: Path
) -> None:
    """The README's install, ``demo/gpt``, then ``hf/export``: the byte tokenizer is written as plain
    JSON, and transformers loads the export with logits equal to theseus' own."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from theseus.model.loading.run import load_run

    root = demo[0]
    exported = run_offline(
        core_models_python,
        ["run", "hf/export", "hf/run=demo-gpt", "hf/out=./export", "--root", str(root)],
        tmp_path,
    )
    assert "Traceback" not in exported.stderr
    folder = tmp_path / "export"
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["type"] == "BPE"

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "def f(x):\n    return x"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode())  # byte b is id b
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits.float().numpy()
    run = load_run(root, "demo-gpt")
    ours = forward(run.model, run.params, np.asarray([ids], np.int32))
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
