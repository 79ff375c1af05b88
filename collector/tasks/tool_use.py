"""The prompt format of tool-use episodes (environment ``tool_python``), in one place.

The model reasons, writes one fenced Python block per turn, reads what the interpreter printed
(or its error) in the next user message, and ends with its final answer in ``\\boxed{}``. The
prompt template ``tool_python`` carries the instructions (``tool_python_shot``: the same, with one
worked exchange before the question; ``tool_python_fix_shot``: one whose first call fails and is
fixed); :func:`code_block` finds the call in a
turn; :func:`observation` formats the interpreter's answer.
"""

from __future__ import annotations

import re

from .templates import PromptTemplate, register_template

SYSTEM = (
    "You solve math problems and can run Python code. To run code, write it in a block that starts "
    "with ```python and ends with ```; use print() to see results. You will get the output, then "
    "continue. When you know the answer, write it within \\boxed{}."
)
USER = "{question}"

#: What the model is shown after a call: the output, or the error (the sandbox's observation).
OUTPUT = "Output:\n```\n{text}\n```"
ERROR = "Error:\n```\n{text}\n```"
NO_OUTPUT = "Output: (nothing was printed; use print() to see a value)"
#: After the last allowed call, a block is not run: the model is asked for its answer.
NO_MORE_CALLS = "No more code can be run. Write your final answer within \\boxed{{}}."
#: CLEANER's lookahead (methods/cleaner/saar.py): a correction with no block to run is shown this.
NO_CODE = "Error:\n```\nthere is no Python block to run: write the corrected code in a python block\n```"
#: CLEANER: after K corrections of a call all failed, the error stays in the history with this
#: note (as the authors' code does) and rollback stops for the episode.
TRY_DIFFERENT = "The code keeps failing. Try a different approach."

TEMPLATE = register_template(PromptTemplate("tool_python", USER, system=SYSTEM, answer_format="boxed"))

#: One worked exchange in the format (a call, its output, the answer): a small model that rarely
#: writes a block from the instructions alone imitates it (docs/cleaner.md, measured at v0).
SHOT = (
    {"role": "user", "content": "What is 372 * 419?"},
    {"role": "assistant", "content": "I will multiply the numbers with Python.\n```python\nprint(372 * 419)\n```"},
    {"role": "user", "content": OUTPUT.format(text="155868")},
    {"role": "assistant", "content": "The product is \\boxed{155868}."},
)
TEMPLATE_SHOT = register_template(PromptTemplate("tool_python_shot", USER, system=SYSTEM, answer_format="boxed",
                                                 shots=SHOT))

#: One worked exchange in which the first call fails and one added line fixes it (a diagnostic prompt
#: for CLEANER's regime, issue 37): a call of ``math.perm`` (which no level-9 task asks) without
#: ``import math`` gets the sandbox's real ``NameError``, the next turn adds the import, and the
#: answer follows. A small model that imitates it makes the recoverable error CLEANER's rollback is
#: for (docs/cleaner.md, "A shot that shows the fix"); the method is unchanged, only the task's prompt.
FIX_SHOT = (
    {"role": "user", "content": "What is math.perm(7, 3)?"},
    {"role": "assistant", "content": "I will compute it with Python.\n```python\nprint(math.perm(7, 3))\n```"},
    {"role": "user", "content": ERROR.format(text='Traceback (most recent call last):\n  File "<stdin>", line 1, in '
                                                  "<module>\nNameError: name 'math' is not defined")},
    {"role": "assistant", "content": "I forgot to import math.\n```python\nimport math\nprint(math.perm(7, 3))\n```"},
    {"role": "user", "content": OUTPUT.format(text="210")},
    {"role": "assistant", "content": "The answer is \\boxed{210}."},
)
TEMPLATE_FIX_SHOT = register_template(PromptTemplate("tool_python_fix_shot", USER, system=SYSTEM, answer_format="boxed",
                                                     shots=FIX_SHOT))

_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def code_block(text: str) -> str | None:
    """The code of the first fenced Python block of a turn (an unclosed block at the end of a
    truncated turn counts, up to where it stops); None when the turn has none."""
    m = _BLOCK.search(text)
    if m is None:
        return None
    code = m.group(1).strip("\n")
    return code if code.strip() else None


def block_start(text: str) -> int | None:
    """Where the first fenced Python block of a turn begins (the index of its first backtick), or
    None when the turn has none: the text before it is the turn's reasoning (CLEANER's r_t)."""
    m = _BLOCK.search(text)
    return None if m is None else m.start()


def observation(text: str, failed: bool) -> str:
    """The user message that shows a call's result."""
    if not text.strip():
        return ERROR.format(text="the code failed and printed nothing") if failed else NO_OUTPUT
    return (ERROR if failed else OUTPUT).format(text=text.rstrip())
