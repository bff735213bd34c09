"""``reward/model``: a learned reward, the score of a ``train/reward`` run (imports no jax until called).

``reward/model/run=run:NAME[@STEP]`` names the run (under the job's root: ``--root``, else
``$THESEUS_ROOT`` or ``~/.theseus``; its latest checkpoint unless a step is given). It mixes with the
rule rewards like any other: ``rl/rewards=model:1.0,format:0.2``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.errors import ConfigError, TheseusError, error_line
from theseus.rl.rewards import Reward

RUN_KEY = "reward/model/run"


@dataclass
class ModelReward(Reward):
    """The reward a trained reward model gives each completion (its prompt, then the completion)."""

    name: ClassVar[str] = "model"

    run: str = field(RUN_KEY, default="", help="the train/reward run that scores: run:NAME[@STEP] under the root")
    batch_size: int = field("reward/model/batch_size", default=16, above=0, help="completions scored per call")

    def __call__(self, prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
        return self.scorer().score(list(prompts), list(completions))

    def prepare(self) -> None:
        self.scorer()

    def scorer(self) -> Any:
        """The reward run's scorer, loaded once; a run that cannot score is one ConfigError line."""
        if not self.run.strip():
            raise ConfigError(
                f"reward 'model' scores with a trained reward model; pass {RUN_KEY}=run:NAME[@STEP] "
                "(a run of train/reward)"
            )
        from theseus.base.job import job_root
        from theseus.model.reward.scoring import cached_scorer, reward_ref

        ref = reward_ref(self.run, job_root(), RUN_KEY)
        try:
            return cached_scorer(ref, int(self.batch_size))
        except TheseusError:
            raise
        except Exception as exc:  # a checkpoint or tokenizer the run cannot give back
            raise ConfigError(
                f"{RUN_KEY}={self.run.strip()}: the reward run could not be loaded: {error_line(exc)}"
            ) from exc


__all__ = ["ModelReward"]
