"""Generation from checkpoints written by short training runs, and the ``generate`` job."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.generation.conftest import TrainedRun
from theseus.cli.main import main
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.errors import CheckpointError, ConfigError
from theseus.model.generation import SamplingParams, available_runs, complete, generate_tokens, load_run
from theseus.model.models import GPT, Llama

SAMPLING = SamplingParams(temperature=1.0, top_p=0.95)


@pytest.fixture(params=["gpt", "llama"])
def trained(request: pytest.FixtureRequest, trained_runs: dict[str, TrainedRun]) -> TrainedRun:
    return trained_runs[request.param]


def test_load_run_rebuilds_the_model_and_restores_the_final_parameters(trained: TrainedRun) -> None:
    run = load_run(trained.root, trained.name)
    assert type(run.model) is trained.family
    assert run.step == 3
    assert run.model.architecture.n_embd == 32 and run.model.architecture.vocab_size == 257
    assert isinstance(run.tokenizer, ByteTokenizer) and run.eot_id == 256
    assert run.context_length == 32
    saved = jax.tree_util.tree_flatten_with_path(trained.params)[0]
    loaded = dict(jax.tree_util.tree_flatten_with_path(run.params)[0])
    assert len(saved) == len(loaded)
    for path, value in saved:
        np.testing.assert_array_equal(np.asarray(loaded[path]), np.asarray(value))
    # the provenance record names the model class and the data's tokenizer
    record = json.loads((run.path / "provenance.json").read_text())
    assert record["model"] == f"{trained.family.__module__}:{trained.family.__qualname__}"
    assert record["tokenizer"] == {"kind": "byte"}


def test_samples_are_deterministic_for_a_seed_and_respect_max_new_tokens(trained: TrainedRun) -> None:
    run = load_run(trained.root, trained.name)
    prompts = ["def ", "import os\n", ""]
    first = complete(run, prompts, 12, sampling=SAMPLING, seed=7, stop_at_eot=False)
    again = complete(run, prompts, 12, sampling=SAMPLING, seed=7, stop_at_eot=False)
    other = complete(run, prompts, 12, sampling=SAMPLING, seed=8, stop_at_eot=False)
    assert first == again
    assert [s.completion for s in first] != [s.completion for s in other]
    assert all(s.tokens == 12 and not s.stopped for s in first)
    assert [s.prompt for s in first] == prompts
    assert all(s.text.startswith(p) for s, p in zip(first, prompts, strict=True))


def test_sampling_stops_when_end_of_text_is_produced(trained: TrainedRun) -> None:
    """Where end-of-text falls in a sample depends on the model; construct a case where it is sure
    to come: continue a prompt that ends in a token the model draws next, treating that token as
    end-of-text; then check the real end-of-text id on a longer run stops exactly where it appears."""
    run = load_run(trained.root, trained.name)
    prompt = [[256, *ByteTokenizer().encode("def ")]]
    free = generate_tokens(run.model, run.params, prompt, 20, sampling=SAMPLING, seed=3)[0]
    target = free.tokens[5]
    cut = generate_tokens(run.model, run.params, prompt, 20, sampling=SAMPLING, seed=3, eot_id=target)[0]
    assert cut.stopped and cut.tokens == free.tokens[: free.tokens.index(target)]
    # with the run's own end-of-text id: a sample either stops right before its first 256 or runs to the limit
    for seed in range(3):
        raw = generate_tokens(run.model, run.params, prompt, 20, sampling=SAMPLING, seed=seed)[0].tokens
        done = generate_tokens(run.model, run.params, prompt, 20, sampling=SAMPLING, seed=seed, eot_id=256)[0]
        if 256 in raw:
            assert done.stopped and done.tokens == raw[: raw.index(256)]
        else:
            assert not done.stopped and done.tokens == raw


def test_long_requests_are_fitted_to_the_context(trained_runs: dict[str, TrainedRun]) -> None:
    run = load_run(trained_runs["gpt"].root, "tiny-gpt")
    notes: list[str] = []
    samples = complete(run, ["x" * 40], 100, sampling=SAMPLING, stop_at_eot=False, note=notes.append)
    assert any("last 16 tokens" in n for n in notes) and any("lowered from 100 to 17" in n for n in notes)
    assert samples[0].tokens == 17 and samples[0].prompt == "x" * 16  # the prompt's end, mid-document


def test_generate_job_prints_samples(
    trained_runs: dict[str, TrainedRun], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(trained_runs["llama"].root)
    args = ["run", "generate", "--root", root, "generate/run=tiny-llama", "generate/max_new_tokens=6"]
    main([*args, "generate/prompt=def ", "generate/seed=4", "generate/samples=2", "generate/stop_at_eot=false"])
    out, err = capsys.readouterr()
    texts = out.split("--- sample 2 ---\n")
    assert len(texts) == 2 and texts[0].startswith("--- sample 1 ---\ndef ") and texts[1].startswith("def ")
    assert err.count("[6 tokens, stopped at max_new_tokens]") == 2
    assert "tiny-llama step 3: Llama" in err
    main([*args, "generate/prompt=def ", "generate/seed=4", "generate/samples=2", "generate/stop_at_eot=false"])
    assert capsys.readouterr().out == out  # same seed, same text
    # the prompt from stdin, greedy
    monkeypatch.setattr("sys.stdin", io.StringIO("class A:\n"))
    main([*args, "generate/prompt=-", "generate/temperature=0"])
    out, err = capsys.readouterr()
    assert out.startswith("class A:\n") and "greedy" in err


def test_generate_errors_are_one_line(trained_runs: dict[str, TrainedRun], capsys: pytest.CaptureFixture[str]) -> None:
    root = trained_runs["gpt"].root
    assert available_runs(root) == ["tiny-gpt", "tiny-llama"]
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "generate", "--root", str(root), "generate/run=nope"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: no run 'nope' under {root / 'runs'} (available: tiny-gpt, tiny-llama)\n"
    with pytest.raises(ConfigError, match=r"several runs .*\(tiny-gpt, tiny-llama\)"):
        load_run(root, "")
    with pytest.raises(CheckpointError, match="no checkpoint at step 2; available steps: 3"):
        load_run(root, "tiny-gpt", step=2)
    with pytest.raises(CheckpointError, match="no checkpoint at step 2; available steps: 3"):
        load_run(root, "tiny-gpt@2")
    assert load_run(root, "tiny-gpt@3").step == 3
    with pytest.raises(SystemExit):  # the step given twice, differently
        main(["run", "generate", "--root", str(root), "generate/run=tiny-gpt@3", "generate/step=2"])
    assert capsys.readouterr().err == (
        "error: generate/run=tiny-gpt@3 and generate/step=2 name different checkpoints; "
        "give the step once: generate/run=tiny-gpt@STEP\n"
    )


def test_a_run_without_checkpoint_is_one_clear_line(
    trained_runs: dict[str, TrainedRun], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = trained_runs["gpt"].root / "runs" / "tiny-gpt"
    target = tmp_path / "runs" / "fresh"
    target.mkdir(parents=True)
    for name in ("config.yaml", "provenance.json"):
        shutil.copy(source / name, target / name)
    with pytest.raises(SystemExit):
        main(["run", "generate", "--root", str(tmp_path)])  # the only run there is
    err = capsys.readouterr().err
    assert err.startswith("error: run 'fresh' has no checkpoint yet") and err.count("\n") == 1
    with pytest.raises(ConfigError, match="no training runs under"):
        load_run(tmp_path / "elsewhere", "")


@pytest.mark.parametrize(("family", "expected"), [(GPT, "gpt"), (Llama, "llama")])
def test_model_class_comes_from_the_trainers_model_when_not_recorded(
    trained_runs: dict[str, TrainedRun], tmp_path: Path, family: type, expected: str
) -> None:
    source = trained_runs[expected].root / "runs" / f"tiny-{expected}"
    target = tmp_path / "runs" / "old"
    shutil.copytree(source, target)
    record = json.loads((target / "provenance.json").read_text())
    record.pop("model")
    record.pop("tokenizer")
    record["job_class"] = "tests.generation.conftest:" + ("ByteGPT" if family is GPT else "ByteLlama")
    (target / "provenance.json").write_text(json.dumps(record))
    run = load_run(tmp_path, "old")
    assert type(run.model) is family and isinstance(run.tokenizer, ByteTokenizer)


def test_loading_is_read_only_and_checks_shapes(trained_runs: dict[str, TrainedRun], tmp_path: Path) -> None:
    target = tmp_path / "runs" / "copy"
    shutil.copytree(trained_runs["gpt"].root / "runs" / "tiny-gpt", target)
    # a checkpoint that a training run is still writing must survive a generate call
    in_flight = target / "checkpoints" / "6.orbax-checkpoint-tmp-1234567"
    in_flight.mkdir()
    before = sorted(p.name for p in (target / "checkpoints").iterdir())
    assert load_run(tmp_path, "copy").step == 3
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == before
    config = target / "config.yaml"
    config.write_text(config.read_text().replace("n_embd: 32", "n_embd: 64"))
    with pytest.raises(
        CheckpointError, match=r"'blocks_0/attn/key', but .* expects \(64, 4, 16\); restore the run's config.yaml"
    ):
        load_run(tmp_path, "copy")
