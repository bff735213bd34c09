"""What the machine refuses a job: a read-only root or output, a full disk, no memory, a damaged
``metrics.jsonl``. Each ends in one ``error:`` line (exit 2) naming the path or keys and the fix, with
nothing written before lost.

Read-only and full file systems are real tmpfs mounts, made where the tests run as root and may
mount (CI); elsewhere those tests are skipped with the reason.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.conftest import error_line, train_args

Cli = Callable[[list[str]], tuple[int, str]]
Mount = Callable[..., Path]

pytestmark = pytest.mark.usefixtures("compilation_cache")

#: A one-step GPT run small enough to export (``hf/export`` knows GPT, not the test model).
GPT = [
    "run",
    "train/pretrain",
    "select/dataset=corpus:1:pmd",
    "architecture/block_size=16",
    "architecture/n_layers=1",
    "architecture/n_embd=16",
    "architecture/n_heads=2",
    "training/batch_size=2",
    "training/steps=1",
    "training/eval_batches=0",
    "training/checkpoint_interval=1",
    "training/progress=false",
    "run/name=gpt",
]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (to show nothing was written over)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _mount(*args: str) -> str | None:
    """Run ``mount ARGS``; the reason it failed, or None."""
    try:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.strip() or f"mount exited {done.returncode}"


@pytest.fixture()
def mount(tmp_path: Path) -> Iterator[Mount]:
    """``mount(name, size, fill=None, read_only=False)``: a tmpfs of ``size`` at ``tmp_path/name``,
    holding what ``fill(folder)`` writes, then remounted read-only if asked; unmounted afterwards."""
    mounted: list[Path] = []

    def make(name: str, size: str, fill: Callable[[Path], None] | None = None, read_only: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (CI runs the suite as root)")
        folder = tmp_path / name
        folder.mkdir()
        failed = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
        if failed:
            pytest.skip(f"cannot mount a tmpfs here: {failed}")
        mounted.append(folder)
        if fill is not None:
            fill(folder)
        if read_only and (failed := _mount("-o", "remount,ro", str(folder))):
            pytest.skip(f"cannot remount a tmpfs read-only here: {failed}")
        return folder

    yield make
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def copy_data(source: Path) -> Callable[[Path], None]:
    """A ``fill`` that copies the prepared data of root ``source``."""
    return lambda folder: shutil.copytree(source / "data", folder / "data")


def documents(folder: Path, count: int) -> Path:
    """A JSON-lines file of ``count`` documents for ``data/dataset=local``."""
    path = folder / "docs.jsonl"
    text = "the cat sat on the mat and then it slept quietly all day " * 4
    path.write_text("".join(json.dumps({"text": f"{text}{i}"}) + "\n" for i in range(count)))
    return path


def tokenize(root: Path, docs: Path) -> list[str]:
    return [
        "run",
        "data/tokenize",
        "--root",
        str(root),
        "data/dataset=local",
        f"data/local/path={docs}",
        "data/name=corpus",
        "data/force=true",
    ]


# -- read-only ------------------------------------------------------------------------------------


def test_read_only_root_for_training(cli: Cli, root: Path, mount: Mount) -> None:
    read_only = mount("ro-root", "1m", copy_data(root), read_only=True)
    before = snapshot(read_only)
    code, err = cli(train_args(read_only))
    assert code == 2
    assert error_line(err) == (
        f"error: '{read_only / 'runs'}' is on a read-only file system; make '{read_only}' writable or choose "
        "another --root"
    )
    assert snapshot(read_only) == before


def test_read_only_runs_folder_for_training(cli: Cli, root: Path, mount: Mount) -> None:
    runs = mount("runs", "1m", read_only=True)
    shutil.copytree(root / "data", runs.parent / "data")
    code, err = cli(train_args(runs.parent))
    assert code == 2
    assert error_line(err) == (
        f"error: '{runs / 'test-reliability-train'}' is on a read-only file system; make '{runs}' writable or "
        "choose another --root"
    )
    assert snapshot(runs.parent / "data") == snapshot(root / "data")


def test_read_only_root_for_tokenize(cli: Cli, root: Path, mount: Mount, tmp_path: Path) -> None:
    read_only = mount("ro-data", "1m", copy_data(root), read_only=True)
    before = snapshot(read_only)
    code, err = cli(tokenize(read_only, documents(tmp_path, 8)))
    assert code == 2
    assert error_line(err) == (
        f"error: '{read_only / 'data' / '.corpus.lock'}' is on a read-only file system; make "
        f"'{read_only / 'data'}' writable or choose another --root"
    )
    assert snapshot(read_only) == before


# -- full disk ------------------------------------------------------------------------------------


def test_full_disk_while_tokenizing_keeps_the_previous_data(cli: Cli, root: Path, mount: Mount, tmp_path: Path) -> None:
    full = mount("full", "256k", copy_data(root))
    before = snapshot(full / "data" / "corpus")
    code, err = cli(tokenize(full, documents(tmp_path, 2000)))
    assert code == 2
    assert error_line(err) == (
        f"error: no space left on the device while preparing 'corpus' in {full / 'data' / '.corpus.partial'}; "
        "free disk space and run the same command again to continue from the last committed chunk; the previous "
        f"data in {full / 'data' / 'corpus'} is untouched"
    )
    assert snapshot(full / "data" / "corpus") == before


def test_permission_denied_names_the_folder_to_open_up(tmp_path: Path) -> None:
    from theseus.base.failures import resource_error

    root = tmp_path / "root"
    root.mkdir()
    exc = PermissionError(errno.EACCES, "Permission denied", str(root / "runs"))
    assert str(resource_error(exc, "train/pretrain", root, {})) == (
        f"permission denied for '{root / 'runs'}'; give this user access to '{root}' or choose another --root"
    )


def test_a_write_that_names_no_path_names_the_file_being_written(tmp_path: Path) -> None:
    from theseus.base.failures import resource_error

    target = tmp_path / "root" / "runs" / "status.json"
    target.parent.mkdir(parents=True)
    try:
        with target.open("w") as _file:
            raise OSError(errno.ENOSPC, "No space left on device")  # as write() or close() raise it
    except OSError as exc:
        error = resource_error(exc, "train/pretrain", tmp_path / "root", {})
    assert str(error) == (
        f"no space left on the device while writing '{target}'; free disk space on the device holding "
        f"'{target}' or choose another --root, then run the same command again"
    )


# -- hf/export ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_root(corpus_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding the one-step GPT run ``gpt``."""
    from tests.reliability.conftest import call_cli

    root = tmp_path_factory.mktemp("gpt-root")
    shutil.copytree(corpus_root / "data", root / "data")
    assert call_cli([*GPT, "--root", str(root)]) == 0
    return root


