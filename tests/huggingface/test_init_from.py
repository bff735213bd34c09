"""``training/init_from``: any trainer starts from a Hugging Face checkpoint or another run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.huggingface.conftest import ONE_LAYER, VOCAB, hf_logits, save_model
from tests.models.conftest import forward
from theseus.errors import ConfigError, DataError
from theseus.model.models import GPT, Gemma2, Gemma3, Llama, OLMo2, Phi3, Qwen3
from theseus.training.base import BaseTrainer
from theseus.training.init_from import InitSource, check_tokenizer

QUICK: dict[str, Any] = {
    "training/steps": 2,
    "training/batch_size": 2,
    "training/sequence_length": 16,
    "training/lr": 1e-3,
    "training/log_interval": 1,
    "training/eval_interval": 0,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 0,
    "training/async_checkpoints": False,
    "training/progress": False,
}


def fixed_batch(rows: int, length: int, position: int) -> dict[str, np.ndarray]:
    tokens = np.random.default_rng(position).integers(0, VOCAB, (rows, length + 1))
    return {
        "x": tokens[:, :-1].astype(np.int32),
        "y": tokens[:, 1:].astype(np.int32),
        "padding_mask": np.ones((rows, length), bool),
    }


class FixedLlama(BaseTrainer):
    """A user's trainer with custom batches: nothing about Hugging Face in it."""

    MODEL = Llama
    DATASET: Any = []

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        return fixed_batch(self.batch_rows, self.sequence_length, self.position(slice))


class FixedGPT(FixedLlama):
    MODEL = GPT


class FixedQwen3(FixedLlama):
    MODEL = Qwen3


class FixedOLMo2(FixedLlama):
    MODEL = OLMo2


class FixedPhi3(FixedLlama):
    MODEL = Phi3


class FixedGemma2(FixedLlama):
    MODEL = Gemma2


class FixedGemma3(FixedLlama):
    MODEL = Gemma3


def train_losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {int(r["step"]): float(r["loss"]) for r in records if r.get("split", "train") == "train" and "loss" in r}


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "trainer_class", "overrides"),
    [
        # one layer where the family's layers are all alike; two (a windowed one, a full one) for the Gemmas
        ("llama", FixedLlama, {"head_dim": 16, **ONE_LAYER}),
        ("qwen3", FixedQwen3, ONE_LAYER),
        ("olmo2", FixedOLMo2, {"head_dim": 16, **ONE_LAYER}),
        ("mistral", FixedLlama, {"head_dim": 16, "sliding_window": 6, **ONE_LAYER}),  # sequences of 16 > the window
        ("phi3", FixedPhi3, {"head_dim": 16, "sliding_window": 6, **ONE_LAYER}),  # fused projections, split on import
        ("gemma2", FixedGemma2, {"sliding_window": 6}),  # one windowed layer, capped scores and logits
        ("gemma3_text", FixedGemma3, {"sliding_window": 6}),  # q/k norms, a RoPE base per layer type
    ],
)
def test_fine_tune_from_hf_starts_at_transformers_loss(
    family: str, trainer_class: type[BaseTrainer], overrides: dict[str, Any], tmp_path: Path
) -> None:
    model = save_model(tmp_path / "hf", family, tokenizer=False, **overrides)
    trainer = trainer_class.create(
        tmp_path / "root", {**QUICK, "training/init_from": f"hf:{tmp_path / 'hf'}"}, name="ft"
    )
    trainer.run()
    losses = train_losses(tmp_path / "root" / "runs" / "ft")
    batch = fixed_batch(2, 16, 0)
    expected = cross_entropy(hf_logits(model, batch["x"]), batch["y"])
    assert set(losses) == {1, 2}
    assert abs(losses[1] - expected) <= 1e-4
    assert trainer.setting("architecture/head_dim") == 16  # the architecture came from the source
    assert trainer.setting("architecture/vocab_size") == VOCAB


def test_contradicting_override_and_wrong_model_are_one_line(tmp_path: Path) -> None:
    save_model(tmp_path / "hf", "llama", tokenizer=False)
    source = {"training/init_from": f"hf:{tmp_path / 'hf'}"}
    trainer = FixedLlama.create(tmp_path / "root", {**QUICK, **source, "architecture/n_layers": 5})
    with pytest.raises(ConfigError, match=r"architecture/n_layers=5 contradicts 2 of training/init_from="):
        trainer.setup()
    trainer = FixedGPT.create(tmp_path / "root", {**QUICK, **source, "model": "gpt"})
    with pytest.raises(ConfigError, match="holds a Llama model but this trainer trains GPT"):
        trainer.setup()
    trainer = FixedGPT.create(tmp_path / "root", {**QUICK, **source})  # no model=: the source's
    trainer.setup()
    assert type(trainer.model) is Llama and trainer.setting("select/model") == "llama"
    trainer = FixedLlama.create(tmp_path / "root", {**QUICK, "training/init_from": "somewhere"})
    with pytest.raises(ConfigError, match="use run:<name>"):
        trainer.setup()
    assert not (tmp_path / "root" / "runs").exists()


@pytest.mark.slow
def test_init_from_an_imported_run(tmp_path: Path, theseus: Any) -> None:
    model = save_model(tmp_path / "hf", "gpt2", tokenizer=False)
    code, _, err = theseus("run", "hf/import", f"hf/source={tmp_path / 'hf'}", "run/name=base")
    assert code == 0, err
    trainer = FixedGPT.create(theseus.root, {**QUICK, "training/init_from": "run:base@0"}, name="ft")
    trainer.run()
    batch = fixed_batch(2, 16, 0)
    expected = cross_entropy(hf_logits(model, batch["x"]), batch["y"])
    assert abs(train_losses(theseus.root / "runs" / "ft")[1] - expected) <= 1e-4

    # the fine-tuned run (byte tokenizer) exports to a folder transformers loads, tokenizer included
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from theseus.data.tokenizers.byte import ByteTokenizer
    from theseus.model.loading.run import load_run

    out = tmp_path / "export"
    code, _, err = theseus("run", "hf/export", "hf/run=ft", f"hf/out={out}")
    assert code == 0, err
    reloaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    run = load_run(theseus.root, "ft")
    x = batch["x"]
    ours = forward(run.model, run.params, x)
    assert np.max(np.abs(hf_logits(reloaded.eval(), x) - ours)) <= 1e-5
    text = "naïve café <|endoftext|>"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == [*ByteTokenizer().encode("naïve café "), 256]


def test_data_tokenizer_must_be_the_model_s() -> None:
    source = InitSource(
        "hf:/models/x", {}, None, {"kind": "hf", "path": "/models/x/tokenizer.json", "sha256": "ab"}, lambda *a: None
    )
    check_tokenizer({"kind": "hf", "path": "/data/copy/tokenizer.json", "sha256": "ab", "eot": "</s>"}, source)
    with pytest.raises(DataError) as info:
        check_tokenizer({"kind": "byte"}, source)
    message = str(info.value)
    assert "\n" not in message
    assert "theseus run data/tokenize data/dataset=<dataset> data/tokenizer=hf:/models/x/tokenizer.json" in message


@pytest.mark.slow
def test_init_from_places_parameters_on_an_fsdp_mesh(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO, clean_env

    done = subprocess.run(
        [sys.executable, "-m", "tests.huggingface.sharded_init", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean_env(),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    spec, shards, diff = done.stdout.strip().splitlines()[-1].rsplit(" ", 2)
    assert "'data'" in spec and int(shards) == 2  # the query kernel's embed axis is split over 2 devices
    assert float(diff) <= 1e-4
