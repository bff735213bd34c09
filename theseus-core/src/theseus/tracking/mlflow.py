"""MLflow: the configuration as params and every scalar as a metric at its step.

Without ``metrics/mlflow/tracking_uri`` the runs go to a local file store at ``<root>/mlruns``
(``mlflow ui --backend-store-uri <root>/mlruns``). MLflow 3 keeps that store in maintenance mode
behind ``MLFLOW_ALLOW_FILE_STORE``, which theseus sets for file stores it is asked to use. The
MLflow run id is kept in ``mlflow.json`` in the run directory, so a resumed run continues it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.files import replace_file

ID_FILE = "mlflow.json"
#: MLflow's limit on a param value's length and on params per request.
MAX_PARAM_LENGTH = 6000
PARAM_BATCH = 100


def _flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = str(value)[:MAX_PARAM_LENGTH]
    return out


def table_artifact(name: str, step: int) -> str:
    """The artifact path of the table ``name`` at ``step``."""
    return f"{name}/step_{step:08d}.json"


def tracking_uri(config: Mapping[str, Any], root: Path) -> str:
    """The configured tracking URI, or a file store at ``<root>/mlruns``."""
    uri = str(config.get("metrics/mlflow/tracking_uri") or "")
    return uri or (Path(root).resolve() / "mlruns").as_uri()


class MlflowSink:
    """Logs every scalar with ``MlflowClient.log_batch`` at its step, and tables as JSON artifacts."""

    name = "mlflow"

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        *,
        root: Path,
        run_name: str,
        job: str | None,
        record: Mapping[str, Any],
    ) -> None:
        uri = tracking_uri(config, root)
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        run_dir = Path(run_dir)
        stored = self._stored(run_dir, uri)
        existing: dict[str, str] = {}
        if stored is not None:
            run = self.client.get_run(stored)
            existing = dict(run.data.params)
            self.client.update_run(stored, status="RUNNING")
            self.run_id = stored
        else:
            name = str(config.get("metrics/mlflow/experiment") or "") or job or "theseus"
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        replace_file(run_dir / ID_FILE, json.dumps({"run_id": self.run_id, "tracking_uri": uri}) + "\n")
        # MLflow params cannot change once logged: a resumed run only adds new keys.
        params = [Param(k, v) for k, v in _flatten(record).items() if k not in existing]
        for i in range(0, len(params), PARAM_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAM_BATCH])

    @staticmethod
    def _stored(run_dir: Path, uri: str) -> str | None:
        try:
            record = jsonfile.read_object(run_dir / ID_FILE)
        except jsonfile.UnreadableJSON:  # missing, damaged or hostile: a new MLflow run
            return None
        if record.get("tracking_uri") != uri:
            return None
        return str(record.get("run_id") or "") or None

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(name, float(value), now, step)
            for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def write_table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """The table as the artifact ``<name>/step_<step:08d>.json``, in the layout of MLflow's own tables
        (``columns`` and ``data``)."""
        table = {"columns": list(columns), "data": [list(row) for row in rows]}
        self.client.log_text(self.run_id, json.dumps(table, default=str), table_artifact(name, step))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
