"""Training a tiny mixture of experts: the loss carries the auxiliary losses, the metrics reach
``metrics.jsonl`` and ``theseus runs show``, the sigmoid router's bias moves inside the train step,
and a stopped run resumes on the same curve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.training.conftest import write_byte_corpus
from theseus.training.pretrain import Pretrain

MOE_METRICS = {
    "aux_loss",
    "moe_tokens_max",
    "moe_tokens_mean",
    "moe_drop_rate",
    "moe_load_balancing_loss",
    "moe_z_loss",
}

#: 3 steps of 4 x 32 bytes through a 2-layer Qwen3-MoE of 4 experts with a sigmoid router and a
#: capacity (so tokens are dropped and the bias moves); a checkpoint every step.
ARGS = [
    "model=qwen3_moe",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/n_kv_heads=1",
    "architecture/head_dim=16",
    "architecture/block_size=32",
    "architecture/moe/n_experts=4",
    "architecture/moe/expert_hidden=16",
    "architecture/moe/router=sigmoid",
    "architecture/moe/capacity_factor=1.0",
    "architecture/moe/aux_loss=0.5",
    "architecture/moe/bias_update_rate=0.001",
    "training/batch_size=4",
    "training/steps=3",
    "training/lr=3e-3",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/checkpoint_interval=1",
    "training/async_checkpoints=false",
    "training/progress=false",
    "training/plots=false",
    "training/compilation_cache=false",
    "training/peak_flops=1e12",
    "evaluation=",
]


def rows(root: Path, name: str) -> list[dict]:
    lines = (root / "runs" / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in (json.loads(line) for line in lines) if r.get("split") == "train"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("moe-root")
    write_byte_corpus(root, "fineweb")
    return root


def test_moe_training_logs_aux_losses_moves_the_bias_and_resumes_exactly(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    straight = Pretrain.create(root, [*ARGS, "run/name=straight"])
    straight.run()
    announced = capsys.readouterr()
    assert "M active per token" in announced.out + announced.err
    train = rows(root, "straight")
    assert [r["step"] for r in train] == [1, 2, 3]
    for record in train:
        assert set(record) >= MOE_METRICS, sorted(record)
        assert record["aux_loss"] > 0 and 0 < record["moe_drop_rate"] < 1
        assert record["moe_tokens_mean"] == 4 * 32 * 2 / 4  # top 2 of 4 experts, 128 tokens
    from theseus.cli.main import main

    try:
        main(["runs", "show", "straight", "--root", str(root)])
    except SystemExit as done:
        assert not done.code
    shown = capsys.readouterr().out
    assert "moe_drop_rate" in shown and "moe_tokens_max" in shown and "aux_loss" in shown

    from theseus.runs.params import restore_params

    abstract = straight.abstract_state.params
    checkpoint = root / "runs" / "straight" / "checkpoints" / "3" / "state"
    params = restore_params(checkpoint, abstract, what="step 3", fix="rerun the test")
    bias = np.asarray(params["blocks_0"]["mlp"]["router_bias"])
    assert np.any(bias != 0)  # the train step moved the balancing bias (by -0.001, 0 or +0.001 a step)
    assert np.allclose(bias * 1000, np.round(bias * 1000), atol=1e-3) and np.max(np.abs(bias)) <= 0.003 + 1e-6

    split = Pretrain.create(root, [*ARGS, "run/name=split", "training/stop_after=2"])
    split.run()
    resumed = Pretrain.create(root, [*ARGS, "run/name=split"])
    resumed.run()
    again = rows(root, "split")
    keys = ["loss", "aux_loss", "moe_tokens_max", "moe_drop_rate", "grad_norm"]
    assert [[r[k] for k in keys] for r in again if r["step"] > 2] == [[r[k] for k in keys] for r in train[2:]]
