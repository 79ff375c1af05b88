"""Per-token display: each response token's text, behaviour log-prob, policy version, mask and, for
a trained row, the learner signals of a step (revision 0028); the colour maps that shade them and
their legends; runs of byte-level tokens decoded together.

The token texts come from the run's tokenizer (``runs.config.model``: the built-in names use
SmolLM2's, built once into the model cache; a local directory its own; a hub id its cached
snapshot, offline). Without one the page shows the turn's stored text and the token ids.
Nothing here builds HTML: the template escapes every text.

A byte-level tokenizer splits a character it has no token for (an emoji, most CJK) into tokens of
one or a few of its UTF-8 bytes; each such token alone decodes to U+FFFD. :func:`pieces` decodes
each run of such tokens together, so the page shows the character, as one span whose tooltip
lists each token.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from reflexdb.records import TokenSignals

from .data import BadFilter

log = logging.getLogger(__name__)

_lock = threading.Lock()
_tokenizers: dict[str, Any] = {}

#: What a byte-level token that is only part of a character decodes to alone.
REPLACEMENT = "\ufffd"
#: The most tokens one piece of jointly decoded text takes: a UTF-8 character is at most 4 bytes
#: and each byte-level token holds at least one, so a character never needs more; a longer run of
#: such tokens (bytes that are no text at all) is cut into pieces of at most this many.
MAX_JOINED = 8


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


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.{digits}f}" if math.isfinite(value) else ("∞" if value > 0 else "−∞")


class Token(NamedTuple):
    """One response token; the learner's fields are None without recorded signals. (A named tuple:
    a page builds up to :data:`MAX_SHADED` of them a turn.)"""

    index: int  # position in response_ids
    id: int
    text: str
    logprob: float | None
    version: int | None
    in_loss: bool
    advantage: float | None = None  # NaN: the step's loss gave the token none
    log_ratio: float | None = None
    clipped: bool | None = None
    entropy: float | None = None

    @property
    def p(self) -> float | None:
        return None if self.logprob is None or not math.isfinite(self.logprob) else math.exp(self.logprob)

    @property
    def signals(self) -> bool:
        return self.entropy is not None

    @property
    def title(self) -> str:
        lp = "unknown" if self.logprob is None else f"{self.logprob:.3f} (p = {self.p:.3f})" if self.p is not None else "nan"
        line = (f"token {self.index}: id {self.id}, log-prob {lp}, policy version {self.version}, "
                f"{'in the loss' if self.in_loss else 'out of the loss mask'}")
        if not self.signals:
            return line
        ratio = None if self.log_ratio is None or math.isnan(self.log_ratio) else math.exp(self.log_ratio)
        ratio_text = "—" if ratio is None else f"{_num(ratio)} (log {self.log_ratio:.4f})"
        return (f"{line}; learner: advantage {_num(self.advantage)}, ratio {ratio_text}, "
                f"{'clipped' if self.clipped else 'not clipped'}, entropy {_num(self.entropy, 2)} nats")


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


def _at(values: np.ndarray | None, i: int, n: int) -> float | None:
    """``values[i]`` as a float; None without the array or past its end (a row whose signals were
    recorded for fewer tokens)."""
    return None if values is None or i >= n else float(values[i])


def tokens(tok: Any | None, payload: dict[str, np.ndarray | None], start: int, end: int,
           limit: int = MAX_SHADED, signals: TokenSignals | None = None) -> list[Token]:
    """The response tokens ``[start, end)`` of a trajectory's payload, the first ``limit`` of them,
    each with its learner signals when ``signals`` (aligned with ``response_ids``) are given."""
    start, end = shown(payload, start, end)
    end = min(end, start + limit)
    if end <= start:
        return []
    ids = payload["response_ids"]
    lp, ver, mask = payload["logprobs"], payload["versions"], payload["loss_mask"]
    words = texts(tok, ids[start:end])
    if signals is None:
        return [Token(i, int(ids[i]), words[i - start], None if lp is None else float(lp[i]),
                      None if ver is None else int(ver[i]), bool(mask[i]) if mask is not None else False)
                for i in range(start, end)]
    n = len(signals.entropy)
    nan = float("nan")
    return [Token(i, int(ids[i]), words[i - start], None if lp is None else float(lp[i]),
                  None if ver is None else int(ver[i]), bool(mask[i]) if mask is not None else False,
                  advantage=nan if signals.advantage is None else _at(signals.advantage, i, n),
                  log_ratio=nan if signals.log_ratio is None else _at(signals.log_ratio, i, n),
                  clipped=None if i >= n else bool(signals.clipped[i]), entropy=_at(signals.entropy, i, n))
            for i in range(start, end)]


def masked_out(payload: dict[str, np.ndarray | None], start: int, end: int) -> int:
    """How many tokens of ``[start, end)`` are out of the loss mask (all of them without a mask)."""
    start, end = shown(payload, start, end)
    mask = payload["loss_mask"]
    return end - start if mask is None else int(np.count_nonzero(mask[start:end] == 0))


# ---------------------------------------------------------------------- colour maps


def _sum(values: list[float]) -> float:
    """A run's log-prob: the sum of its tokens' (the probability of the whole text); NaN if one is unknown."""
    return float(sum(values))


def _nanmax(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return max(kept) if kept else math.nan


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _furthest(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return max(kept, key=abs) if kept else math.nan


@dataclass(frozen=True)
class ColourMap:
    """How the tokens are shaded: a token's ``field`` (a run decoded together: its tokens' values
    ``combine``d, then ``transform``ed), mapped linearly onto ``[lo, hi]`` and clamped at both ends.

    ``kind``: ``sequential`` (transparent at the quiet end, ``rgb`` at the ``strong`` one),
    ``diverging`` (transparent at 0, ``rgb`` above it, ``low_rgb`` below it, ``lo = −hi``) or
    ``flag`` (``rgb`` where the value is 1). ``signals``: the field is one of the learner signals
    of a step (revision 0028).
    """

    name: str
    label: str
    what: str
    field: str
    combine: Callable[[list[float]], float]
    lo: float
    hi: float
    ticks: tuple[tuple[float, str], ...]
    kind: str = "sequential"
    strong: str = "hi"  # sequential: the end drawn in full colour ("lo" or "hi")
    rgb: tuple[int, int, int] = (220, 38, 38)
    low_rgb: tuple[int, int, int] = (220, 38, 38)
    signals: bool = False
    transform: Callable[[np.ndarray], np.ndarray] | None = None

    def value(self, run: Sequence[Token]) -> float:
        """The value of a piece (NaN: none)."""
        values = [math.nan if (v := getattr(t, self.field)) is None else float(v) for t in run]
        v = values[0] if len(values) == 1 else self.combine(values)
        return float(self.transform(np.float64(v))) if self.transform is not None else v

    def alphas(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(opacity, above)`` of each value (opacity 0: no value; ``above``: a diverging map's
        upper colour)."""
        v = np.asarray(values, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            if self.kind == "flag":
                a = np.where(v >= 0.5, 0.75, 0.0)
            elif self.kind == "diverging":
                t = np.clip(v / self.hi, -1.0, 1.0)
                a = 0.85 * np.abs(t)
            else:
                t = np.clip((v - self.lo) / (self.hi - self.lo), 0.0, 1.0)
                a = 0.85 * (t if self.strong == "hi" else 1.0 - t)
        a = np.where(np.isnan(v), 0.0, a)
        return a, (v > 0) if self.kind == "diverging" else np.ones(v.shape, bool)

    def backgrounds(self, values: np.ndarray) -> list[str]:
        """Each value's CSS background, ``rgba(r, g, b, a)`` (``a`` to 2 decimals) or ``transparent``."""
        a, above = self.alphas(values)
        steps = np.rint(a * 100).astype(np.int64).tolist()
        high, low = _css_table(self.rgb), _css_table(self.low_rgb)
        return [high[k] if up else low[k] for k, up in zip(steps, above.tolist())]

    def background(self, v: float | None) -> str:
        return self.backgrounds(np.array([math.nan if v is None else v]))[0]

    def legend(self, steps: int = 16) -> dict[str, Any]:
        """The legend bar: gradient stops ``(offset %, "rgb(...)", opacity)`` over ``[lo, hi]`` and
        the ticks ``(offset %, label)``."""
        if self.kind == "flag":
            r, g, b = self.rgb
            stops = [(0.0, "rgb(255, 255, 255)", 0.0), (49.9, "rgb(255, 255, 255)", 0.0),
                     (50.0, f"rgb({r}, {g}, {b})", 0.75), (100.0, f"rgb({r}, {g}, {b})", 0.75)]
        else:
            values = np.array([self.lo + (self.hi - self.lo) * k / steps for k in range(steps + 1)])
            a, above = self.alphas(values)
            stops = [(100.0 * k / steps, "rgb({}, {}, {})".format(*(self.rgb if up else self.low_rgb)), round(float(x), 3))
                     for k, (x, up) in enumerate(zip(a, above))]
        ticks = [(100.0 * (v - self.lo) / (self.hi - self.lo), label) for v, label in self.ticks]
        return {"stops": stops, "ticks": ticks}


_CSS: dict[tuple[int, int, int], list[str]] = {}


def _css_table(rgb: tuple[int, int, int]) -> list[str]:
    """``rgba(...)`` of opacity k/100 for k in 0..100 (0: transparent), built once per colour."""
    if rgb not in _CSS:
        r, g, b = rgb
        _CSS[rgb] = ["transparent"] + [f"rgba({r}, {g}, {b}, {k / 100:.2f})" for k in range(1, 101)]
    return _CSS[rgb]


_LN_4_3 = math.log(4 / 3)

#: The colour maps, in the order the page offers them. Ranges are fixed, not per row, so that two
#: rows' shades compare: log-prob over [−8, 0] (at temperature 1.0 most sampled tokens of a small
#: model have log-probs between −3 and 0, light to mid shades; a token below −8, p < 0.0003, is
#: saturated); probability is the old map, white at 1 (nearly everything is dark at temperature
#: 1.0, where few tokens have p near 1); entropy over [0, 6] nats; a group-normalised advantage
#: over [−2, 2] (a group of 8 with one correct row gives it +2.47, the others −0.35); the ratio on
#: a log scale over [0.75, 1.33], around the usual clip range [0.8, 1.2].
_MAPS = (
    ColourMap("logprob", "log-prob", "the log-probability of each sampled token under the policy that sampled it "
              "(log π_beh); −8 and below are drawn alike", "logprob", _sum, -8.0, 0.0,
              ((-8.0, "≤ −8"), (-6.0, "−6"), (-4.0, "−4"), (-2.0, "−2"), (0.0, "0")), strong="lo"),
    ColourMap("prob", "probability", "the probability p = exp(log π_beh) of each sampled token", "logprob", _sum,
              0.0, 1.0, ((0.0, "0"), (0.25, "0.25"), (0.5, "0.5"), (0.75, "0.75"), (1.0, "1")), strong="lo",
              transform=np.exp),
    ColourMap("entropy", "entropy", "the entropy of the policy's distribution at each token when the step "
              "trained it (nats); 6 and above are drawn alike", "entropy", _nanmax, 0.0, 6.0,
              ((0.0, "0"), (2.0, "2"), (4.0, "4"), (6.0, "≥ 6 nats")), rgb=(124, 58, 237), signals=True),
    ColourMap("advantage", "advantage", "the advantage the step's loss gave each token (blue positive, red "
              "negative); beyond ±2 drawn alike; blank where the loss gave none", "advantage", _nanmean, -2.0, 2.0,
              ((-2.0, "≤ −2"), (-1.0, "−1"), (0.0, "0"), (1.0, "1"), (2.0, "≥ 2")), kind="diverging",
              rgb=(37, 99, 235), signals=True),
    ColourMap("ratio", "ratio", "the importance ratio π_θ/π_old that entered the step's clip (blue above 1, red "
              "below; a log scale), beyond [0.75, 1.33] drawn alike", "log_ratio", _furthest, -_LN_4_3, _LN_4_3,
              ((-_LN_4_3, "0.75"), (math.log(0.8), "0.8"), (0.0, "1"), (math.log(1.2), "1.2"), (_LN_4_3, "1.33")),
              kind="diverging", rgb=(37, 99, 235), signals=True),
    ColourMap("clipped", "clipped", "the tokens whose gradient the step's clip removed", "clipped", _nanmax,
              0.0, 1.0, ((0.25, "not clipped"), (0.75, "clipped")), kind="flag", rgb=(234, 88, 12), signals=True),
)
COLOUR_MAPS: dict[str, ColourMap] = {m.name: m for m in _MAPS}
#: What the page shades by without ``?color=``.
DEFAULT_COLOUR = "logprob"


def colour_map(name: str | None) -> ColourMap:
    """The colour map ``?color=`` names (the default when empty).

    Raises:
        BadFilter: an unknown name (a 400 page naming the parameter and the choices).
    """
    if name in (None, ""):
        return COLOUR_MAPS[DEFAULT_COLOUR]
    found = COLOUR_MAPS.get(name)
    if found is None:
        raise BadFilter(f"'color': {name[:80]!r} is not a colour map; choose one of {', '.join(COLOUR_MAPS)}")
    return found


# ---------------------------------------------------------------------- pieces: what the page draws


class Piece(NamedTuple):
    """What the page draws as one span: a token, or a run of byte-level tokens decoded together;
    ``cls`` its CSS classes (``nomask``: a token out of the loss mask; ``joined``: a run)."""

    tokens: tuple[Token, ...]
    text: str
    background: str
    cls: str

    @property
    def index(self) -> int:
        return self.tokens[0].index

    @property
    def indices(self) -> list[int]:
        return [t.index for t in self.tokens]

    @property
    def in_loss(self) -> bool:
        return all(t.in_loss for t in self.tokens)

    @property
    def title(self) -> str:
        if len(self.tokens) == 1:
            return self.tokens[0].title
        return (f"tokens {self.tokens[0].index}–{self.tokens[-1].index}, decoded together (each alone is part "
                "of a character):\n" + "\n".join(t.title for t in self.tokens))


def _byte_table(tok: Any, ids: list[int]) -> dict[int, bytes] | None:
    """Each of ``ids``' bytes, for a byte-level BPE tokenizer (GPT-2's ``ByteLevel``: SmolLM2's,
    Llama 3's, Qwen's), from its token strings through the byte-to-character table of GPT-2; None
    for any other tokenizer (its pieces are then decoded by the tokenizer itself)."""
    decoder = getattr(getattr(tok, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ != "ByteLevel":
        return None
    try:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        back = {c: b for b, c in bytes_to_unicode().items()}
        table = {}
        for i, piece in zip(ids, tok.convert_ids_to_tokens(ids)):
            if piece is None or any(c not in back for c in piece):
                return None  # an added or special token: not bytes of the table
            table[i] = bytes(back[c] for c in piece)
        return table
    except Exception:  # another transformers, a tokenizer of its own kind: decode instead
        return None


def _run_ends(tok: Any, toks: Sequence[Token]) -> Callable[[int], tuple[int, str]]:
    """``run(i) -> (j, text)``: the piece that starts at fragment token ``i`` ends before ``j``,
    and reads ``text``: tokens are added while the text is not whole (its bytes are not complete
    UTF-8), the next token is a fragment too and the piece holds fewer than :data:`MAX_JOINED`.
    From the tokens' bytes where the tokenizer is byte-level (each distinct id looked up once, a
    piece in microseconds), else through ``tok.decode``."""
    n = len(toks)

    def more(i: int, j: int) -> bool:
        return j < n and j - i < MAX_JOINED and REPLACEMENT in toks[j].text

    table = _byte_table(tok, sorted({t.id for t in toks if REPLACEMENT in t.text}))
    if table is not None:
        def run(i: int) -> tuple[int, str]:
            data, j = table[toks[i].id], i + 1
            while True:
                try:
                    return j, data.decode("utf-8")  # whole
                except UnicodeDecodeError:
                    if not more(i, j):
                        return j, data.decode("utf-8", "replace")
                data, j = data + table[toks[j].id], j + 1
        return run

    def decoded(i: int) -> tuple[int, str]:
        j, text = i + 1, toks[i].text
        while REPLACEMENT in text and more(i, j):
            j += 1
            text = tok.decode([t.id for t in toks[i:j]], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return j, text
    return decoded


def pieces(tok: Any | None, toks: Sequence[Token], colour: ColourMap) -> list[Piece]:
    """The tokens as the page draws them, shaded by ``colour``: each token alone, except a run of
    tokens that alone decode to U+FFFD (parts of a character's bytes), which is decoded together,
    from its first token until the text is whole (or the run of such tokens ends, or
    :data:`MAX_JOINED` tokens). Linear: each token is in one piece, and a piece of ``k`` tokens
    costs at most ``k`` decodes of at most ``k`` tokens; the colours are computed for all pieces
    at once."""
    spans: list[tuple[int, int, str]] = []
    run_end = _run_ends(tok, toks) if tok is not None and any(REPLACEMENT in t.text for t in toks) else None
    i, n = 0, len(toks)
    while i < n:
        j, text = (i + 1, toks[i].text) if run_end is None or REPLACEMENT not in toks[i].text else run_end(i)
        spans.append((i, j, text))
        i = j
    field = colour.field
    if colour.transform is None and all(j - i == 1 for i, j, _ in spans):  # the common case: a token a piece
        values = [getattr(t, field) for t in toks]
        values = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
    else:
        values = np.array([colour.value(toks[i:j]) for i, j, _ in spans], dtype=np.float64)
    shades = colour.backgrounds(values)
    out = []
    for (i, j, text), bg in zip(spans, shades):
        if j - i == 1:
            t = toks[i]
            out.append(Piece((t,), text, bg, "tok" if t.in_loss else "tok nomask"))
        else:
            run = tuple(toks[i:j])
            out.append(Piece(run, text, bg, ("tok joined" if all(t.in_loss for t in run) else "tok nomask joined")))
    return out


def piece_marks(drawn: Sequence[Piece], marks: dict[int, list]) -> dict[int, list]:
    """``marks`` (token index -> marks) by the first token of the piece that draws each token: a
    mark on a later token of a run decoded together goes before the run."""
    if not marks:
        return {}
    out: dict[int, list] = {}
    for p in drawn:
        found = [m for t in p.tokens for m in marks.get(t.index, ())]
        if found:
            out[p.index] = found
    return out


__all__ = ["COLOUR_MAPS", "DEFAULT_COLOUR", "MAX_JOINED", "MAX_SHADED", "ColourMap", "Piece", "Token", "colour_map",
           "masked_out", "piece_marks", "pieces", "shown", "tokenizer_for", "tokens", "texts"]
