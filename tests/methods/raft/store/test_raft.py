"""RAFT (the best-of-group SFT baseline): ``raft.min_reward`` and a learner step on a real store."""

from __future__ import annotations

from reflexdb.config import parse_config

from tests.store.test_methods import batch_of


def test_raft_min_reward_drops_groups_whose_best_is_below_it():
    cfg = parse_config({"run": "r", "algorithm": "raft", "raft": {"min_reward": 0.6}})
    [term] = cfg.method.loss_terms(cfg, cfg.loss_params)
    b = batch_of([0.2, 0.9, 0.5, 0.4], [0, 0, 1, 1])
    assert (term.loss, term.rows(b).nonzero().flatten().tolist()) == ("sft", [1])  # group 1's best is 0.5 < 0.6


def test_raft_learner_step_trains_sft_on_the_best_row_of_each_group(store, tmp_path, monkeypatch, model_cache):
    from reflexdb.trainer.learner import Learner

    from tests.processes import rows
    from tests.store.test_learn import config_data, seed_groups

    seed_groups(store, "learn-test", 2)
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    lr = Learner(parse_config({**config_data(), "algorithm": "raft", "max_staleness": 100}), store, echo=print)
    lr.setup()
    lr.run(max_steps=1)
    # 2 groups of 4 consumed; the loss is the NLL of the two best rows (token-mean), a positive number.
    [(n, nll)] = rows(store, "SELECT (SELECT count(*) FROM consumption), (metrics->>'loss/nll')::float8 "
                             "FROM learner_steps")
    assert n == 8 and nll > 0
