"""BaseTrainer.config(): what each declaration contributes; configuration mistakes are one clear line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.training.conftest import quick
from tests.training.tiny import TinyLM, TinyTrainer
from theseus.analysis import ActivationStatistics
from theseus.config import Schema, field
from theseus.errors import ConfigError
from theseus.evaluation import MultipleChoice, Perplexity
from theseus.plugins import hookimpl, plugins, register_hooks
from theseus.training.base import BaseTrainer, BaseTrainerConfig
from theseus.training.optimizers import AdamWConfig, Lion, LionConfig
from theseus.training.schedules import WSD, CosineConfig, WSDConfig


@dataclass
class MyConfig(BaseTrainerConfig):
    temperature: float = field("experiment/temperature", default=1.0)


class Declared(TinyTrainer):
    CONFIG = MyConfig
    SCHEDULE = WSD
    EVALUATION = [Perplexity, "multiple_choice"]
    ANALYSIS = [ActivationStatistics]


class OnlyOptimizer(Declared):
    OPTIMIZER = Lion


def test_config_lists_every_declaration() -> None:
    classes = Declared.config()
    assert classes[0] is MyConfig
    for expected in (TinyLM, AdamWConfig, WSDConfig, Perplexity, MultipleChoice, ActivationStatistics):
        assert expected in classes
    assert len(classes) == len(set(classes))
    keys = Schema.build(classes).keys()
    for key in (
        "experiment/temperature",
        "training/steps",
        "architecture/vocab_size",
        "optimizer/adamw/beta2",
        "schedule/wsd/decay_fraction",
        "evaluation/multiple_choice/path",
        "analysis/activations/split",
        "mesh/layout",
    ):
        assert key in keys


def test_subclass_replaces_only_what_it_declares() -> None:
    classes = OnlyOptimizer.config()
    assert LionConfig in classes and AdamWConfig not in classes
    assert WSDConfig in classes and MyConfig in classes and Perplexity in classes
    assert CosineConfig not in classes


def test_guide_trainer_config_includes_model_and_dataset() -> None:
    from tests.training.spec_mytrainer import MyTrainer
    from theseus.data.datasets import FineWeb
    from theseus.model.models import GPT

    classes = MyTrainer.config()
    assert classes[0] is BaseTrainerConfig
    assert set(GPT.gather()) <= set(classes)
    assert FineWeb in classes and AdamWConfig in classes and WSDConfig in classes


@dataclass
class PluginConfig:
    flag: bool = field("plugin/extra/flag", default=False)


class GatherPlugin:
    @hookimpl
    def theseus_gather(self, owner: type) -> list[type] | None:
        return [PluginConfig] if owner is Declared else None


def test_plugins_contribute_through_the_gather_hook() -> None:
    register_hooks(GatherPlugin(), name="test-training-gather")
    try:
        assert PluginConfig in Declared.config()
        assert PluginConfig not in TinyTrainer.config()
    finally:
        plugins().manager.unregister(name="test-training-gather")
    assert PluginConfig not in Declared.config()


def test_args_are_the_hydrated_config(tmp_path) -> None:
    trainer = Declared.create(tmp_path, {"experiment/temperature": 0.5, "training/steps": 7})
    assert isinstance(trainer.args, MyConfig)
    assert (trainer.args.temperature, trainer.args.steps) == (0.5, 7)
    assert trainer.run_name == "Declared"


def test_a_relative_root_is_made_absolute_as_the_cli_does(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """orbax reads checkpoints (training/init_from=run:...) only by absolute paths."""
    monkeypatch.chdir(tmp_path)
    assert Declared.create("root/../here").context.root == tmp_path / "here"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"training/batch_size": 8, "training/micro_batch_size": 3}, "not divisible by training/micro_batch_size=3"),
        ({"training/sequence_length": 64}, "exceeds the model's architecture/block_size=16"),
        ({"mesh/data": 2}, "does not match the 1 available devices"),
        ({"mesh/model": 2, "mesh/data": 1}, "does not shard over the model axis"),
        ({"mesh/layout": "zigzag"}, "is not one of"),
    ],
)
def test_setup_mistakes_are_config_errors(tmp_path, overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        trainer = TinyTrainer.create(tmp_path, quick(**overrides))
        trainer.setup()


def test_no_model_is_a_config_error(tmp_path) -> None:
    class NoModel(BaseTrainer):
        pass

    with pytest.raises(ConfigError, match="declares no MODEL"):
        NoModel.create(tmp_path).setup()


def test_builtin_pretraining_jobs_are_registered() -> None:
    from theseus.model.models import GPT, Llama
    from theseus.registry import get_registry

    registry = get_registry()
    gpt = registry.load_job("train/pretrain")
    llama = gpt.selected({}, {"model": "llama"})[0]
    assert issubclass(gpt, BaseTrainer) and issubclass(llama, gpt) and llama.MODEL is Llama
    assert set(GPT.gather()) <= set(gpt.config()) and set(Llama.gather()) <= set(llama.config())
    keys = Schema.build(gpt.config()).keys()
    assert "schedule/wsd/warmup_fraction" in keys and "evaluation/perplexity/batches" in keys
