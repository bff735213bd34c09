"""Bad input: one ``error:`` line naming the problem and the fix, a non-zero exit, nothing written over.

One test per row of docs/errors.md that is not already tested elsewhere (that page says where each
row is tested). Most rows call the CLI in this process; a few run it in a subprocess.
"""

from __future__ import annotations

import errno
import glob
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_cli, xla_flags
from tests.reliability.conftest import BAD_JOB, call_cli, error_line, train_args

Cli = Callable[[list[str]], tuple[int, str]]

pytestmark = pytest.mark.usefixtures("compilation_cache")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (to show nothing was written over)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- configuration ---------------------------------------------------------------------------------


def test_unknown_key_in_a_config_file(cli: Cli, root: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("training:\n  stepz: 3\n")
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2
    assert error_line(err) == (
        "error: unknown configuration key 'training/stepz' (config file); did you mean 'training/steps'?"
    )
    assert not (root / "runs").exists()


def test_config_file_that_does_not_exist(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "--config", str(root / "absent.yaml")))
    assert code == 2
    assert error_line(err) == (
        f"error: config file '{root / 'absent.yaml'}' does not exist; "
        f"write one with 'theseus configure JOB {root / 'absent.yaml'}'"
    )


def test_config_file_that_is_not_a_mapping(cli: Cli, root: Path, tmp_path: Path) -> None:
    config = tmp_path / "list.yaml"
    config.write_text("- 1\n- 2\n")
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2
    assert "must hold a mapping of keys to values, not a list" in error_line(err)


def test_config_file_with_a_python_tag_is_rejected_not_run(cli: Cli, root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    config = tmp_path / "evil.yaml"
    config.write_text(f"run:\n  name: !!python/object/apply:os.system ['touch {marker}']\n")
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2
    line = error_line(err)
    assert "is not valid YAML" in line and "python/object/apply" in line
    assert not marker.exists()


def test_conflicting_defaults_across_configuration_classes(cli: Cli) -> None:
    code, err = cli(["--load", str(BAD_JOB), "run", "test/reliability/conflict"])
    assert code == 2
    assert error_line(err) == (
        "error: configuration key 'shared/size' has default 8 in theseus_user_bad_job.SizeA but 16 in "
        "theseus_user_bad_job.SizeB; make the defaults agree or use different keys"
    )


# -- command line --------------------------------------------------------------------------------


def test_root_that_does_not_exist_names_the_prepare_command(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-root"
    code, err = cli(train_args(missing))
    assert code == 2
    assert error_line(err) == (
        f"error: dataset 'corpus' is not prepared in {missing}/data/corpus; prepare it with: "
        f"theseus run data/tokenize data/dataset=corpus --root {missing}"
    )
    assert not missing.exists()  # nothing was created


# -- plugins ---------------------------------------------------------------------------------------


def test_job_of_a_blocked_distribution_says_it_is_blocked() -> None:
    done = run_cli(["run", "data/tokenize"], env=clean_env(THESEUS_BLOCK_PLUGINS="theseus-data"))
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "error: job 'data/tokenize' comes from theseus-data, which THESEUS_BLOCK_PLUGINS blocks; "
        "remove theseus-data from THESEUS_BLOCK_PLUGINS to use it"
    )


# -- data ----------------------------------------------------------------------------------------


def test_missing_prepared_data(cli: Cli, root: Path) -> None:
    shutil.rmtree(root / "data" / "corpus")
    code, err = cli(train_args(root))
    assert code == 2
    assert error_line(err).endswith(f"prepare it with: theseus run data/tokenize data/dataset=corpus --root {root}")
    assert not (root / "runs").exists()


def test_truncated_shard(cli: Cli, root: Path) -> None:
    shard = root / "data" / "corpus" / "train.bin"
    shard.write_bytes(shard.read_bytes()[:-6])
    code, err = cli(train_args(root))
    assert code == 2
    line = error_line(err)
    assert "train.bin has" in line and "corrupt or truncated" in line and "data/force=true" in line
    assert not (root / "runs").exists()


# -- model and run -------------------------------------------------------------------------------


def test_vocabulary_smaller_than_the_tokenizer(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "architecture/vocab_size=200"))
    assert code == 2
    assert error_line(err) == (
        "error: model vocabulary 200 is smaller than the tokenizer's 257 (data 'corpus', tokenizer {'kind': 'byte'}); "
        "set architecture/vocab_size=257 or larger"
    )


