"""The collectors' workflow ``selfcheck``: answer, then check the answer.

    claim:   tasks, as a plain group does (reflexdb's GroupWorkflow)
    collect: G answers per task in the run's environment; then, for each answer whose correctness
             is known, one verification: a new conversation holding the question and the answer,
             asking whether the answer is correct. The verification's reward is 1 when its verdict
             (the first "yes" or "no" of its reply) matches the answer's correctness, else 0.
             The answers' group and the verifications' group are written in one transaction, each
             verification pointing at its answer (parent_trajectory_id) and its verdict a row of
             selfcheck_verifications.
"""

from __future__ import annotations

import re

from reflexdb import GroupIn, Sibling
from reflexdb.collector.environments import EnvTask
from reflexdb.collector.workflows.group import GroupWorkflow

from .store import Verdict, Verifications

PROMPT = ("{question}\n\nProposed answer: {answer}\n\n"
          "Is the proposed answer correct? Reply with yes or no.")
#: At most this much of an answer is shown to the verifier (a model's answer may be any length).
ANSWER_CHARS = 2000
_VERDICT = re.compile(r"\b(yes|no)\b", re.I)


def parse_verdict(text: str) -> str | None:
    """``yes`` or ``no``: the first of the two words in ``text``; None when it holds neither."""
    m = _VERDICT.search(text)
    return m.group(1).lower() if m else None


def answer_text(trajectory) -> str:
    """The answer's last assistant turn (what the verifier is shown), cut to ANSWER_CHARS."""
    said = [u.text for u in trajectory.turns if u.role == "assistant"]
    return (said[-1] if said else "")[:ANSWER_CHARS]


class SelfCheckWorkflow(GroupWorkflow):
    """Args:
        max_tokens: the verifier's reply, at most (``selfcheck.max_tokens``).
    """

    def __init__(self, ctx, *, max_tokens: int = 16):
        super().__init__(ctx)
        self.max_tokens = max_tokens

    def collect(self, claimed) -> list[list[GroupIn]]:
        c = self.ctx
        answers = c.rollout([EnvTask(t.id, t.prompt, t.ground_truth) for t in claimed], c.cfg.collector.group_size)
        checked = [[j for j, a in enumerate(batch) if a.correct is not None] for batch in answers]
        prompts = [c.prompt(PROMPT.format(question=t.prompt, answer=answer_text(batch[j])))
                   for t, batch, js in zip(claimed, answers, checked) for j in js]
        replies = iter(c.sample(prompts, 1, max_new_tokens=self.max_tokens) if prompts else [])
        prompts_left = iter(prompts)
        out = []
        for t, batch, js in zip(claimed, answers, checked):
            solve = GroupIn(run_id=c.run_id, task_id=t.id, policy_version=c.version, trajectories=batch,
                            workflow="selfcheck", kind="fresh", collector=c.name, embedding_model=c.embedding_model,
                            embedding_layer=-1)
            verifications, verdicts = [], []
            for k, j in enumerate(js):
                [sample] = next(replies)
                [v] = c.score(t.ground_truth, next(prompts_left), [sample])
                verdict = Verdict(k, parse_verdict(sample.text), bool(batch[j].correct))
                v.reward, v.correct, v.error = float(verdict.agrees), verdict.agrees, None
                v.extracted_answer = verdict.verdict
                v.origin, v.parent_trajectory_id = "verification", Sibling(0, j)
                v.meta = {"selfcheck": {"answer_correct": verdict.answer_correct}}
                verifications.append(v)
                verdicts.append(verdict)
            if not verifications:
                out.append([solve])
                continue
            verify = GroupIn(run_id=c.run_id, task_id=t.id, policy_version=c.version, trajectories=verifications,
                             workflow="selfcheck", kind="fresh", collector=c.name,
                             embedding_model=c.embedding_model, embedding_layer=-1, meta={"selfcheck": "verify"},
                             attachments=[Verifications(c.run_id, tuple(verdicts))])
            out.append([solve, verify])
        return out
