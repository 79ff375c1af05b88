"""``tool_python``: solve a math problem with a sandboxed Python interpreter as a tool.

Each assistant turn either **calls the tool** (it contains a fenced ```python block: the first
block is run in the sandbox, collector/sandbox.py, and its output or error is the next user
message) or **answers** (no block: the reward function grades it and the episode ends). After
``max_tool_calls`` calls a block is no longer run: the model is told to answer, and its next turn
is graded whatever it holds. A truncated turn (``finish_reason = length``) with an unclosed block
still calls the tool with what was written. The prompt format is ``collector/tasks/tool_use.py``.

Reward: the reward function's value of the answering turn (0/1 for ``math``); an episode has at
most ``max_tool_calls + 1`` assistant turns, the last one always graded. Each call's result is in
the episode's ``meta.tool_calls`` (status, exit code, wall and CPU seconds) and the tool's turn is
stored with role ``tool``, ``tool_error`` set when the call failed, and the call's whole record
in ``tool_call`` (:meth:`ToolResult.record`; view ``tool_calls``): the definition of a failed
execution is :attr:`ToolResult.failed` (non-zero exit, an uncaught exception, a signal, the
wall-clock timeout, a CPU, memory, output, code-size or file limit).

The sandbox is created and checked once per process, when the first episode is made (a machine
where it cannot be created stops the collector with one line; nothing runs unsandboxed). The
calls of all the episodes of a turn run concurrently, at most ``concurrency`` at a time
(:meth:`ToolPython.step_batch`, which the rollout driver uses when an environment has it).
"""

from __future__ import annotations

import functools
from pydantic import BaseModel, ConfigDict, Field

from ..sandbox import PythonSandbox, SandboxLimits, ToolResult
from ..tasks import tool_use
from . import register_environment
from .base import EnvTask, Step, judge


@functools.lru_cache(maxsize=4)
def shared_sandbox(limits: SandboxLimits, concurrency: int) -> PythonSandbox:
    """One checked sandbox per process and setting (SandboxUnavailable if it cannot be created)."""
    box = PythonSandbox(limits, max_concurrency=concurrency)
    box.check()
    return box


def run_calls(envs: list, codes: list[str | None]) -> dict[int, ToolResult]:
    """``{i: result}`` of every non-None ``codes[i]``, run in ``envs[i]``'s sandbox: the calls of
    each sandbox concurrently (at most its ``max_concurrency`` at a time)."""
    by_box: dict[int, list[int]] = {}
    for i, code in enumerate(codes):
        if code is not None:
            by_box.setdefault(id(envs[i].sandbox), []).append(i)
    results: dict[int, ToolResult] = {}
    for idx in by_box.values():
        for i, res in zip(idx, envs[idx[0]].sandbox.run_many([codes[i] for i in idx])):
            results[i] = res
    return results


