"""MLflow tracking: the whole config as params, per-step metrics in fixed namespaces.

Default tracking store: ``sqlite:///$REFLEXDB_HOME/mlflow.db`` with artifacts in
``$REFLEXDB_HOME/mlartifacts``; ``reflexdb ui`` serves it. One MLflow experiment per reflexdb run
(``reflexdb/<run>``); a resumed learner continues the same MLflow run. Metric names are
documented in docs/metrics.md.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from reflexdb.config import Config
from reflexdb.settings import ensure_home, home

log = logging.getLogger(__name__)


def default_tracking_uri() -> str:
    return f"sqlite:///{home() / 'mlflow.db'}"


def tracking_uri(cfg: Config | None = None) -> str:
    return (cfg.learner.tracking_uri if cfg else None) or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker:
    """An MLflow run for one reflexdb run's learner (or an evaluation)."""

    def __init__(self, cfg: Config, *, resume_run_id: str | None = None, run_name: str | None = None):
        import mlflow

        logging.getLogger("alembic").setLevel(logging.WARNING)  # MLflow migrates its sqlite store
        ensure_home()
        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri(cfg))
        experiment = f"reflexdb/{cfg.run}"
        if mlflow.get_experiment_by_name(experiment) is None:
            mlflow.create_experiment(experiment, artifact_location=(home() / "mlartifacts").as_uri())
        mlflow.set_experiment(experiment)
        self.client = mlflow.tracking.MlflowClient()
        if resume_run_id:
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
        else:
            exp = mlflow.get_experiment_by_name(experiment)
            run = self.client.create_run(exp.experiment_id, run_name=run_name or f"{cfg.run}-learner",
                                         tags={"reflexdb.run": cfg.run, "reflexdb.algorithm": cfg.algorithm})
            self.run_id = run.info.run_id
        self.cfg = cfg

    def log_config(self) -> None:
        params = _flatten(self.cfg.masked())
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None and math.isfinite(v)]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self, status: str = "FINISHED") -> None:
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as exc:  # tracking must never take the learner down
            log.warning("could not close the MLflow run: %s", exc)
