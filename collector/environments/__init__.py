"""Environments by name: what happens between the model's turns of an episode.

    register_environment("multi_attempt")(MultiAttemptMath)   # a built-in module below, or a plug-in
    make_environment(cfg.environment, task, reward_fn=..., template=...)

The run's config selects one (``environment.name``, default ``single``: today's one-turn answer)
and its options (the other keys of ``environment:``, validated by the class's ``Options`` model).
The rollout driver (``collector/episodes.py``) runs many episodes of it at once. See base.py.
"""

from __future__ import annotations

from typing import Any

from reflexdb.plugins import ClassRegistry

from .base import Environment, EnvTask, Step

ENVIRONMENTS = ClassRegistry("environment", __name__, ("multi_attempt", "single", "tool_python"))
#: Class decorator: register an environment under ``name`` (names are unique).
register_environment = ENVIRONMENTS.register
get_environment = ENVIRONMENTS.lookup
environment_names = ENVIRONMENTS.names


def parse_options(name: str, options: dict[str, Any]) -> Any:
    """The options of environment ``name`` as its typed ``Options`` model (ValueError naming a bad key)."""
    from pydantic import ValidationError

    cls = get_environment(name)
    try:
        return cls.Options.model_validate(options)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            key = "environment." + ".".join(str(p) for p in e["loc"])
            problems.append(f"{key}: unknown key (environment {name!r} takes: {', '.join(cls.Options.model_fields)})"
                            if e["type"] == "extra_forbidden" else f"{key}: {e['msg']} (got {e.get('input')!r})")
        raise ValueError("\n  ".join(problems)) from None


def make_environment(name: str, options: Any, task: EnvTask, *, reward_fn, template) -> Environment:
    """A fresh episode of environment ``name`` on ``task``."""
    return get_environment(name)(task, options, reward_fn=reward_fn, template=template)


__all__ = ["ENVIRONMENTS", "EnvTask", "Environment", "Step", "environment_names", "get_environment",
           "make_environment", "parse_options", "register_environment"]
