"""Per-token display: each response token's text, behaviour probability, policy version and mask.

The token texts come from the run's tokenizer (``runs.config.model``: the built-in names use
SmolLM2's, built once into the model cache; a local directory its own; a hub id its cached
snapshot, offline). Without one the page shows the turn's stored text and the token ids.
Nothing here builds HTML: the template escapes every text.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_lock = threading.Lock()
_tokenizers: dict[str, Any] = {}


def tokenizer_for(model: str | None) -> Any | None:
    """The tokenizer of a run's model, loaded once per process; None when it cannot be had here."""
    spec = str(model or "smollm2")
    with _lock:
        if spec in _tokenizers:
            return _tokenizers[spec]
        tok = None
        try:
            from transformers import AutoTokenizer

            if spec in ("smollm2", "tiny"):
                from reflexdb.models import smollm2_tokenizer_dir

                tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
            elif Path(spec).expanduser().is_dir():
                tok = AutoTokenizer.from_pretrained(Path(spec).expanduser())
            else:
                tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
        except Exception as exc:  # no tokenizer here: the page shows ids instead of texts
            log.warning("no tokenizer for model %r (%s): token ids are shown instead", spec, exc)
        _tokenizers[spec] = tok
        return tok


@dataclass(frozen=True)
class Token:
    index: int  # position in response_ids
    id: int
    text: str
    logprob: float | None
    version: int | None
    in_loss: bool

    @property
    def p(self) -> float | None:
        return None if self.logprob is None or not math.isfinite(self.logprob) else math.exp(self.logprob)

    @property
    def shade(self) -> str:
        """The token's background: white at p = 1, deeper red as the behaviour probability falls."""
        p = self.p
        if p is None:
            return "transparent"
        alpha = min(1.0, max(0.0, 1.0 - p)) * 0.85
        return f"rgba(220, 38, 38, {alpha:.2f})"

    @property
    def title(self) -> str:
        lp = "unknown" if self.logprob is None else f"{self.logprob:.3f} (p = {self.p:.3f})" if self.p is not None else "nan"
        return (f"token {self.index}: id {self.id}, log-prob {lp}, policy version {self.version}, "
                f"{'in the loss' if self.in_loss else 'out of the loss mask'}")


#: The most tokens of one turn the page shades. A longer turn (an imported row may hold a million
#: tokens) shows its first ones, and its stored text in full: a span per token costs about 10 µs to
#: decode, build and render, and a page of a million of them took 45 s and 237 MB of HTML.
MAX_SHADED = 20_000


def texts(tok: Any | None, ids: np.ndarray) -> list[str]:
    """Each id's text (byte-level pieces of one character show as the replacement character).

    Each distinct id is decoded once (a token's text does not depend on its neighbours here), so
    the tokenizer is called for at most its vocabulary, however long the response.
    """
    if tok is None:
        return [f"[{int(i)}]" for i in ids]
    distinct, where = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
    try:
        words = tok.batch_decode([[int(i)] for i in distinct], skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)
    except Exception:  # ids outside the vocabulary (an imported row, a random test id)
        return [f"[{int(i)}]" for i in ids]
    return [words[j] for j in where.reshape(-1).tolist()]


def shown(payload: dict[str, np.ndarray | None], start: int, end: int) -> tuple[int, int]:
    """The span ``[start, end)`` clipped to the response: the turn's tokens, shaded or not."""
    ids = payload["response_ids"]
    n = 0 if ids is None else len(ids)
    start = min(max(0, int(start)), n)
    return start, max(start, min(n, int(end)))


def tokens(tok: Any | None, payload: dict[str, np.ndarray | None], start: int, end: int,
           limit: int = MAX_SHADED) -> list[Token]:
    """The response tokens ``[start, end)`` of a trajectory's payload, the first ``limit`` of them."""
    start, end = shown(payload, start, end)
    end = min(end, start + limit)
    if end <= start:
        return []
    ids = payload["response_ids"]
    lp, ver, mask = payload["logprobs"], payload["versions"], payload["loss_mask"]
    words = texts(tok, ids[start:end])
    return [Token(i, int(ids[i]), words[i - start], None if lp is None else float(lp[i]),
                  None if ver is None else int(ver[i]), bool(mask[i]) if mask is not None else False)
            for i in range(start, end)]


def masked_out(payload: dict[str, np.ndarray | None], start: int, end: int) -> int:
    """How many tokens of ``[start, end)`` are out of the loss mask (all of them without a mask)."""
    start, end = shown(payload, start, end)
    mask = payload["loss_mask"]
    return end - start if mask is None else int(np.count_nonzero(mask[start:end] == 0))


__all__ = ["MAX_SHADED", "Token", "masked_out", "shown", "tokenizer_for", "tokens", "texts"]
