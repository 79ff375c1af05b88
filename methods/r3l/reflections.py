"""R3L's reflections in the store (METHODS.md §1; R3L.md Sec. 4.1, Fig. 13; docs/r3l.md).

For each base episode the policy writes a **reflection**: JSON with five keys (:data:`KEYS`).
:func:`parse_reflection` reads it by the paper's rule: from the first ``{`` to the last ``}``,
valid only when every key is present, ``trajectory_outcome`` is one of :data:`OUTCOMES` and
``0 ≤ retry_from_step < number of assistant turns``. Every reflection is stored (table
``reflections``), invalid ones too, with the raw text and the parse error.

The collector side is ``workflow.py``; it writes, in one transaction, the exploration group (base
and distilled episodes) with the attachment :class:`Reflections` (their rows, inserted once the
base episodes' ids exist) and a group of kind ``retry`` holding each reflection's own tokens
(origin ``reflection``) and each guided retry (origin ``guided_retry``). Which reflection a
distilled, reflection or guided-retry row belongs to is a row of R3L's table
``trajectory_reflections`` (:class:`ReflectionLinks`, revision r3l_0001). The learner side is
``__init__.py``; the views are ``r3l_*``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any


from reflexdb.sqlfile import load_queries
from reflexdb.storable import storable_json, storable_text

if TYPE_CHECKING:
    from reflexdb.store import Store

Q = load_queries("r3l.sql", "reflexdb.methods.r3l")

#: The reflection's keys (R3L.md Fig. 13), in the order the template asks for them.
KEYS = ("trajectory_summary", "root_cause_analysis", "trajectory_outcome", "improvement_suggestion", "retry_from_step")
#: The allowed values of ``trajectory_outcome``; ``success`` means no retry.
OUTCOMES = ("success", "success_but_inefficient", "failure")
#: How a reflection was sampled (``reflections.decoding``).
DECODINGS = ("free", "json_schema")


@dataclass(frozen=True)
class ParsedReflection:
    """A reflection read by :func:`parse_reflection`.

    Attributes:
        valid: every rule held (then ``error`` is None).
        fields: the parsed JSON object, or None when the text held none.
        outcome: ``trajectory_outcome`` when it is one of :data:`OUTCOMES`, else None.
        pivot: ``retry_from_step`` as an integer when it is one, else None.
        root_cause: ``root_cause_analysis`` as text, else None.
        error: why it is invalid.
    """

    valid: bool
    fields: dict[str, Any] | None
    outcome: str | None
    pivot: int | None
    root_cause: str | None
    error: str | None

    @property
    def retry(self) -> bool:
        """Whether a retry is made from it: valid, and the outcome is not ``success`` (R3L.md Sec. 4.1)."""
        return self.valid and self.outcome != "success"


#: The longest JSON a reflection may hold (its schema's three text fields hold 400 characters each):
#: parsing is linear, but a megabyte of empty lists costs json.loads up to a second (issue 50).
MAX_JSON_CHARS = 65_536


def _as_int(value: Any) -> int | None:
    """An integer, or a string or float holding exactly one (the model may write ``"1"`` or ``1.0``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        try:
            return int(value.strip())
        except ValueError:  # more digits than Python converts (4300): no step of any episode
            return None
    return None


def parse_reflection(text: str, n_turns: int) -> ParsedReflection:
    """Read a reflection by R3L's rule (module docstring); never raises.

    Args:
        text: the reflection as generated.
        n_turns: the number of assistant turns of the episode reflected on (the pivot's bound).
    """
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return ParsedReflection(False, None, None, None, None, "no JSON object: no '{' ... '}' in the text")
    if end + 1 - start > MAX_JSON_CHARS:
        return ParsedReflection(False, None, None, None, None, f"the JSON is {end + 1 - start:,} characters; a "
                                                                f"reflection holds at most {MAX_JSON_CHARS:,}")
    try:
        fields = json.loads(text[start:end + 1])
    except json.JSONDecodeError as exc:
        return ParsedReflection(False, None, None, None, None, f"not valid JSON between the first '{{' and the last "
                                                                f"'}}': {exc.msg} at character {exc.pos}")
    except (ValueError, RecursionError) as exc:  # an integer of 5000 digits; [[[[...]]]] nested 10^5 deep
        return ParsedReflection(False, None, None, None, None, f"JSON this parser does not read: {type(exc).__name__}")
    if not isinstance(fields, dict):
        return ParsedReflection(False, None, None, None, None, "the JSON between the braces is not an object")
    outcome = fields.get("trajectory_outcome")
    outcome = outcome if outcome in OUTCOMES else None
    pivot = _as_int(fields.get("retry_from_step"))
    cause = fields.get("root_cause_analysis")
    cause = None if cause is None else cause if isinstance(cause, str) else json.dumps(cause)
    missing = [k for k in KEYS if k not in fields]
    error = None
    if missing:
        error = f"missing key(s): {', '.join(missing)}"
    elif outcome is None:
        error = f"trajectory_outcome {fields['trajectory_outcome']!r} is not one of {', '.join(OUTCOMES)}"
    elif pivot is None:
        error = f"retry_from_step {fields['retry_from_step']!r} is not an integer"
    elif not 0 <= pivot < n_turns:
        error = f"retry_from_step {pivot} is outside 0..{n_turns - 1} (the episode has {n_turns} assistant turn(s))"
    return ParsedReflection(error is None, fields, outcome, pivot, cause, error)


def reflection_schema(n_turns: int, max_chars: int = 400) -> dict[str, Any]:
    """The JSON schema of a reflection on an episode of ``n_turns`` assistant turns (constrained
    decoding, ``r3l.decoding: json_schema``): the five keys, required, in order, no others; text
    fields at most ``max_chars`` characters; the outcome one of :data:`OUTCOMES`; the pivot an
    integer in ``0..n_turns − 1``."""
    text = {"type": "string", "maxLength": int(max_chars)}
    return {
        "type": "object",
        "properties": {
            "trajectory_summary": text,
            "root_cause_analysis": text,
            "trajectory_outcome": {"type": "string", "enum": list(OUTCOMES)},
            "improvement_suggestion": text,
            "retry_from_step": {"type": "integer", "minimum": 0, "maximum": max(0, n_turns - 1)},
        },
        "required": list(KEYS),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class ReflectionIn:
    """A reflections row to write with its exploration group.

    Attributes:
        id: reserved beforehand (:func:`reserve_ids`): the retries and the reflection's own
            trajectory refer to it in the same transaction.
        base_index: the base episode's position in the exploration group.
        raw_text: the reflection as generated.
        parsed: what :func:`parse_reflection` made of it.
        decoding: ``free`` or ``json_schema``.
        policy_version: the policy that wrote it.
    """

    id: int
    base_index: int
    raw_text: str
    parsed: ParsedReflection
    decoding: str
    policy_version: int


@dataclass(frozen=True)
class Reflections:
    """The exploration group's attachment (``reflexdb/attachments.py``): its reflections rows,
    inserted after the group (a reflection refers to its base episode; the retries' references to
    the reflections are checked at commit). Not a claim: the group completes its task's claim."""

    rows: tuple[ReflectionIn, ...]
    claim: bool = False

    def before(self, cur) -> None:
        return None

    def after(self, cur, written, collector: str | None) -> None:
        from psycopg.types.json import Jsonb  # a writer has a connection, so psycopg is loaded already

        for r in self.rows:
            p = r.parsed
            cur.execute(Q["insert_reflection"], {
                "id": r.id, "trajectory_id": written.trajectory_ids[r.base_index], "raw_text": storable_text(r.raw_text),
                "parsed": None if p.fields is None else Jsonb(storable_json(p.fields)), "pivot": p.pivot,
                "outcome": p.outcome, "root_cause": storable_text(p.root_cause), "valid": p.valid,
                "error": storable_text(p.error), "decoding": r.decoding,
                "policy_version": r.policy_version})


@dataclass(frozen=True)
class ReflectionLinks:
    """A group's attachment: which of its trajectories belong to which reflection (rows of
    ``trajectory_reflections``), written after the group and after the reflections of the same
    transaction (an exploration group lists :class:`Reflections` first). Not a claim."""

    run_id: int
    links: tuple[tuple[int, int], ...]  # (position in the group, reflection id)
    claim: bool = False

    def before(self, cur) -> None:
        return None

    def after(self, cur, written, collector: str | None) -> None:
        if written is None or not self.links:
            return
        cur.execute(Q["insert_trajectory_reflections"], {
            "run_id": self.run_id, "ids": [written.trajectory_ids[i] for i, _ in self.links],
            "reflections": [r for _, r in self.links]})


def reserve_ids(store: Store, n: int) -> list[int]:
    """``n`` ids for reflections rows about to be written (trajectories of the same transaction refer to them)."""
    if n <= 0:
        return []
    with store.transaction() as conn:
        return [int(r[0]) for r in conn.execute(Q["reserve_reflection_ids"], {"n": n}).fetchall()]


def sft_pairs(store: Store, run_id: int, view: str, n: int) -> list[int]:
    """Up to ``n`` trajectory ids of the oldest available pairs of ``view`` (``r3l_reflect_set`` or
    ``r3l_retry_set``: verified corrections used fewer than ``r3l.sft_max_uses`` times)."""
    if n <= 0:
        return []
    if view not in ("r3l_reflect_set", "r3l_retry_set"):
        raise ValueError(f"not an R3L SFT set: {view!r}")
    with store.transaction() as conn:
        return [int(r[0]) for r in conn.execute(Q[f"available_{view.removeprefix('r3l_')}"],
                                                {"run_id": run_id, "n": n}).fetchall()]


@dataclass(frozen=True)
class ReflectionStats:
    """A group's reflections as the learner's ``r3l/*`` metrics see them (view ``r3l_reflections``)."""

    group_id: int
    valid: bool
    outcome: str | None
    pivot: int | None
    retried: bool
    base_reward: float | None
    retry_reward: float | None


def reflections_of(store: Store, group_ids: Sequence[int]) -> list[ReflectionStats]:
    """The reflections on the base episodes of these exploration groups."""
    with store.transaction() as conn:
        rows = conn.execute(Q["reflections_of_groups"], {"ids": list(group_ids)}).fetchall()
    return [ReflectionStats(int(g), bool(v), o, p, bool(r), br, rr) for g, v, o, p, r, br, rr in rows]


def set_sizes(store: Store, run_id: int) -> tuple[int, int, int, int]:
    """``(reflect pairs, retry pairs, available reflect pairs, available retry pairs)`` of a run."""
    with store.transaction() as conn:
        return tuple(int(x) for x in conn.execute(Q["set_sizes"], {"run_id": run_id}).fetchone())


__all__ = ["DECODINGS", "KEYS", "OUTCOMES", "ParsedReflection", "ReflectionIn", "ReflectionLinks", "ReflectionStats", "Reflections",
           "parse_reflection", "reflection_schema", "reflections_of", "reserve_ids", "set_sizes", "sft_pairs"]