def export(root: Path, out: Path) -> list[str]:
    return ["run", "hf/export", "--root", str(root), "hf/run=gpt", f"hf/out={out}"]


def test_export_onto_a_read_only_folder(cli: Cli, gpt_root: Path, mount: Mount) -> None:
    read_only = mount("ro-out", "64k", read_only=True)
    before = snapshot(gpt_root / "runs")
    code, err = cli(export(gpt_root, read_only / "export"))
    assert code == 2
    line = error_line(err)
    assert line.startswith(f"error: '{read_only}/"), line  # the staging folder beside hf/out
    assert line.endswith(f"' is on a read-only file system; make '{read_only}' writable or choose another hf/out")
    assert snapshot(gpt_root / "runs") == before


def test_export_onto_a_full_disk(cli: Cli, gpt_root: Path, mount: Mount) -> None:
    full = mount("full-out", "8k")
    before = snapshot(gpt_root / "runs")
    code, err = cli(export(gpt_root, full / "export"))
    assert code == 2
    folder = re.escape(str(full))
    assert re.fullmatch(
        rf"error: no space left on the device while writing '{folder}/[^']+'; free disk space on the device "
        rf"holding '{folder}' or choose another hf/out, then run the same command again",
        error_line(err),
    ), err
    assert not list(full.iterdir()), "a partial export was left behind"
    assert snapshot(gpt_root / "runs") == before


