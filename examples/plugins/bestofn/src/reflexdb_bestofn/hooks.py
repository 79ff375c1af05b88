"""bestofn's learner side: the ``bestofn/*`` metrics of each step, and its picks written to table
``bestofn_picks`` (its migration makes it)."""

from __future__ import annotations

import math

from .terms import best_rows

FORGET = "DELETE FROM bestofn_picks WHERE run_id = %(run_id)s AND step >= %(step)s"
INSERT = ("INSERT INTO bestofn_picks (run_id, step, trajectory_id, group_id) "
          "VALUES (%(run_id)s, %(step)s, %(trajectory_id)s, %(group_id)s)")


class BestOfNHooks:
    """``Method.hooks``: built once per learner; ``learner`` is a ``LearnerContext``."""

    def __init__(self, cfg, learner):
        self.learner = learner
        self.min_reward = cfg.section("bestofn").min_reward
        self.picks: list[tuple[int, int]] = []  # (trajectory id, group id) of this step's best rows

    def metrics(self, batch, groups) -> dict[str, float]:
        best = best_rows(batch, self.min_reward)  # [B]
        self.picks = [(batch.trajectory_ids[i], batch.group_ids[int(batch.group_index[i])])
                      for i in best.nonzero().flatten().tolist()]
        length = float(batch.response_lengths[best].float().mean()) if self.picks else math.nan
        return {"bestofn/picked": float(len(self.picks)), "bestofn/picked_length": length}

    def after_step(self, metrics: dict[str, float]) -> None:
        L = self.learner
        if not L.main:  # rank 0 alone writes to the store
            return
        key = {"run_id": L.run_id, "step": L.step_no}
        rows = [dict(key, trajectory_id=t, group_id=g) for t, g in self.picks]

        def write() -> None:
            with L.store.transaction() as conn:  # a psycopg connection: %(name)s parameters
                conn.execute(FORGET, key)  # a step trained again after a resume replaces its picks
                if rows:
                    conn.cursor().executemany(INSERT, rows)

        L.db(write)  # retried through a database outage
