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
from urllib.parse import quote

from reflexdb.config import Config
from reflexdb.settings import ensure_home, home

log = logging.getLogger(__name__)


def default_tracking_uri() -> str:
    return f"sqlite:///{home() / 'mlflow.db'}"


def tracking_uri(cfg: Config | None = None) -> str:
    return (cfg.learner.tracking_uri if cfg else None) or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


#: where ``reflexdb ui`` serves the trajectory explorer, for the links the learner puts on its MLflow run
EXPLORER_URL_ENV = "REFLEXDB_EXPLORER_URL"
#: how the description the learner writes on its MLflow run begins (one that does not was rewritten by a person)
EXPLORER_NOTE = "**reflexdb explorer**:"


def explorer_url() -> str:
    """The explorer's address as ``reflexdb ui`` serves it by default (``--port 5000``: the explorer on 5001)."""
    return os.environ.get(EXPLORER_URL_ENV, "http://127.0.0.1:5001").rstrip("/")


def explorer_links(run: str, base: str) -> tuple[str, str]:
    """The tag ``reflexdb.explorer`` (the run's page) and the Markdown description that link reflexdb
    run ``run``'s MLflow runs to the explorer serving at ``base``."""
    page = f"{base.rstrip('/')}/runs/{quote(run, safe='')}"
    note = (f"{EXPLORER_NOTE} [this run's learner steps]({page}) · [its trajectories]({page}/trajectories)"
            f" · the data of step N: `{page}/steps/N` (served by `reflexdb ui`, which points these links at "
            f"the address it serves on; {EXPLORER_URL_ENV} sets another)")
    return page, note


def point_runs_at_explorer(tracking: str, base: str) -> int:
    """Point the explorer links of every reflexdb MLflow run of ``tracking`` (a store, or an MLflow
    server's address) at ``base``: the tag ``reflexdb.explorer`` and the description, unless a person
    rewrote it. ``reflexdb ui`` does it for the runs it shows: the learner wrote its links before
    anyone knew which port ``reflexdb ui --port`` would choose. Returns how many runs changed."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking)
    experiments, token = [], None
    while True:
        found = client.search_experiments(filter_string="name LIKE 'reflexdb/%'", max_results=1000, page_token=token)
        experiments += [e.experiment_id for e in found]
        token = found.token
        if not token:
            break
    changed = 0
    for i in range(0, len(experiments), 100):  # search_runs takes up to 100 experiments
        token = None
        while True:
            runs = client.search_runs(experiments[i:i + 100], max_results=1000, page_token=token)
            for r in runs:
                tags = r.data.tags
                if "reflexdb.explorer" not in tags or not tags.get("reflexdb.run"):
                    continue
                page, note = explorer_links(tags["reflexdb.run"], base)
                said = tags.get("mlflow.note.content", "")
                if tags["reflexdb.explorer"] == page and (said == note or not said.startswith(EXPLORER_NOTE)):
                    continue
                client.set_tag(r.info.run_id, "reflexdb.explorer", page)
                if said.startswith(EXPLORER_NOTE):
                    client.set_tag(r.info.run_id, "mlflow.note.content", note)
                changed += 1
            token = runs.token
            if not token:
                break
    return changed


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_params(cfg: Config) -> dict[str, str]:
    """The MLflow params a run's config becomes: :meth:`Config.masked` (no password, no credential
    a URL carried) flattened to dotted keys, each value as text cut at MLflow's 6,000 characters."""
    return {k: str(v)[:6000] for k, v in _flatten(cfg.masked()).items()}


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
        exp = mlflow.get_experiment_by_name(experiment)
        if (exp.tags or {}).get("mlflow.experimentKind") is None:
            # MLflow 3's UI opens an experiment of this kind in its model-training view (runs, metric
            # charts), not the GenAI view (traces)
            try:
                self.client.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", "custom_model_development")
            except Exception as exc:  # an older MLflow, a read-only store: the UI works without it
                log.debug("could not tag the experiment's kind: %s", exc)
        if resume_run_id:
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
        else:
            exp = mlflow.get_experiment_by_name(experiment)
            run = self.client.create_run(exp.experiment_id, run_name=run_name or f"{cfg.run}-learner",
                                         tags={"reflexdb.run": cfg.run, "reflexdb.algorithm": cfg.algorithm,
                                               "reflexdb.role": "eval" if run_name else "learner"})
            self.run_id = run.info.run_id
        self.cfg = cfg
        self._link_explorer()

    def _link_explorer(self) -> None:
        """Tag the run with its pages in the trajectory explorer (``reflexdb ui``), and say so in the
        run's description, which the MLflow UI shows as Markdown: from a curve to the step's data."""
        page, note = explorer_links(self.cfg.run, explorer_url())
        try:
            self.client.set_tag(self.run_id, "reflexdb.explorer", page)
            self.client.set_tag(self.run_id, "mlflow.note.content", note)
        except Exception as exc:  # tracking must never take the learner down
            log.debug("could not tag the MLflow run with its explorer link: %s", exc)

    def log_config(self) -> None:
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in config_params(self.cfg).items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None and math.isfinite(v)]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def learner_run_id(self) -> str | None:
        """The newest learner run of this reflexdb run's experiment (None before a learner started)."""
        exp = self.mlflow.get_experiment_by_name(f"reflexdb/{self.cfg.run}")
        if exp is None:
            return None
        for query in ("tags.`reflexdb.role` = 'learner'", f"attributes.run_name = '{self.cfg.run}-learner'"):
            try:
                found = self.client.search_runs([exp.experiment_id], filter_string=query, max_results=1,
                                                order_by=["attributes.start_time DESC"])
            except Exception:  # a run name MLflow's filter grammar cannot quote: no learner run found
                found = []
            if found:
                return found[0].info.run_id
        return None

    def log_to_learner(self, metrics: dict[str, float], step: int) -> None:
        """Also log ``metrics`` (held-out pass@1) into the learner's run, at ``step``, so one page
        shows them beside the loss and the reward. Nothing when no learner run exists yet."""
        try:
            run_id = self.learner_run_id()
            if run_id is not None and run_id != self.run_id:
                Tracker.log_metrics(_Into(self, run_id), metrics, step)
        except Exception as exc:  # tracking must never fail an evaluation
            log.warning("could not log into the learner's MLflow run: %s", exc)

    def log_evaluations(self, store, run_id: int) -> None:
        """Log the held-out evaluations the database already holds (``reflexdb eval`` before this
        learner run existed, e.g. the base model's in ``reflexdb run``) into this run."""
        from reflexdb import runs

        try:
            rows = runs.evals(store, run_id)
            for _, attempts, p1, _, _, _, step in rows:
                suffix = "" if attempts == 1 else f"_{attempts}_attempts"
                self.log_metrics({f"eval/pass_at_1{suffix}": float(p1)}, int(step))
        except Exception as exc:  # tracking must never take the learner down
            log.warning("could not copy the run's evaluations into MLflow: %s", exc)

    def close(self, status: str = "FINISHED") -> None:
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as exc:  # tracking must never take the learner down
            log.warning("could not close the MLflow run: %s", exc)


class _Into:
    """A tracker's client aimed at another MLflow run (``Tracker.log_metrics`` reads these two)."""

    def __init__(self, tracker: Tracker, run_id: str):
        self.client, self.run_id = tracker.client, run_id
