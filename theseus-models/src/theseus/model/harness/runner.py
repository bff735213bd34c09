"""Running lm-eval's evaluator on a theseus model: ``lm_eval.simple_evaluate`` with loaded tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from theseus.model.harness import tasks
from theseus.model.harness.tasks import Selection


@dataclass(frozen=True)
class Options:
    """What lm-eval's command takes as ``--num_fewshot``, ``--limit`` and ``--log_samples``."""

    num_fewshot: int = -1  # -1: each task's own
    limit: int = 0  # 0: every document
    log_samples: bool = False


def evaluate(lm: Any, selection: Selection, options: Options, model_args: dict[str, Any] | None = None) -> Any:
    """lm-eval's results of ``lm`` on the selected tasks (what ``simple_evaluate`` returns).

    The tasks are loaded (and checked) here unless ``selection`` holds tasks loaded for this run;
    those are used once.
    """
    from lm_eval import simple_evaluate

    loaded = selection.loaded if selection.loaded is not None else tasks.load(selection)
    selection.loaded = None
    results = simple_evaluate(
        model=lm,
        tasks=tasks.top_level(loaded),
        num_fewshot=None if options.num_fewshot < 0 else options.num_fewshot,
        limit=options.limit or None,
        batch_size=getattr(lm, "batch_size", None),
        log_samples=options.log_samples,
        task_manager=selection.manager,
    )
    if results is not None and model_args:
        results["config"]["model_args"] = dict(model_args)
    return results


__all__ = ["Options", "evaluate"]
