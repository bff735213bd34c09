"""The data jobs through the real command line, in subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import clean_env, run_cli

SMALL = ["data/max_documents=6", "data/val_fraction=0.2"]


def env() -> dict[str, str]:
    return clean_env(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")


def test_tokenize_job_prepares_then_is_a_noop(tmp_path: Path) -> None:
    root = tmp_path / "root"
    done = run_cli(["run", "data/tokenize", "data/dataset=python-stdlib", *SMALL, "--root", str(root)], env=env())
    assert done.returncode == 0, done.stderr
    folder = root / "data" / "python-stdlib"
    assert sorted(p.name for p in folder.iterdir()) == ["header.json", "train.bin", "train.idx", "val.bin", "val.idx"]
    header = json.loads((folder / "header.json").read_text())
    assert header["splits"]["train"]["documents"] == 5 and header["splits"]["val"]["documents"] == 1
    assert (folder / "train.bin").stat().st_size == 2 * header["splits"]["train"]["tokens"]
    assert "prepared python-stdlib: train" in done.stdout

    stamp = (folder / "header.json").stat().st_mtime_ns
    again = run_cli(["run", "data/tokenize", *SMALL, "--root", str(root)], env=env())
    assert again.returncode == 0, again.stderr
    assert "already prepared python-stdlib" in again.stdout and "data/force=true" in again.stdout
    assert (folder / "header.json").stat().st_mtime_ns == stamp

    forced = run_cli(["run", "data/tokenize", *SMALL, "data/force=true", "--root", str(root)], env=env())
    assert forced.returncode == 0 and (folder / "header.json").stat().st_mtime_ns != stamp

    changed = run_cli(["run", "data/tokenize", "data/max_documents=7", "--root", str(root)], env=env())
    assert changed.returncode == 2
    assert changed.stderr.startswith("error: ") and "data/max_documents=6 (now 7)" in changed.stderr
    assert "Traceback" not in changed.stderr


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    cases = {
        "unknown dataset 'pyhton-stdlib'; did you mean 'python-stdlib'?": ["data/dataset=pyhton-stdlib"],
        "tokenizer file": ["data/tokenizer=hf:/nonexistent/tokenizer.json", *SMALL],
        "unknown configuration key 'data/max_docs'": ["data/max_docs=3"],
        "data/fineweb/path=/nonexistent does not exist": ["data/dataset=fineweb", "data/fineweb/path=/nonexistent"],
        "split 'val' of 'python-stdlib' got no documents": ["data/max_documents=2", "data/val_fraction=0.1"],
    }
    for expected, args in cases.items():
        done = run_cli(["run", "data/tokenize", *args, "--root", root], env=env())
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and expected in lines[-1], (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "root" / "data" / "python-stdlib").exists()


def test_train_bpe_then_tokenize_with_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    trained = run_cli(
        ["run", "data/train-bpe", "data/bpe/vocab_size=320", "data/max_documents=10", "--root", str(root)], env=env()
    )
    assert trained.returncode == 0, trained.stderr
    path = root / "tokenizers" / "python-stdlib-bpe-320.json"
    assert path.is_file() and f"data/tokenizer=hf:{path}" in trained.stdout
    done = run_cli(
        ["run", "data/tokenize", f"data/tokenizer=hf:{path}", "data/name=stdlib-bpe", *SMALL, "--root", str(root)],
        env=env(),
    )
    assert done.returncode == 0, done.stderr
    header = json.loads((root / "data" / "stdlib-bpe" / "header.json").read_text())
    assert header["tokenizer"]["kind"] == "hf" and header["tokenizer"]["path"] == "tokenizer.json"
    assert 257 < header["vocab_size"] <= 320 and header["dtype"] == "uint16"


def test_listing_and_configuring_import_no_heavy_libraries(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from theseus.cli.main import main\n"
        "main(['jobs'])\n"
        f"main(['configure', 'data/tokenize', {str(tmp_path / 'c.yaml')!r}])\n"
        "heavy = [m for m in ('jax', 'flax', 'datasets', 'tokenizers', 'pyarrow') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "data/tokenize" in done.stdout and "data/train-bpe" in done.stdout
    text = (tmp_path / "c.yaml").read_text()
    assert "fineweb:" in text and "subset: sample-10BT" in text and "tokenizer: byte" in text