@register_environment("tool_python")
class ToolPython:
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        max_tool_calls: int = Field(4, ge=0, le=32, description="Most code calls in an episode; the turn after the last one must answer.")
        timeout_s: float = Field(4.0, gt=0, le=600, description="Wall-clock limit of one call, seconds.")
        cpu_s: float = Field(4.0, gt=0, le=600, description="CPU time of one call, all its processes together, seconds.")
        memory_mb: int = Field(256, ge=32, le=65536, description="Memory of one call, MB: all its processes, shared memory, memfd and /tmp files together (a cgroup); also each process's address space.")
        processes: int = Field(16, ge=1, le=4096, description="Most processes and threads of one call.")
        cpus: float = Field(1.0, gt=0, le=256, description="CPUs one call may use at once (a cgroup quota).")
        scratch_mb: int = Field(16, ge=1, le=4096, description="Size of the call's /tmp, its only writable place, MB (counted in memory_mb too).")
        code_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="Largest code a call may run, bytes (UTF-8); more is a 'limit' tool error, never run.")
        output_bytes: int = Field(65536, ge=256, le=64 * 1024 * 1024, description="Most bytes of output a call may print; more stops it.")
        observation_chars: int = Field(1000, ge=64, le=100000, description="Most characters of a call's output or error shown to the model.")
        concurrency: int = Field(4, ge=1, le=256, description="Most calls run at once (across the episodes of a turn).")

        def limits(self) -> SandboxLimits:
            return SandboxLimits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb,
                                 processes=self.processes, output_bytes=self.output_bytes,
                                 scratch_mb=self.scratch_mb, code_bytes=self.code_bytes, cpus=self.cpus)

    def __init__(self, task: EnvTask, options: Options | None = None, *, reward_fn, template):
        self.task, self.reward_fn, self.template = task, reward_fn, template
        self.options = options or self.Options()
        self.sandbox = shared_sandbox(self.options.limits(), self.options.concurrency)
        # (text, finish_reason, the call's result or None) of each assistant turn: restoring replays
        # this bookkeeping and never runs code again
        self.history: list[tuple[str, str, ToolResult | None]] = []
        self.notes: dict[int, str] = {}  # turn -> a line shown after its call's result
        self._done = False

    multi_turn = True

    def reset(self) -> list[dict[str, str]]:
        self.history, self.notes, self._done = [], {}, False
        return self.template.messages(self.task.prompt)

    @property
    def calls(self) -> int:
        return sum(1 for *_, r in self.history if r is not None)

    def pending_code(self, text: str) -> str | None:
        """The code this turn would run, or None when it answers (or no call is left)."""
        if self._done:
            raise RuntimeError("the episode is over")
        if self.calls >= self.options.max_tool_calls:
            return None
        return tool_use.code_block(text)

    def step(self, text: str, finish_reason: str, result: ToolResult | None = None, note: str | None = None) -> Step:
        """The environment's answer to a turn; ``result``: the turn's call already run (a batch's
        calls run together; CLEANER's lookahead); ``note``: a line shown after the call's result."""
        code = self.pending_code(text)
        if code is not None:
            result = result if result is not None else self.sandbox.run(code)
            if note:
                self.notes[len(self.history)] = note
            return self._call(text, finish_reason, code, result)
        return self._answer(text, finish_reason)

    def _call(self, text: str, finish_reason: str, code: str, result: ToolResult) -> Step:
        self.history.append((text, finish_reason, result))
        return self.tool_feedback(result, last=self.calls >= self.options.max_tool_calls,
                                  note=self.notes.get(len(self.history) - 1))

    def tool_feedback(self, result: ToolResult | None, *, last: bool = False, note: str | None = None) -> Step:
        """The step that shows a call's result to the model (``None``: a turn with no block to run,
        shown :data:`~collector.tasks.tool_use.NO_CODE`), without committing it to the episode:
        CLEANER's lookahead (methods/cleaner/saar.py) shows errors it may roll back. ``last``: no call is
        left after it; ``note``: a line added after the result."""
        if result is None:
            shown, failed, record = tool_use.NO_CODE, True, None
        else:
            shown = tool_use.observation(result.observation(self.options.observation_chars), result.failed)
            failed, record = result.failed, result.record()
        if last:
            shown += "\n" + tool_use.NO_MORE_CALLS.format()
        if note:
            shown += "\n" + note
        return Step(feedback=[{"role": "user", "content": shown}], done=False, feedback_role="tool", tool_error=failed,
                    tool_call=record)

    def _answer(self, text: str, finish_reason: str) -> Step:
        reward, correct, answer, error = judge(self.reward_fn, text, self.task.ground_truth)
        self.history.append((text, finish_reason, None))
        self._done = True
        calls = [{"turn": i, "status": r.status, "exit_code": r.exit_code, "seconds": round(r.seconds, 4),
                  "cpu_s": None if r.cpu_s is None else round(r.cpu_s, 4)}
                 for i, (_, _, r) in enumerate(self.history) if r is not None]
        return Step(done=True, answer=answer, correct=correct, reward=reward, episode_reward=reward,
                    episode_correct=None if reward is None else bool(correct), error=error,
                    meta={"tool_calls": calls, "tool_errors": sum(c["status"] != "ok" for c in calls)})

    @classmethod
    def step_batch(cls, envs: list[ToolPython], texts: list[str], reasons: list[str]) -> list[Step]:
        """One turn of many episodes: their calls run concurrently (at most ``concurrency`` at a
        time), then each episode steps with its result, in order."""
        results = run_calls(envs, [env.pending_code(t) for env, t in zip(envs, texts)])
        return [env.step(t, r, results.get(i)) for i, (env, t, r) in enumerate(zip(envs, texts, reasons))]

    def restore(self, turn: int) -> list[dict[str, str]]:
        if not 0 <= turn <= len(self.history) or (turn == len(self.history) and self._done):
            raise ValueError(f"cannot restore to turn {turn}: {len(self.history)} made")
        kept, notes = self.history[:turn], self.notes
        messages = self.reset()
        self.notes = {k: v for k, v in notes.items() if k < turn}
        for text, reason, result in kept:
            messages.append({"role": "assistant", "content": text})
            if result is not None:
                messages += self._call(text, reason, tool_use.code_block(text) or "", result).feedback
        return messages