def test_sequence_length_above_the_model_block_size(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "training/sequence_length=64"))
    assert code == 2
    assert error_line(err) == (
        "error: training/sequence_length=64 exceeds the model's architecture/block_size=16; "
        "lower the sequence length or raise the block size"
    )


def test_steps_not_positive(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "training/steps=0"))
    assert code == 2
    assert error_line(err) == "error: training/steps=0 is out of range; it must be >= 1"
    assert not (root / "runs").exists()


def test_resume_step_beyond_a_64_bit_integer(cli: Cli, root: Path, tmp_path: Path) -> None:
    """A 400-digit integer (once an OverflowError traceback) is refused in one line, from the command
    line and from a config file alike."""
    expected = (
        f"error: training/resume_step={'9' * 57}... (400 characters) is out of range; "
        "it must be an integer from 0 to 9223372036854775807"
    )
    code, err = cli(train_args(root, f"training/resume_step={'9' * 400}"))
    assert code == 2
    assert error_line(err) == expected and len(err.strip().splitlines()) == 1
    config = tmp_path / "run.yaml"
    config.write_text(f"training:\n  resume_step: {'9' * 400}\n")
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2
    assert error_line(err) == expected and len(err.strip().splitlines()) == 1
    assert not (root / "runs").exists()


def test_a_refused_resume_step_of_a_new_run_leaves_no_folder(cli: Cli, root: Path) -> None:
    """The refused start once left ``runs/ghost/{checkpoints,lock}``: not listed by ``theseus runs``, yet
    ``hf/import run/name=ghost`` refused the name as taken."""
    code, err = cli(train_args(root, "run/name=ghost", "training/resume_step=3"))
    assert code == 2
    assert error_line(err) == (
        "error: training/resume_step=3: run 'ghost' has no checkpoint at step 3 (it has no checkpoints); "
        "choose one of them, or leave training/resume_step out to resume from the newest"
    )
    assert not (root / "runs" / "ghost").exists()


def test_global_batch_not_divisible_by_data_parallel_devices(root: Path) -> None:
    env = clean_env(XLA_FLAGS=xla_flags(devices=2))
    done = run_cli(train_args(root, "training/batch_size=3"), env=env, timeout=300)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "error: the micro batch of 3 rows cannot be split over 2 data-parallel devices; "
        "make training/micro_batch_size (or training/batch_size) a multiple of 2"
    )
    assert not (root / "runs").exists()


def test_nonfinite_loss_stops_and_keeps_the_last_checkpoint(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "test/poison_step=3"))
    assert code == 1
    assert error_line(err) == (
        "error: non-finite loss (nan) at step 3; no checkpoint is known to be good (no sound loss followed step 2); "
        "lower training/lr and run again to resume from step 2, or start over with a new run/name, or set "
        "training/skip_nonfinite=true to skip such updates"
    )
    checkpoints = root / "runs" / "test-reliability-train" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["2"]
    status = json.loads((checkpoints.parent / "status.json").read_text())  # the run ended with that line
    assert (status["state"], status["error"]) == ("failed", error_line(err).removeprefix("error: "))


def test_nonfinite_gradient_stops(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "test/poison_step=1", "test/poison=grad"))
    assert code == 1
    assert error_line(err) == (
        "error: non-finite gradient norm (nan) at step 1; no checkpoint was written; lower training/lr and run "
        "again, or set training/skip_nonfinite=true to skip such updates"
    )
    checkpoints = root / "runs" / "test-reliability-train" / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == []


def test_skip_nonfinite_counts_skipped_updates_across_a_resume(cli: Cli, root: Path) -> None:
    skip = ["test/poison_step=2", "training/skip_nonfinite=true", "training/steps=4"]
    code, err = cli(train_args(root, *skip, "training/stop_after=3"))
    assert code == 0, err
    code, err = cli(train_args(root, *skip))
    assert code == 0, err
    assert "resuming run 'test-reliability-train' from step 3" in err
    run = root / "runs" / "test-reliability-train"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2, 3, 4]
    assert [row["skipped"] for row in train] == [0, 1, 0, 0]
    assert [row["skipped_steps"] for row in train] == [0, 1, 1, 1]  # the count survives the restart
    assert train[1]["loss"] == "nan"


