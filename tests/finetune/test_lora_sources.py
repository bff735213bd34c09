"""LoRA over a base from any ``training/init_from`` source, in every trainer: pretraining, SFT and DPO
each start from a theseus run and from a Hugging Face folder holding the same weights, train the
adapters alone over a base that stays bit for bit as read, and checkpoint only the adapters."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from tests.finetune.conftest import TINY_SFT, prepare_chat, prepare_preferences
from tests.finetune.test_sft import cli_settings, import_base, leaves, read_checkpoint
from tests.reliability.conftest import call_cli
from theseus.model.finetune import DPOTrainer, SFTTrainer
from theseus.training.adapters import prune, tree_bytes
from theseus.training.pretrain import Pretrain

pytestmark = pytest.mark.slow

SETTINGS: dict[str, Any] = {
    **TINY_SFT,
    "training/steps": 2,
    "training/batch_size": 4,
    "training/checkpoint_interval": 2,
    "training/keep_checkpoints": 0,
    "data/max_documents": 12,  # the offline corpus pretraining prepares on first use
    "data/val_fraction": 0.25,
}
JOBS = {"pretrain": (Pretrain, {}), "sft": (SFTTrainer, {}), "dpo": (DPOTrainer, {"training/sequence_length": 48})}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Chat and preference data, a tiny random GPT-2 folder, and the same weights imported as run ``base``;
    the base parameters as the import read them."""
    root = tmp_path_factory.mktemp("lora-sources")
    prepare_chat(root)
    prepare_preferences(root)
    folder = tmp_path_factory.mktemp("hf-gpt2")
    import_base(root, folder)
    base = read_checkpoint(root / "runs" / "base", 0)["params"]
    return {"root": root, "spec": {"run": "run:base", "hf": f"hf:{folder}"}, "base": leaves(base)}


@pytest.mark.parametrize("source", ["run", "hf"])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_adapters_train_over_the_base_of_every_source(job: str, source: str, sources: dict[str, Any]) -> None:
    trainer_class, overrides = JOBS[job]
    name = f"{job}-{source}"
    settings = {**SETTINGS, **overrides, "training/init_from": sources["spec"][source], "run/name": name}
    trainer = trainer_class.create(sources["root"], settings)
    trainer.run()
    trainer.close()

    after = leaves(trainer.state.params)
    adapted = sorted(k for k in after if "lora_" in k)
    base = {k: v for k, v in after.items() if "lora_" not in k}
    expected = sources["base"]
    assert adapted and set(base) == set(expected)
    for key, value in base.items():  # the base is the source's, bit for bit, after training
        assert value.tobytes() == expected[key].tobytes(), f"{key} changed"
    assert any(np.any(after[k] != 0) for k in adapted if "lora_b" in k)  # B starts at zero: the adapters trained

    moments = sum(leaf.nbytes for leaf in jax.tree.leaves(trainer.state.opt_state) if np.ndim(leaf) > 0)
    assert moments == 2 * tree_bytes(prune(trainer.state.params))  # AdamW state for the adapters alone
    saved = read_checkpoint(sources["root"] / "runs" / name, 2)
    assert sorted(leaves(saved["params"])) == adapted  # the checkpoint refers to the base, holds the adapters


def test_pretraining_with_lora_from_a_run_through_the_command_line(sources: dict[str, Any]) -> None:
    """The command of the report: LoRA over an imported run, where it once asked the run for adapters."""
    root = sources["root"]
    values = {**SETTINGS, "training/init_from": "run:base", "run/name": "cli"}
    assert call_cli(["run", "train/pretrain", "--root", str(root), *cli_settings(values)]) == 0
    saved = read_checkpoint(root / "runs" / "cli", 2)
    assert saved["params"] and all("lora_" in key for key in leaves(saved["params"]))
