"""The method seam: the registry, config validation per method and loss family, the best-of-group
selection (RAFT's own tests: tests/methods/raft)."""

from __future__ import annotations

import pytest
import torch
from reflexdb.trainer.batch import Batch
from reflexdb.trainer.method_api import best_of_group, get_method, method_names

from reflexdb.config import ConfigError, parse_config
from tests.factories import release_origins


def batch_of(rewards, groups) -> Batch:
    """A batch with only what row selectors read (rewards, validity, group index)."""
    valid = torch.tensor([r is not None for r in rewards])
    r = torch.tensor([0.0 if x is None else x for x in rewards])
    B = len(rewards)
    z = torch.zeros(B, dtype=torch.int64)
    return Batch(group_ids=[], trajectory_ids=list(range(B)), group_index=torch.tensor(groups), rewards=r,
                 correct=r > 0.5, valid=valid, truncated=torch.zeros(B, dtype=torch.bool), input_ids=z[:, None],
                 attention_mask=z[:, None], prompt_lengths=z, response_lengths=z,
                 response_mask=torch.ones(B, 1, dtype=torch.bool), behaviour_logprobs=torch.zeros(B, 1),
                 policy_versions=z, confidence=torch.zeros(B), group_versions=[], group_kinds=[],
                 origins=["base"] * B, origin_table=release_origins())


def test_best_of_group_keeps_one_row_per_group_first_of_equals_and_skips_null():
    # group 0: 0.2, 0.9, 0.9 -> row 1 (the first of the two 0.9s); group 1: NULL, 0.5 -> row 4 (NULL
    # is not a reward); group 2: NULL only -> nothing; group 3: non-binary 0.3, 0.7, 0.1 -> row 8
    b = batch_of([0.2, 0.9, 0.9, None, 0.5, None, 0.3, 0.7, 0.1], [0, 0, 0, 1, 1, 2, 3, 3, 3])
    assert best_of_group(b).nonzero().flatten().tolist() == [1, 4, 7]


def test_registry_lists_the_built_methods_and_their_losses():
    assert method_names() == ["cleaner", "dapo", "dr_grpo", "grpo", "grpo_lambda", "gspo", "lte", "nexgrpo", "opmd", "r3l", "raft"]
    assert {n: get_method(n).loss for n in ("nexgrpo", "raft", "dr_grpo")} == {"nexgrpo": "grpo", "raft": "sft",
                                                                                "dr_grpo": "dr_grpo"}
    assert parse_config({"run": "r", "algorithm": "dr_grpo"}).advantage_scale == "none"
    assert parse_config({"run": "r", "algorithm": "dr_grpo", "learner": {"advantage_scale": "group"}}
                        ).advantage_scale == "group"


@pytest.mark.parametrize("data, says", [
    ({"algorithm": "cleaner"}, "environment.name is 'single'; cleaner rolls back failed tool calls and needs "
                               "environment.name: tool_python"),
    ({"algorithm": "grpo2"}, "algorithm 'grpo2' is not a registered method; the methods built are: cleaner, dapo"),
    ({"learner": {"loss": "nope"}}, "learner.loss: 'nope' is not a registered loss; known: dapo"),
    ({"algorithm": "dr_grpo", "learner": {"loss_params": {"agg": "token-mean"}}},
     "learner.loss_params.agg: not a parameter of loss dr_grpo"),
    ({"learner": {"loss_params": {"lam": 0.9}}}, "learner.loss_params.lam: not a parameter of loss grpo"),
    ({"learner": {"loss_params": {"clip_eps_low": 2}}}, "learner.loss_params.clip_eps_low"),
    ({"raft": {"min_rewrd": 1}}, "raft.min_rewrd: unknown key"),
    ({"algorithm": "raft", "nexgrpo": {"conf_low": 0.95}}, "nexgrpo.conf_low (0.95) must not exceed"),
    ({"toy": {}}, "toy: unknown key"),
])
def test_config_names_the_method_problem(data, says):
    with pytest.raises(ConfigError) as err:
        parse_config({"run": "r", **data})
    assert says in str(err.value)


def test_a_section_is_stored_with_its_defaults():
    cfg = parse_config({"run": "r", "algorithm": "nexgrpo", "nexgrpo": {"conf_low": 0.3}})
    assert cfg.masked()["nexgrpo"]["conf_high"] == 0.9 and cfg.section("nexgrpo").conf_low == 0.3
    assert parse_config({"run": "r", "algorithm": "raft"}).section("raft").min_reward is None
