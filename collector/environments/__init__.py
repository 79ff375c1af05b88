"""Environments by name: what happens between the model's turns of an episode.

    register_environment("multi_attempt")(MultiAttemptMath)   # a module named by a reflexdb.plugins entry point
    make_environment(cfg.environment, task, reward_fn=..., template=...)

The run's config selects one (``environment.name``, default ``single``: today's one-turn answer)
and its options (the other keys of ``environment:``, validated by the class's ``Options`` model).
The rollout driver (``collector/episodes.py``) runs many episodes of it at once. See base.py.
"""

from __future__ import annotations

from typing import Any

from reflexdb.config import parse_environment_options
from reflexdb.plugins import ENVIRONMENTS

from .base import Environment, EnvTask, Step


def register_environment(name: str):
    """Class decorator: register an environment under ``name`` (names are unique)."""
    return ENVIRONMENTS.register(name)


get_environment = ENVIRONMENTS.get
environment_names = ENVIRONMENTS.names


#: The options of environment ``name`` as its typed ``Options`` model (ValueError naming a bad key).
parse_options = parse_environment_options


def make_environment(name: str, options: Any, task: EnvTask, *, reward_fn, template) -> Environment:
    """A fresh episode of environment ``name`` on ``task``."""
    return get_environment(name)(task, options, reward_fn=reward_fn, template=template)


__all__ = ["ENVIRONMENTS", "EnvTask", "Environment", "Step", "environment_names", "get_environment",
           "make_environment", "parse_options", "register_environment"]