def test_an_exploded_loss_is_not_checkpointed_and_the_stop_names_the_last_good_one(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "training/lr=1e6", "training/checkpoint_interval=1", "training/steps=12"))
    assert code == 1
    warning = next(line for line in err.splitlines() if line.startswith("warning: "))
    assert warning.startswith("warning: step 2 is not checkpointed: its loss ")
    assert warning.endswith("x the recent median 5.996; checkpoint 1 stays the newest")
    assert error_line(err) == (
        "error: non-finite loss (nan) at step 3; no checkpoint is known to be good (no sound loss followed step 1); "
        "lower training/lr and run again to resume from step 1, or start over with a new run/name, or set "
        "training/skip_nonfinite=true to skip such updates"
    )
    checkpoints = root / "runs" / "test-reliability-train" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["1"]


# -- checkpoints ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory, corpus_root: Path) -> Path:
    """A run stopped at step 4 of 6 with checkpoints 2 and 4 (``run/name=base``)."""
    root = tmp_path_factory.mktemp("checkpointed")
    shutil.copytree(corpus_root / "data", root / "data")
    assert call_cli(train_args(root, "training/stop_after=4", "run/name=base")) == 0
    assert sorted(p.name for p in (root / "runs" / "base" / "checkpoints").iterdir()) == ["2", "4"]
    return root


def clone(checkpointed: Path, tmp_path: Path) -> Path:
    """A copy of the checkpointed root; its run is named ``base``."""
    root = tmp_path / "root"
    shutil.copytree(checkpointed, root)
    return root


def damage(step_dir: Path) -> None:
    """Cut every array data file of a checkpoint short."""
    files = glob.glob(str(step_dir / "state" / "**" / "d" / "*"), recursive=True)
    assert files
    for name in files:
        Path(name).write_bytes(Path(name).read_bytes()[:7])


def flip_bytes(step_dir: Path, count: int = 10) -> str:
    """Invert ``count`` bytes in the middle of the largest array data file of a checkpoint (its size kept);
    the file's path under the state folder."""
    state = step_dir / "state"
    largest = max((p for p in state.glob("ocdbt.process_0/d/*")), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    largest.write_bytes(bytes(data))
    return largest.relative_to(state).as_posix()


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    cli: Cli, checkpointed: Path, tmp_path: Path, how: str
) -> None:
    root = clone(checkpointed, tmp_path)
    checkpoints = root / "runs" / "base" / "checkpoints"
    if how == "flipped":
        problem = f"{flip_bytes(checkpoints / '4')} does not match its checksum"
    else:
        damage(checkpoints / "4")
        problem = "d/"
    code, err = cli(train_args(root, "run/name=base"))
    assert code == 0, err
    assert "Traceback" not in err
    warning = next(line for line in err.splitlines() if line.startswith("warning: "))
    assert warning.startswith(f"warning: checkpoint '{checkpoints / '4'}' is damaged: ")
    assert problem in warning and ("holds 7 bytes where" in warning) == (how == "truncated"), warning
    assert warning.endswith(f"moved it to '{checkpoints / '4.corrupt'}' and resumed from step 2")
    assert "resuming run 'base' from step 2" in err
    assert sorted(p.name for p in checkpoints.iterdir()) == ["2", "4", "4.corrupt", "6"]


def test_corrupt_checkpoint_without_an_earlier_one(cli: Cli, checkpointed: Path, tmp_path: Path) -> None:
    root = clone(checkpointed, tmp_path)
    run = root / "runs" / "base"
    shutil.rmtree(run / "checkpoints" / "2")
    damage(run / "checkpoints" / "4")
    before = snapshot(run)
    code, err = cli(train_args(root, "run/name=base"))
    assert code == 2
    line = error_line(err)
    assert line.startswith(f"error: checkpoint '{run / 'checkpoints' / '4'}' is damaged: ")
    assert line.endswith(
        f"there is no earlier checkpoint; if the job's configuration changed since the run started, use the "
        f"configuration in '{run / 'config.yaml'}' or a new run/name; if the checkpoints are damaged, delete "
        f"'{run / 'checkpoints'}' to start the run over"
    )
    assert snapshot(run) == before  # nothing renamed, config.yaml and metrics untouched