# -- memory ---------------------------------------------------------------------------------------


def _numpy_out_of_memory(_self: object) -> None:
    np.zeros((10**8, 10**8), np.float32)  # 40 PB: refused at once, nothing is touched


def _xla_out_of_memory(_self: object) -> None:
    import jax.numpy as jnp

    jnp.zeros((2**30, 2**30), jnp.float32).block_until_ready()  # beyond any address space


@pytest.mark.parametrize(
    ("allocate", "kind"),
    [(_numpy_out_of_memory, "MemoryError: Unable to allocate"), (_xla_out_of_memory, "JaxRuntimeError: RESOURCE_")],
    ids=["numpy", "xla"],
)
def test_out_of_memory_at_set_up(
    cli: Cli, root: Path, monkeypatch: pytest.MonkeyPatch, allocate: Callable[[object], None], kind: str
) -> None:
    from theseus.training.base import BaseTrainer

    monkeypatch.setattr(BaseTrainer, "init_state", allocate)
    before = snapshot(root / "data")
    code, err = cli(train_args(root, "architecture/width=65536"))
    assert code == 2
    line = error_line(err)
    assert line.startswith(f"error: out of memory running test/reliability/train ({kind}"), line
    # what needs less memory without changing the model (architecture/width is raised, but not named)
    halved = (
        "training/batch_size=2, training/micro_batch_size=2 (the same batch in 2 passes), "
        "optimizer/state_dtype=bfloat16, optimizer/offload=true"
    )
    assert line.endswith(f"; use less memory per step with {halved} or training/sequence_length=8"), line
    assert snapshot(root / "data") == before
    # the run records how it ended with the line the command printed, not as a crash
    (status,) = [json.loads(path.read_text()) for path in (root / "runs").glob("*/status.json")]
    assert (status["state"], status["error"]) == ("failed", line.removeprefix("error: ")), status


def test_memory_settings_keep_the_model() -> None:
    from theseus.base.failures import memory_settings
    from theseus.config import resolve
    from theseus.registry import get_registry

    schema = get_registry().load_job("train/pretrain").schema()
    assert memory_settings(resolve(schema, {}, {})) == [
        "training/batch_size=16",
        "training/micro_batch_size=16 (the same batch in 2 passes)",
        "model/remat=full",
        "optimizer/state_dtype=bfloat16",
        "optimizer/offload=true",
        "training/sequence_length=128",
    ]
    config = resolve(schema, {}, {"architecture/block_size": 4096, "training/sequence_length": 1024})
    chosen = {"training/micro_batch_size": 1, "model/remat": "full", "optimizer/state_dtype": "bfloat16"}
    assert memory_settings({**config, **chosen, "optimizer/offload": True}) == [
        "training/batch_size=16",
        "training/sequence_length=512",
    ]


# -- damaged metrics.jsonl ------------------------------------------------------------------------


def test_a_line_that_is_not_utf8_in_metrics(cli: Cli, gpt_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(gpt_root, root)
    metrics = root / "runs" / "gpt" / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines()
    lines[0] = lines[0].replace(b'"train"', b'"tr\xffin"')
    metrics.write_bytes(b"".join(line + b"\n" for line in lines))
    shutil.copytree(root / "runs" / "gpt", root / "runs" / "other")
    warning = f"warning: {metrics}:1: byte 0xff is not UTF-8; skipped that line"

    code, err = cli(["runs", "show", "gpt", "--root", str(root)])
    assert (code, err.strip()) == (0, warning)
    code, err = cli(["runs", "compare", "gpt", "other", "--root", str(root), "--metric", "eval/perplexity/loss"])
    assert code == 0, err
    assert "Traceback" not in err and f"{root / 'runs' / 'other' / 'metrics.jsonl'}:1: byte 0xff" in err

    code, err = cli([*GPT, "--root", str(root), "training/steps=2"])  # resumes from step 1
    assert code == 0, err
    assert "Traceback" not in err
    assert metrics.read_bytes().splitlines()[0] == lines[0], "the damaged line was not kept as it was"
