"""Prompt templates (task → chat messages) and chat templates (messages → token ids).

A :class:`PromptTemplate` wraps a task's question in instructions about the answer format that
the reward function's extractor expects. The messages are then rendered with the tokenizer's own
chat template (SmolLM2 ships one); a tokenizer without one falls back to ChatML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reflexdb.plugins import TEMPLATES

#: ChatML, used only when a tokenizer carries no chat template of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class PromptTemplate:
    """How a question becomes chat messages.

    Args:
        name: registry name.
        user: format string with a ``{question}`` field.
        system: optional system message; ``None`` keeps the chat template's default.
        answer_format: the extractor that fits the instructions (see :mod:`reflexdb.collector.rewards`).
        shots: example turns (chat messages, ``user`` and ``assistant``: an exchange in the format
            asked for) put between the system message and the question: a few-shot prompt.
    """

    name: str
    user: str
    system: str | None = None
    answer_format: str = "auto"
    shots: tuple[Mapping[str, str], ...] = ()

    def messages(self, question: str) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += [dict(m) for m in self.shots]
        out.append({"role": "user", "content": self.user.format(question=question)})
        return out


def register_template(template: PromptTemplate, *, replace: bool = False) -> PromptTemplate:
    """Add a prompt template under ``template.name``."""
    return TEMPLATES.register(template.name, template, replace=replace)


def get_template(name: str) -> PromptTemplate:
    """The template registered as ``name`` (``UnknownName`` lists the known ones)."""
    return TEMPLATES.get(name)


def template_names() -> list[str]:
    return TEMPLATES.names()


register_template(PromptTemplate("plain", "{question}", answer_format="last_number"))
register_template(
    PromptTemplate(
        "boxed",
        "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
        answer_format="boxed",
    )
)
register_template(
    PromptTemplate(
        "answer_tag",
        "{question}\nThink step by step, then write only the final answer inside "
        "<answer></answer> tags, for example <answer>42</answer>.",
        answer_format="answer_tag",
    )
)


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` under the tokenizer's chat template (ChatML if it has none)."""
    kwargs: dict[str, Any] = {}
    if not getattr(tokenizer, "chat_template", None):
        kwargs["chat_template"] = CHATML_TEMPLATE
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


def apply_chat_template(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template (special tokens come from the
    template text itself, so none are added on top)."""
    text = render_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))
