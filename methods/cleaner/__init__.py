"""CLEANER as a method (METHODS.md §5; CLEANER.md; docs/cleaner.md): train on self-purified
tool-use trajectories.

- **workflow**: ``cleaner`` (collector/workflows/cleaner.py, with collector/saar.py): G tool-use
  episodes per task, SAAR on a share ``saar_share`` of them; each episode's purified trajectory
  (or its raw one when nothing was rolled back) in the training group, the raw twins beside it in
  a group of kind ``retry`` (never eligible);
- **batch**: the oldest eligible training groups (view ``learner_eligible``), as the baselines;
- **advantages**: group-normalised (CLEANER.md Eq. 2, GRPO's);
- **loss**: DAPO (CLEANER.md Table 5: clip 0.2 / 0.28, token-mean, no KL; trainer/losses/dapo.py)
  on every valid row: purified rows with their rescored behaviour log-probs as π_old (origin
  ``purified``: ``stored``), raw rows as sampled;
- **metrics**: ``cleaner/*`` (docs/metrics.md), from the rows' ``meta`` (collector/workflows/cleaner.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import Method, WorkflowUse

from .workflow import CleanerWorkflow



class CleanerConfig(BaseModel):
    """CLEANER's knobs (METHODS.md §5, CLEANER.md Sec. 4 and Table 5; docs/cleaner.md). Read when ``algorithm: cleaner``."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(3, ge=1, le=16, description="K: corrections sampled for one failed call before it stays in the history (CLEANER.md Sec. 4.1, App. A: 3).")
    similarity_threshold: float = Field(0.5, ge=0.0, le=1.0, description="γ: a correction whose code has difflib similarity ≥ γ to the failed code replaces the code only (shallow: r_t, c'_t, o'_t); below it the reasoning too (deep: r'_aux, c'_t, o'_t) (Sec. 4.2).")
    saar_share: float = Field(1.0, ge=0.0, le=1.0, description="p: the share of episodes that get SAAR; the rest stay raw (curriculum mixing, Sec. 4.3: 0.7 for their 7B model).")


def _cfg(cfg) -> CleanerConfig:
    return cfg.section("cleaner")


def _workflows(cfg) -> list[WorkflowUse]:
    c = _cfg(cfg)
    return [WorkflowUse("cleaner", {"share": c.saar_share, "max_attempts": c.max_attempts,
                                    "threshold": c.similarity_threshold})]


def _settings(cfg) -> dict:
    c = _cfg(cfg)
    return {"cleaner.saar_share": c.saar_share, "cleaner.max_attempts": c.max_attempts,
            "cleaner.similarity_threshold": c.similarity_threshold}


def _check(cfg) -> None:
    if cfg.environment.name != "tool_python":
        raise ValueError(f"environment.name is {cfg.environment.name!r}; cleaner rolls back failed tool calls and "
                         "needs environment.name: tool_python")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def cleaner_metrics(metas: list[dict]) -> dict[str, float]:
    """``cleaner/*`` of a batch's training rows (their ``meta``; docs/metrics.md)."""
    rows = [m for m in metas if m is not None and "raw_tool_calls" in m]
    rollbacks = sum(m["rollbacks"] for m in rows)
    recovered = sum(m["recovered"] for m in rows)
    calls = sum(m["sandbox_calls"] for m in rows)
    return {
        "cleaner/tool_calls_per_traj": _mean([float(len(m.get("tool_calls") or [])) for m in rows]),
        "cleaner/tool_errors_per_traj": _mean([float(m.get("tool_errors") or 0) for m in rows]),
        "cleaner/raw_tool_calls_per_traj": _mean([float(m["raw_tool_calls"]) for m in rows]),
        "cleaner/raw_tool_errors_per_traj": _mean([float(m["raw_tool_errors"]) for m in rows]),
        "cleaner/rollbacks_per_traj": _mean([float(m["rollbacks"]) for m in rows]),
        "cleaner/recovery_rate": recovered / rollbacks if rollbacks else float("nan"),
        "cleaner/shallow_share": sum(m["shallow"] for m in rows) / recovered if recovered else float("nan"),
        "cleaner/deep_share": sum(m["deep"] for m in rows) / recovered if recovered else float("nan"),
        "cleaner/purified_share": _mean([float(m["rollbacks"] > 0) for m in rows]),
        "cleaner/saar_share": _mean([float(bool(m["saar"])) for m in rows]),
        "cleaner/runnable_share": _mean([float(bool(m["runnable"])) for m in rows]),
        "cleaner/sandbox_s_per_call": sum(m["sandbox_s"] for m in rows) / calls if calls else float("nan"),
    }


class CleanerHooks:
    """CLEANER's learner side: the ``cleaner/*`` metrics (the batch is the default one)."""

    def __init__(self, cfg, learner):
        self.cfg, self.learner = cfg, learner

    def metrics(self, batch, groups) -> dict[str, float]:
        return cleaner_metrics([t.meta for g in groups if g.kind != "retry" for t in g.trajectories])


#: ``algorithm: cleaner``.
METHOD = Method(
    "cleaner", "CLEANER: DAPO on tool-use trajectories purified by similarity-aware rollback (CLEANER.md)", "dapo",
    config=CleanerConfig, workflows=_workflows, settings=_settings, check=_check, hooks=CleanerHooks,
)

#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(
    name="cleaner",
    methods=(METHOD,),
    workflows={"cleaner": CleanerWorkflow},
    sql=Path(__file__).parent / "sql",
    tables=f"{__name__}.tables",
    archived=(("purifications", "run_id = %(run)s", "trajectory_id, turn_index"),),
)