def test_resume_with_a_changed_model_configuration(cli: Cli, checkpointed: Path, tmp_path: Path) -> None:
    root = clone(checkpointed, tmp_path)
    run = root / "runs" / "base"
    before = snapshot(run)
    code, err = cli(train_args(root, "run/name=base", "architecture/width=24"))
    assert code == 2
    assert error_line(err) == (
        f"error: checkpoint '{run / 'checkpoints' / '4'}' has parameter 'down/bias' of shape (16,) but the "
        "configured model expects (24,); use the model configuration the run was started with, or a new run/name"
    )
    assert snapshot(run) == before  # config.yaml still holds the configuration the run was started with


def test_resume_with_a_changed_optimizer_state(cli: Cli, checkpointed: Path, tmp_path: Path) -> None:
    root = clone(checkpointed, tmp_path)
    run = root / "runs" / "base"
    before = snapshot(run)
    code, err = cli(train_args(root, "run/name=base", "training/grad_clip=0"))
    assert code == 2
    line = error_line(err)
    assert line.startswith(f"error: cannot restore checkpoint '{run / 'checkpoints' / '4'}' (ValueError: ")
    assert "no earlier checkpoint loads either; if the job's configuration changed since the run started" in line
    assert snapshot(run) == before


def test_disk_full_while_saving_keeps_the_previous_checkpoint(
    cli: Cli, root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import orbax.checkpoint as ocp

    original = ocp.JsonCheckpointHandler._save_fn

    async def save_fn(self, item, directory):  # type: ignore[no-untyped-def]
        if Path(str(directory)).parent.name.split(".")[0] == "4":  # <checkpoints>/4.<tmp>/meta.<tmp>
            raise OSError(errno.ENOSPC, "No space left on device", str(directory))
        return await original(self, item, directory)

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", save_fn)
    code, err = cli(train_args(root))
    assert code == 2
    checkpoints = root / "runs" / "test-reliability-train" / "checkpoints"
    assert error_line(err) == (
        f"error: no space left on the device while writing checkpoint '{checkpoints / '4'}'; free disk space "
        "(or lower training/keep_checkpoints) and run the same command again to resume from step 2, the last "
        "complete checkpoint"
    )
    assert not [r for r in caplog.records if r.exc_info], "orbax's tracebacks reached the log"

    from theseus.checkpoint import CheckpointStore
    from theseus.checkpoint.store import META, STATE, ChecksummedRestore

    store = CheckpointStore(checkpoints, async_save=False)
    try:
        assert store.steps() == [2]
        restored = store.manager.restore(
            2, args=ocp.args.Composite(**{STATE: ChecksummedRestore(), META: ocp.args.JsonRestore()})
        )
        assert restored[META]["step"] == 2 and int(restored[STATE]["step"]) == 2
    finally:
        store.close()


def test_a_checkpoint_counts_only_with_its_checksums(checkpointed: Path, tmp_path: Path) -> None:
    from theseus.runs.layout import checkpoint_steps

    root = clone(checkpointed, tmp_path)
    run = root / "runs" / "base"
    assert checkpoint_steps(run) == [2, 4]
    (run / "checkpoints" / "4" / "state" / "checksums.json").unlink()
    assert checkpoint_steps(run) == [2]  # a save whose manifest is gone is not a checkpoint
    meta = run / "checkpoints" / "4" / "meta" / "metadata"
    record = json.loads(meta.read_text())
    del record["checksums"]
    meta.write_text(json.dumps(record))
    assert checkpoint_steps(run) == [2, 4]  # one saved before manifests existed still is


def test_a_step_without_its_checksums_is_trained_again_and_replaced(
    cli: Cli, checkpointed: Path, tmp_path: Path
) -> None:
    root = clone(checkpointed, tmp_path)
    checkpoints = root / "runs" / "base" / "checkpoints"
    (checkpoints / "4" / "state" / "checksums.json").unlink()
    code, err = cli(train_args(root, "run/name=base"))
    assert code == 0, err
    assert "resuming run 'base' from step 2" in err
    assert sorted(p.name for p in checkpoints.iterdir()) == ["2", "4", "4.corrupt", "6"]  # the old 4 kept aside


def test_starting_from_a_damaged_checkpoint_of_another_run(cli: Cli, checkpointed: Path, tmp_path: Path) -> None:
    root = clone(checkpointed, tmp_path)
    checkpoints = root / "runs" / "base" / "checkpoints"
    damaged = flip_bytes(checkpoints / "4", count=1)
    code, err = cli(train_args(root, "run/name=ft", "training/init_from=run:base"))
    assert code == 2
    assert error_line(err) == (
        f"error: training/init_from='run:base' (checkpoint 4 of run 'base') is damaged: {damaged} does not match "
        "its checksum; use an earlier checkpoint of that run, or resume the run, which sets damaged checkpoints aside"
    )


def test_resume_step_sets_later_checkpoints_aside_once(cli: Cli, checkpointed: Path, tmp_path: Path) -> None:
    root = clone(checkpointed, tmp_path)
    run = root / "runs" / "base"
    checkpoints = run / "checkpoints"
    code, err = cli(train_args(root, "run/name=base", "training/resume_step=3"))
    assert code == 2
    assert error_line(err) == (
        "error: training/resume_step=3: run 'base' has no checkpoint at step 3 (its checkpoints are at steps 2, 4); "
        "choose one of them, or leave training/resume_step out to resume from the newest"
    )
    code, err = cli(train_args(root, "run/name=base", "training/resume_step=2"))
    assert code == 0, err
    assert f"training/resume_step=2: set the checkpoints after it aside ({checkpoints / '4.abandoned'})" in err
    assert "resuming run 'base' from step 2 (changed: training/resume_step, training/stop_after)" in err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    code, err = cli(train_args(root, "run/name=base", "training/resume_step=2"))
    assert code == 0, err
    assert "run 'base' already completed (6/6 steps)" in err  # the recorded value is not applied again
    assert sorted(p.name for p in checkpoints.iterdir()) == ["2", "4", "4.abandoned", "6"]


def test_a_run_that_ends_on_an_exploded_loss_does_not_end_as_completed(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "training/lr=1e6", "training/checkpoint_interval=1", "training/steps=2"))
    assert code == 1
    line = error_line(err)
    assert line.startswith("error: the run ends at step 2 with its loss ")
    assert line.endswith(
        "so that step is not checkpointed; no checkpoint is known to be good (no sound loss followed step 1); lower "
        "training/lr and run again to resume from step 1, or start over with a new run/name"
    )
    checkpoints = root / "runs" / "test-reliability-train" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["1"]


