"""``reflexdb run``: evaluate, train with collectors and a learner as separate processes, evaluate;
``--gpus`` lays them out on a node's GPUs (cli/layout.py), ``--print-layout`` shows the command lines."""

from __future__ import annotations

from pathlib import Path

import typer


def run(
    config: Path = typer.Argument(None, help="Run config (YAML), e.g. examples/arithmetic-grpo.yaml (or -c FILE).",
                                  show_default=False),
    config_option: Path = typer.Option(None, "--config", "-c", help="The run config, as collect, learn and eval take it."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL for every process (default: the config's database_url, then config.toml, then embedded)."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="Learner steps in total (default: learner.max_steps)."),
    max_seconds: float = typer.Option(None, "--max-seconds", min=0, help="Start no new learner step after this many seconds (default: learner.max_seconds)."),
    collectors: int = typer.Option(None, "--collectors", min=1, max=64, help="Collector processes to start (default: 1; with --gpus, one per GPU the learner does not use).", show_default=False),
    gpus: str = typer.Option(None, "--gpus", help="GPUs to lay the run out on, as torch counts them here: 0-7, 0,1,2,3 or all. The learner's ranks (torchrun) take the first --learner-gpus, one collector each of the others; a single GPU is shared. Every child runs with learner.device and collector.device cuda (docs/operations.md, 'A node of GPUs').", show_default=False),
    learner_gpus: int = typer.Option(None, "--learner-gpus", min=1, max=1024, help="GPUs (ranks) of the learner, the first of --gpus (default: half of them; the one GPU of a single-GPU machine).", show_default=False),
    print_layout: bool = typer.Option(False, "--print-layout", help="Print the command lines this would start, on which GPUs, and exit (no database, no GPU needed)."),
    evaluate: bool = typer.Option(True, "--eval/--no-eval", help="Evaluate held-out pass@1 before and after training."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key in every process: --set learner.lr=1e-5 (repeatable; the value is YAML)."),
) -> None:
    """Evaluate, train (`reflexdb collect` + `reflexdb learn` processes), evaluate again, and say where to look."""
    import os

    from reflexdb.config import ConfigError, load_config, parse_overrides

    if config is None and config_option is None:
        raise ConfigError("reflexdb run: give the run config: `reflexdb run CONFIG` or `reflexdb run -c CONFIG`")
    if config is not None and config_option is not None and config != config_option:
        raise ConfigError(f"reflexdb run: two configs given ({config} and -c {config_option}); give one")
    config = config or config_option
    if url:  # the children read it from their environment (never from a command line: it may hold a password)
        os.environ["REFLEXDB_DATABASE_URL"] = url

    from .launch import Launcher, gpus_here, summary
    from .launch import run as launch

    ids = gpus_here(gpus, print_only=print_layout)
    echo = lambda m: typer.echo(f"[run] {m}", err=True)  # noqa: E731
    if print_layout:
        typer.echo(Launcher(config, max_steps=max_steps, max_seconds=max_seconds, collectors=collectors,
                            overrides=overrides, evaluate=evaluate, echo=echo, gpus=ids, learner_gpus=learner_gpus,
                            gpu_spec=gpus).describe())
        return
    name = load_config(config, parse_overrides(overrides)).run
    result = launch(config, max_steps=max_steps, max_seconds=max_seconds, collectors=collectors, overrides=overrides,
                    evaluate=evaluate, echo=echo, gpus=ids, learner_gpus=learner_gpus, gpu_spec=gpus)
    typer.echo(summary(name, result))
    raise typer.Exit(result.exit_code)
