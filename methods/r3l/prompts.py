"""R3L's two prompt templates, in one place (R3L.md Fig. 13 and Fig. 14, in our own words).

- :func:`reflection_messages`: the unified reflection prompt. The policy reads the log of an
  episode (the task, each assistant turn numbered as a step, the environment's feedback on it,
  the final result) and answers with one JSON object of five keys (``reflections.KEYS``).
- :func:`guidance_message`: the guidance block a retry from the pivot gets: the reflection's JSON
  report, embedded as written, ending by telling the model not to mention it.

The paper's exact wording is in ``../shared/papers/R3L.md`` (Fig. 13, 14); these say the same in
fewer words. Change them here only: the workflow (workflow.py) and the tests use
these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

REFLECTION_SYSTEM = """You review the log of an attempt at a task: the assistant's steps and the feedback each step got. \
Find out what went wrong, if anything: start from what you can see and keep asking why until you reach the mistaken \
assumption behind it. Then say at which step it first showed.

Answer with one JSON object and nothing else, with exactly these keys:
{
  "trajectory_summary": "the strategy used, the final result and how well it was carried out, briefly",
  "root_cause_analysis": "the chain of reasons from the visible symptom back to the root cause",
  "trajectory_outcome": "one of: success, success_but_inefficient, failure",
  "improvement_suggestion": "one self-contained, actionable rule that avoids this problem next time",
  "retry_from_step": "the number of the earliest step where the root cause showed (an integer; 0 when the whole \
approach was wrong)"
}"""

GUIDANCE = """Your previous attempt ran into problems. Here is a reflection on it, based on the feedback you got:

{report}

Use these lessons and do not repeat the same mistakes. Do not mention or refer to this guidance in your answer."""


def episode_log(prompt: str, steps: Sequence[tuple[str, str | None]], final: str) -> str:
    """The text of the reflection prompt's user message.

    Args:
        prompt: the task as the model was asked it.
        steps: per assistant turn, its text and the environment's feedback on it (None after the last).
        final: the episode's result, e.g. ``"not solved (reward 0)"``.
    """
    lines = [f"Task:\n{prompt.strip()}", "", "Log:"]
    for k, (text, feedback) in enumerate(steps):
        lines.append(f"Step {k} (assistant):\n{text.strip()}")
        if feedback:
            lines.append(f"Step {k} (feedback):\n{feedback.strip()}")
    lines += ["", f"Final result: {final}"]
    return "\n".join(lines)


def reflection_messages(prompt: str, steps: Sequence[tuple[str, str | None]], final: str) -> list[dict[str, str]]:
    """The chat messages that ask for a reflection on an episode (see :func:`episode_log`)."""
    return [{"role": "system", "content": REFLECTION_SYSTEM},
            {"role": "user", "content": episode_log(prompt, steps, final)}]


def guidance_message(report: str) -> dict[str, str]:
    """The guidance a retry gets (a user message after the restored conversation): ``report`` is
    the reflection's JSON as written (from its first ``{`` to its last ``}``)."""
    return {"role": "user", "content": GUIDANCE.format(report=report.strip())}


__all__ = ["GUIDANCE", "REFLECTION_SYSTEM", "episode_log", "guidance_message", "reflection_messages"]
