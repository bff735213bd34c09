"""The ``harness`` evaluation: lm-evaluation-harness tasks on the parameters a trainer is training.

theseus run train/pretrain evaluation=harness evaluation/harness/tasks=my_task \\
    evaluation/harness/include_path=tasks/ evaluation/harness/limit=50

On several processes, process 0 runs lm-eval and every process computes. Every evaluation logs
``harness/<task>/<metric>`` (``acc``, ``acc_stderr``, ``exact_match``,
``word_perplexity``, ...; ``<task>/<metric>/<filter>`` for a filter other than ``none``) and
``harness/<task>/samples``. The tasks are found and checked when the trainer is set up, before
training starts; the model reads at most ``training/sequence_length`` tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from theseus.config import field
from theseus.evaluation.base import Evaluation

if TYPE_CHECKING:
    from theseus.model.harness.tasks import Selection
    from theseus.training.base import BaseTrainer

WHAT = "evaluation=harness"


@dataclass
class Harness(Evaluation):
    """lm-eval tasks (log-likelihood, rolling log-likelihood, generation) on the trainer's current parameters."""

    name: ClassVar[str] = "harness"

    tasks: str = field("evaluation/harness/tasks", default="", help="comma-separated lm-eval task names")
    include_path: str = field(
        "evaluation/harness/include_path", default="", path="file", help="a folder of task YAML files"
    )
    num_fewshot: int = field(
        "evaluation/harness/num_fewshot", default=-1, min=-1, help="few-shot examples (-1: each task's default)"
    )
    limit: int = field("evaluation/harness/limit", default=0, min=0, help="documents per task (0: all of them)")
    batch_size: int = field("evaluation/harness/batch_size", default=8, min=1, help="rows per forward pass")

    def __post_init__(self) -> None:
        from theseus.model.harness.dependency import require_lm_eval

        require_lm_eval(WHAT)
        from theseus.model.harness import tasks

        self._selection: Selection = tasks.choose(
            self.tasks, self.include_path, key="evaluation/harness/tasks", include_key="evaluation/harness/include_path"
        )
        tasks.load(self._selection)  # checked before training starts; used by the first evaluation

    def evaluate(self, trainer: BaseTrainer, state: Any) -> Mapping[str, float]:
        from theseus.model.harness import results, runner
        from theseus.model.harness.compute import Devices
        from theseus.model.harness.lockstep import Lockstep
        from theseus.model.harness.model import TheseusLM
        from theseus.model.harness.scoring import score_function

        model = trainer.model
        score = trainer.compiled("harness_score", lambda: score_function(model))
        lockstep = Lockstep(Devices(model, state.params, score, trainer.sharding))
        lm = TheseusLM(
            model,
            state.params,
            trainer.tokenizer(),
            batch_size=self.batch_size,
            max_length=trainer.sequence_length,
            compute=lockstep,
            info={"theseus_run": trainer.run_name, "theseus_step": int(getattr(state, "step", trainer.step))},
        )
        options = runner.Options(num_fewshot=self.num_fewshot, limit=self.limit)

        def drive() -> dict[str, float]:
            found = runner.evaluate(lm, self._selection, options, model_args={"run": trainer.run_name})
            return results.flat_metrics(found or {})

        metrics: dict[str, float] = lockstep.lead(drive, share=lambda found: found)
        return metrics