def test_skip_nonfinite_stops_after_its_limit_of_skipped_updates_in_a_row(
    cli: Cli, checkpointed: Path, tmp_path: Path
) -> None:
    root = clone(checkpointed, tmp_path)  # resumed at step 4 with a learning rate that diverges at once
    args = ["training/lr=1e6", "training/skip_nonfinite=true", "training/skip_nonfinite_limit=3", "training/steps=12"]
    code, err = cli(train_args(root, "run/name=base", *args))
    assert code == 1
    assert error_line(err) == (
        "error: training/skip_nonfinite skipped 3 updates in a row (steps 7-9), so the run is diverging; the last "
        "good checkpoint is step 4: lower training/lr and run again with training/resume_step=4 "
        "(training/skip_nonfinite_limit sets how many are tolerated)"
    )
    assert "warning: step 6 is not checkpointed: its loss " in err
    assert sorted(p.name for p in (root / "runs" / "base" / "checkpoints").iterdir()) == ["2", "4"]


def test_a_mesh_axis_the_tpu_torus_cannot_hold_is_one_line() -> None:
    """jax lays a mesh axis on a TPU slice only as a product of some of the torus' sides: an expert axis
    of 8 on a 4x4x4 slice (64 chips) is refused with what fits, not jax's NotImplementedError."""
    from dataclasses import dataclass

    from theseus.base.axis import ShardingPlan
    from theseus.errors import ConfigError
    from theseus.training.sharding import build_sharding

    @dataclass(frozen=True)
    class Chip:  # what jax's mesh utilities read of a TPU device
        id: int
        coords: tuple[int, int, int]
        platform: str = "tpu"
        device_kind: str = "TPU v5"
        core_on_chip: int = 0
        process_index: int = 0
        slice_index: int = 0

    chips = [Chip(i, (i % 4, i // 4 % 4, i // 16)) for i in range(64)]
    with pytest.raises(ConfigError) as caught:
        build_sharding(ShardingPlan(expert="expert"), layout="fsdp+ep", expert=8, devices=chips)
    assert str(caught.value) == (
        "the mesh (expert 8 x data 8 x model 1) cannot be laid on the 4x4x4 torus of these TPU chips: each mesh "
        "axis must be a product of some of its sides (1, 4, 16, 64); set mesh/model, mesh/expert, mesh/context or "
        "mesh/pipeline to such sizes"
    )
