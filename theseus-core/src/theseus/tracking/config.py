"""``metrics/*`` keys: which trackers receive a run's metrics, and how they are set up."""

from __future__ import annotations

from dataclasses import dataclass

from theseus.config import field


@dataclass
class TrackingConfig:
    """The metrics sinks of a run (``metrics.jsonl`` is always written) and tracker settings."""

    sinks: str = field(
        "metrics/sinks",
        default="jsonl",
        help="comma-separated metrics sinks: jsonl (always on), tensorboard, wandb, mlflow",
    )
    wandb_project: str = field("metrics/wandb/project", default="theseus", help="W&B project")
    wandb_entity: str = field("metrics/wandb/entity", default="", help="W&B entity (user or team; empty = default)")
    wandb_name: str = field("metrics/wandb/name", default="", help="W&B run name (empty = the run name)")
    wandb_tags: str = field("metrics/wandb/tags", default="", help="comma-separated W&B tags")
    wandb_group: str = field("metrics/wandb/group", default="", help="W&B group (empty = none)")
    wandb_mode: str = field(
        "metrics/wandb/mode",
        default="",
        help="W&B mode: online, offline or disabled (empty = $WANDB_MODE, else online)",
    )
    mlflow_tracking_uri: str = field(
        "metrics/mlflow/tracking_uri",
        default="",
        help="MLflow tracking URI (empty = a local file store at <root>/mlruns)",
    )
    mlflow_experiment: str = field(
        "metrics/mlflow/experiment", default="", help="MLflow experiment name (empty = the job key)"
    )


#: The sinks theseus ships; third-party sinks come from the ``theseus_metrics_sinks`` hook.
BUILTIN_SINKS = ("jsonl", "tensorboard", "wandb", "mlflow")

#: The ``theseus-core`` extra that installs each tracker's package.
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
