"""``reflexdb check``: validate a run config without training — no database, no model."""

from __future__ import annotations

from pathlib import Path

import typer


def check(
    config: Path = typer.Argument(..., help="Run config (YAML), e.g. examples/arithmetic-grpo.yaml."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key as run/learn/collect would: --set learner.lr=1e-5 (repeatable; the value is YAML)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the one-line verdict, not the resolved config."),
) -> None:
    """Check a config as `run`, `learn` and `collect` would read it: its keys and values, the method
    and its section, the loss family's parameters, the environment and its options, the prompt
    template, the reward and the tasks (built, not sampled). Print the resolved config (every default
    filled in, the database password masked) and exit 0; or list every problem by key and exit 2.
    Needs no database and no model."""
    import yaml

    from reflexdb.collector.rewards import get_reward
    from reflexdb.collector.sources import build_tasks
    from reflexdb.collector.tasks import get_template
    from reflexdb.config import ConfigError, load_config, parse_overrides

    cfg = load_config(config, parse_overrides(overrides))
    problems = []
    for what, probe in (("tasks.template", lambda: get_template(cfg.tasks.template)),
                        ("collector.reward", lambda: get_reward(cfg.collector.reward))):
        try:
            probe()
        except Exception as exc:  # UnknownName: says what is known
            problems.append(f"{what}: {exc}")
    try:
        tasks, skipped = build_tasks(cfg.tasks)
    except Exception as exc:
        problems.append(str(exc) if str(exc).startswith("tasks") else f"tasks: {exc}")
        tasks, skipped = [], 0
    if problems:
        raise ConfigError(f"invalid {config}:\n  " + "\n  ".join(problems))
    if not quiet:
        typer.echo(yaml.safe_dump(cfg.masked(), sort_keys=False, default_flow_style=None).rstrip())
    train = sum(t.split == "train" for t in tasks)
    typer.echo(f"ok: {config}: method {cfg.algorithm} (loss {cfg.loss_family}, advantages {cfg.advantage_scale}), "
               f"environment {cfg.environment.name}, {train} train / {len(tasks) - train} eval tasks"
               + (f" ({skipped} dataset rows skipped)" if skipped else ""))
