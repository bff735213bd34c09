"""Generation test helpers: tiny GPT / Llama models with well-spread weights, and short training runs
on a small byte corpus whose checkpoints the generation code loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.model.models import GPT, Llama, TransformerLM
from theseus.training.base import BaseTrainer
from theseus.training.flywheel.strategy import Sampling

#: Two layers, 32 wide, byte vocabulary (257 with end-of-text), 32 positions.
TINY: dict[str, Any] = {
    "architecture/n_layers": 2,
    "architecture/n_heads": 4,
    "architecture/n_embd": 32,
    "architecture/vocab_size": 257,
    "architecture/block_size": 32,
}
FAMILIES = {"gpt": GPT, "llama": Llama}
CORPUS = "generation-bytes"


def tiny_values(family: type[TransformerLM]) -> dict[str, Any]:
    return {**TINY, "architecture/n_kv_heads": 2} if family is Llama else dict(TINY)


def build(family: type[TransformerLM]) -> TransformerLM:
    with configuration(tiny_values(family)):
        return configure(family)


def spread_params(model: TransformerLM, seed: int = 0, std: float = 0.3) -> Any:
    """Random parameters large enough that logits differ clearly between tokens (no argmax near-ties)."""
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32)))["params"]
    flat, tree = jax.tree_util.tree_flatten_with_path(nn.unbox(shapes))
    rng = np.random.default_rng(seed)
    leaves = []
    for path, leaf in flat:
        noise = rng.normal(0.0, std, leaf.shape)
        value = 1.0 + noise if "scale" in jax.tree_util.keystr(path) else noise
        leaves.append(jnp.asarray(value, leaf.dtype))
    return jax.tree.unflatten(tree, leaves)


@pytest.fixture(params=list(FAMILIES), ids=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> type[TransformerLM]:
    return FAMILIES[request.param]


# -- short training runs ---------------------------------------------------------------------------
class ByteGPT(BaseTrainer):
    MODEL: ClassVar[Any] = GPT
    DATASET = Sampling(CORPUS, 1.0, "pmd")


class ByteLlama(ByteGPT):
    MODEL = Llama


TRAINERS = {"gpt": ByteGPT, "llama": ByteLlama}

QUICK: dict[str, Any] = {
    "training/steps": 3,
    "training/batch_size": 4,
    "training/lr": 1e-2,
    "training/log_interval": 1,
    "training/eval_interval": 0,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 0,
    "training/async_checkpoints": False,
    "training/progress": False,
    "training/peak_flops": 1e12,
}


def write_corpus(root: Path) -> None:
    """Prepared byte data (Python-like lines, documents ended by end-of-text) under ``root``."""
    from theseus.data.format import PreparedWriter
    from theseus.data.tokenizers.byte import ByteTokenizer

    tokenizer = ByteTokenizer()
    rng = np.random.default_rng(0)
    lines = ["def f(x):", "    return x + 1", "import os", "class A:", "    pass", "print(f(2))"]
    with PreparedWriter(root, CORPUS, vocab_size=tokenizer.vocab_size, eot_id=tokenizer.eot_id) as writer:
        for split, count in (("train", 48), ("val", 12)):
            docs = ["\n".join(rng.choice(lines, size=int(rng.integers(3, 8)))) + "\n" for _ in range(count)]
            encoded = [np.append(np.asarray(tokenizer.encode(d), np.int64), tokenizer.eot_id) for d in docs]
            writer.append(split, np.concatenate(encoded), np.asarray([len(e) for e in encoded]), np.zeros(len(docs)))
        writer.commit(tokenizer=tokenizer.spec, style="pmd")


@dataclass
class TrainedRun:
    root: Path
    name: str
    family: type[TransformerLM]
    params: Any  # the trainer's final parameters


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainedRun]:
    """A three-step GPT run and a three-step Llama run (one layer each) in one root, each with its final checkpoint.

    They train with the "rbg" PRNG: compiling threefry parameter initialisation takes several seconds
    on CPU, and the generation code reads only the parameters.
    """
    root = tmp_path_factory.mktemp("generation-root")
    write_corpus(root)
    runs = {}
    for key, trainer_cls in TRAINERS.items():
        values = {**QUICK, **tiny_values(trainer_cls.MODEL), "architecture/n_layers": 1, "run/name": f"tiny-{key}"}
        trainer = trainer_cls.create(root, values, name=f"tests/{key}")
        with jax.default_prng_impl("rbg"):
            trainer.run()
        assert trainer.state is not None
        params = jax.device_get(trainer.state.params)
        runs[key] = TrainedRun(root, f"tiny-{key}", trainer_cls.MODEL, params)
    return runs
