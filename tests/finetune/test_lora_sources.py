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
    """LoRA pretraining over an imported run from the command line (it once asked the run for adapters)."""
    root = sources["root"]
    values = {**SETTINGS, "training/init_from": "run:base", "run/name": "cli"}
    assert call_cli(["run", "train/pretrain", "--root", str(root), *cli_settings(values)]) == 0
    saved = read_checkpoint(root / "runs" / "cli", 2)
    assert saved["params"] and all("lora_" in key for key in leaves(saved["params"]))


def test_a_rank_with_no_adapter_in_the_model_is_one_line() -> None:
    """``model/lora/rank`` above 0 on a model none of whose layers take adapters would train every
    parameter and save them all while the run's configuration says adapters: refused instead."""
    from types import SimpleNamespace

    import jax.numpy as jnp
    import optax

    from theseus.errors import ConfigError

    trainer = object.__new__(Pretrain)
    trainer.context = SimpleNamespace(config={"model/lora/rank": 4})
    trainer.model = SimpleNamespace()
    with pytest.raises(ConfigError, match=r"^model/lora/rank=4, but no layer of SimpleNamespace took adapters"):
        trainer._restrict_optimizer(optax.adam(1e-3), {"mlp": {"kernel": jnp.zeros((2, 2))}})
    trainer.context = SimpleNamespace(config={})
    assert trainer._restrict_optimizer(optax.adam(1e-3), {"mlp": {"kernel": jnp.zeros((2, 2))}}) is not None
