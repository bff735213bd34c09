"""LoRA SFT of a tiny Mixtral on packed chat rows: the attention adapters train, the experts stay
frozen, and the mixture's losses and metrics are logged."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.finetune.conftest import TINY_SFT, prepare_chat
from theseus.model.finetune import SFTTrainer


def test_lora_sft_of_a_mixture_trains_attention_adapters_only(tmp_path: Path) -> None:
    prepare_chat(tmp_path, count=24)
    settings = {
        **TINY_SFT,
        "model": "mixtral",
        "model/lora/targets": ["query", "value", "out"],
        "training/steps": 2,
        "run/name": "moe-sft",
    }
    trainer = SFTTrainer.create(tmp_path, settings)
    before = trainer.init_state().params
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "runs" / "moe-sft" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("split") == "train"]
    assert len(train) == 2 and all(np.isfinite(r["loss"]) and r["aux_loss"] > 0 for r in train)
    assert all(r["moe_drop_rate"] == 0 and r["moe_tokens_max"] >= r["moe_tokens_mean"] for r in train)
    paths = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(before)[0]}
    assert any("lora_a" in p for p in paths) and any("router" in p for p in paths)
    assert not any("lora" in p and "mlp" in p for p in paths)


def test_lora_sft_on_the_experts_is_refused_in_one_line(tmp_path: Path) -> None:
    from theseus.errors import ConfigError

    settings = {**TINY_SFT, "model": "mixtral", "model/lora/targets": ["query", "up"], "run/name": "refused"}
    with pytest.raises(ConfigError, match="LoRA on a mixture's experts is not supported") as error:
        prepare_chat(tmp_path, count=8)
        SFTTrainer.create(tmp_path, settings).init_state()
    assert "\n" not in str(error.value)
