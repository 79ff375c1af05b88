"""Curves as server-rendered SVG: a small line-chart renderer and the run page's charts.

No JavaScript, no chart library: :func:`line_chart` writes one ``<svg>`` element (axes, ticks,
a polyline per series, a legend) that the page inlines, so it passes the explorer's
Content-Security-Policy as it is. Every text in it (a metric's name is whatever a method or a
script recorded) is escaped for XML, and characters XML cannot hold are replaced, so the element
is well-formed whatever the names are.

Values that are not finite (NaN, ±inf, a JSON number too large for a float) are not drawn: the
line breaks there and the chart says how many were left out. A curve has at most
:data:`MAX_POINTS` points: longer ones are cut into buckets of consecutive points, each kept as its
smallest and its largest value in step order (min-max decimation), so a spike stays visible.

:func:`run_charts` turns a run's learner steps (``learner_steps.metrics``) and held-out evaluations
into the charts the run page shows (docs/explorer.md, "Curves"), for one run or several on the same
axes. It knows the metrics every learner records (``reward/``, ``loss/``, ``staleness/``,
``perf/tokens_per_s``); every other numeric key gets a chart per prefix (the text before its first
``/``), so a method's own metrics are drawn without the explorer naming any method.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from html import escape
from typing import Any

import numpy as np

#: the most points a curve is drawn with (longer curves are decimated)
MAX_POINTS = 1000
#: the most series one chart draws (the rest are named in a note)
MAX_SERIES = 12
#: the most charts of metric prefixes a run page shows
MAX_PREFIX_CHARTS = 24
#: values beyond this magnitude are not drawn (their scale would swamp every other value)
MAX_ABS = 1e300
#: a series drawn with this many points or fewer gets a marker per point, each with its value as a tooltip
MARKERS_UP_TO = 60

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
           "#bab0ac")
DASHES = ("", "6 3", "2 3", "9 3 2 3")

WIDTH = 460
PLOT_H = 150
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM = 58, 14, 26, 46
LEGEND_ROW = 15
LABEL_CHARS = 30

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def text(value: Any, limit: int | None = None) -> str:
    """``value`` as text for an SVG element or attribute: cut to ``limit`` characters (an ellipsis
    marks the cut), characters XML 1.0 cannot hold replaced by U+FFFD, then escaped."""
    s = str(value)
    if limit is not None and len(s) > limit:
        s = s[:limit - 1] + "…"
    return escape(_NOT_XML.sub("\ufffd", s), quote=True)


def number(value: Any) -> float | None:
    """A metric's value as a float, or None where it is not a number (text, a boolean, null, a list).
    A number too large for a float comes back as inf (:func:`drawable` tells)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):  # Decimal: PostgreSQL's numeric
        return None
    try:
        return float(value)
    except (OverflowError, ValueError):
        return math.inf


def drawable(y: float | None) -> bool:
    return y is not None and math.isfinite(y) and abs(y) <= MAX_ABS


def _drawable(y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(y) & (np.abs(y) <= MAX_ABS)


class Series:
    """One curve: ``points`` (x, y) in x order, or the arrays ``x`` and ``y``; a y of None or one
    not :func:`drawable` is a gap. ``color`` and ``dash`` index :data:`PALETTE` and :data:`DASHES`
    (None: by position)."""

    def __init__(self, name: str, points: Sequence[tuple[float, float | None]] = (), *, x: np.ndarray | None = None,
                 y: np.ndarray | None = None, color: int | None = None, dash: int = 0):
        if x is None or y is None:
            x = np.array([p[0] for p in points], dtype=np.float64)
            y = np.array([np.nan if p[1] is None else p[1] for p in points], dtype=np.float64)
        self.name, self.x, self.y, self.color, self.dash = str(name), x, y, color, dash


# ---------------------------------------------------------------------- decimation


def decimate(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` of the points (``x`` in order, ``y`` NaN where not drawable): the first
    and the last, and between them each bucket of consecutive points as its smallest and largest
    values, in x order (one point if they are the same, a gap (NaN) if it has none). Fewer points
    come back as they are."""
    n = len(x)
    if n <= max_points:
        return x, y
    ix, iy = x[1:-1], y[1:-1]
    m = len(ix)
    k = math.ceil(m / max(1, (max_points - 2) // 2))  # points per bucket
    b = math.ceil(m / k)
    grid = np.full(b * k, np.nan)
    grid[:m] = iy
    grid = grid.reshape(b, k)
    empty = np.isnan(grid).all(axis=1)
    lo = np.where(np.isnan(grid), np.inf, grid).argmin(axis=1)
    hi = np.where(np.isnan(grid), -np.inf, grid).argmax(axis=1)
    first, second = np.minimum(lo, hi), np.maximum(lo, hi)
    base = np.arange(b) * k
    pick = np.stack([base + first, base + second], axis=1)
    keep = np.ones((b, 2), dtype=bool)
    keep[:, 1] = (first != second) & ~empty
    at = pick[keep]  # row-major: bucket by bucket, in x order (an empty bucket: its first point, a NaN)
    return (np.concatenate([x[:1], ix[at], x[-1:]]), np.concatenate([y[:1], iy[at], y[-1:]]))


# ---------------------------------------------------------------------- scales and ticks


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering ``[lo, hi]``."""
    span = hi - lo
    if not math.isfinite(span) or span <= 0:
        return [lo]
    raw = span / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, i = [], 0
    while True:
        t = first + i * step
        if t > hi + step * 1e-9:
            break
        if t >= lo - step * 1e-9:
            ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        i += 1
        if i > 50:
            break
    return ticks


def tick_label(value: float, step: float | None = None) -> str:
    """A tick's number: plain with the decimals its spacing needs (``0.25``, ``1500``), in
    exponent form past 10⁶ or below 10⁻⁴ with the significant digits it needs (``-3.2e-6``)."""
    good_step = bool(step and step > 0 and math.isfinite(step))
    if value == 0 and not good_step:
        return "0"
    if value == 0 or 1e-4 <= abs(value) < 1e6:
        decimals = 0
        if good_step:
            while decimals < 10 and abs(round(step, decimals) - step) > step * 1e-6:  # type: ignore[arg-type]
                decimals += 1
        else:
            decimals = max(0, 3 - math.floor(math.log10(abs(value))))
        out = f"{value:.{decimals}f}"
        return out[1:] if out.startswith("-") and not out.strip("-0.") else out  # no "-0.0"
    digits = 3
    if good_step:
        digits = max(1, min(12, math.floor(math.log10(abs(value))) - math.floor(math.log10(step)) + 1))  # type: ignore[arg-type]
    mantissa, _, exp = f"{value:.{digits - 1}e}".partition("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exp)}"


def value_label(value: float | None) -> str:
    """A value for a tooltip: 4 significant digits, ``nan``/``inf`` as such."""
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _bounds(values: np.ndarray, nice: bool = False) -> tuple[float, float] | None:
    """The range of ``values`` (widened when they are all equal); ``nice``: out to round ticks."""
    if not len(values):
        return None
    lo, hi = float(values.min()), float(values.max())
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    if nice:
        ticks = nice_ticks(lo, hi)
        if len(ticks) > 1:
            step = ticks[1] - ticks[0]
            wide = (math.floor(lo / step) * step, math.ceil(hi / step) * step)
            if all(math.isfinite(w) and abs(w) <= 2 * MAX_ABS for w in wide):
                lo, hi = wide
    return lo, hi


# ---------------------------------------------------------------------- the chart


def line_chart(title: str, series: Sequence[Series], *, x_label: str = "step", max_points: int = MAX_POINTS,
               chart_id: str | None = None, width: int = WIDTH, integer_x: bool = True) -> str:
    """One line chart as an ``<svg>`` element (text, well-formed XML, every name escaped).

    Each series is decimated to ``max_points``; values that are not :func:`drawable` break its line
    and are counted in a note. At most :data:`MAX_SERIES` series are drawn, the others named in a
    note. A chart without a drawable value says so instead of drawing axes.
    """
    shown = list(series)[:MAX_SERIES]
    hidden = len(series) - len(shown)
    curves = []
    left_out = 0
    for i, s in enumerate(shown):
        ok = _drawable(s.y)
        left_out += int(len(ok) - ok.sum())
        x, y = decimate(s.x, np.where(ok, s.y, np.nan), max_points)
        curves.append((s, x, y, i))
    xs = np.concatenate([x[~np.isnan(y)] for _, x, y, _ in curves] or [np.empty(0)])
    ys = np.concatenate([y[~np.isnan(y)] for _, _, y, _ in curves] or [np.empty(0)])
    legend_rows = math.ceil(len(curves) / 2) if curves else 0
    plot_w = width - M_LEFT - M_RIGHT
    notes = []
    if left_out:
        notes.append(f"{left_out} value{'s' if left_out != 1 else ''} not drawn (not a finite number, or beyond ±1e300)")
    if hidden:
        notes.append(f"{hidden} more series not drawn: {', '.join(s.name for s in list(series)[MAX_SERIES:MAX_SERIES + 3])}"
                     + ("…" if hidden > 3 else ""))
    height = M_TOP + PLOT_H + M_BOTTOM + legend_rows * LEGEND_ROW + len(notes) * LEGEND_ROW + 6
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" font-family="system-ui, sans-serif" font-size="11"'
           + (f' id="{text(chart_id)}"' if chart_id else "") + ">",
           f"<title>{text(title, 300)}</title>",
           f'<text class="chart-title" x="{M_LEFT}" y="15" font-size="12.5" font-weight="600" fill="#1f2328">'
           f"{text(title, 70)}</text>"]
    xb, yb = _bounds(xs[np.isfinite(xs)]), _bounds(ys, nice=True)
    if xb is None or yb is None:
        out.append(f'<rect x="{M_LEFT}" y="{M_TOP}" width="{plot_w}" height="{PLOT_H}" fill="#f6f8fa" stroke="#d1d9e0"/>')
        out.append(f'<text class="empty" x="{M_LEFT + plot_w / 2:.1f}" y="{M_TOP + PLOT_H / 2:.1f}" '
                   f'text-anchor="middle" fill="#59636e">no value recorded</text>')
    else:
        out += _axes(xb, yb, plot_w, x_label, integer_x)
        sx = _scale(xb, M_LEFT, M_LEFT + plot_w)
        sy = _scale(yb, M_TOP + PLOT_H, M_TOP)
        for s, x, y, i in curves:
            out += _curve(s, x, y, i, sx, sy, x_label)
    y = M_TOP + PLOT_H + M_BOTTOM
    for k, (s, _, _, i) in enumerate(curves):
        col, row = k % 2, k // 2
        lx, ly = M_LEFT - 40 + col * (width - M_LEFT + 40) / 2, y + row * LEGEND_ROW
        color, dash = _style(s, i)
        ok = np.flatnonzero(_drawable(s.y))
        last = float(s.y[ok[-1]]) if len(ok) else None
        out.append(f'<g class="legend-item"><title>{text(s.name, 300)}: last {value_label(last)}</title>'
                   f'<line x1="{lx:.1f}" y1="{ly - 4:.1f}" x2="{lx + 22:.1f}" y2="{ly - 4:.1f}" stroke="{color}" '
                   f'stroke-width="2.5"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>"
                   f'<text x="{lx + 28:.1f}" y="{ly:.1f}" fill="#1f2328">{text(s.name, LABEL_CHARS)}</text></g>')
    y += legend_rows * LEGEND_ROW
    for note in notes:
        out.append(f'<text class="note" x="{M_LEFT - 40}" y="{y:.1f}" fill="#59636e">{text(note, 110)}</text>')
        y += LEGEND_ROW
    out.append("</svg>")
    return "".join(out)


def _style(s: Series, i: int) -> tuple[str, str]:
    return PALETTE[(i if s.color is None else s.color) % len(PALETTE)], DASHES[s.dash % len(DASHES)]


def _scale(bounds: tuple[float, float], a: float, b: float):
    lo, hi = bounds
    # halves first: hi - lo may overflow where both are near the float limit
    span = hi / 2 - lo / 2

    def f(v: float) -> float:
        return a + (v / 2 - lo / 2) / span * (b - a)

    return f


def _axes(xb: tuple[float, float], yb: tuple[float, float], plot_w: float, x_label: str, integer_x: bool) -> list[str]:
    out = [f'<rect x="{M_LEFT}" y="{M_TOP}" width="{plot_w}" height="{PLOT_H}" fill="#ffffff" stroke="#d1d9e0"/>']
    sx = _scale(xb, M_LEFT, M_LEFT + plot_w)
    sy = _scale(yb, M_TOP + PLOT_H, M_TOP)
    yt = nice_ticks(*yb)
    ystep = yt[1] - yt[0] if len(yt) > 1 else None
    for t in yt:
        y = sy(t)
        out.append(f'<line class="grid" x1="{M_LEFT}" y1="{y:.1f}" x2="{M_LEFT + plot_w}" y2="{y:.1f}" stroke="#eaeef2"/>'
                   f'<text class="ytick" x="{M_LEFT - 5}" y="{y + 3.5:.1f}" text-anchor="end" fill="#59636e">'
                   f"{text(tick_label(t, ystep))}</text>")
    xt = nice_ticks(*xb, count=6)
    if integer_x:
        xt = sorted({round(t) for t in xt if abs(t - round(t)) < 1e-9 and xb[0] <= round(t) <= xb[1]}) or [round(xb[0])]
    xstep = xt[1] - xt[0] if len(xt) > 1 else None
    for t in xt:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{M_TOP + PLOT_H}" x2="{x:.1f}" y2="{M_TOP + PLOT_H + 4}" stroke="#8c959f"/>'
                   f'<text class="xtick" x="{x:.1f}" y="{M_TOP + PLOT_H + 15}" text-anchor="middle" fill="#59636e">'
                   f"{text(str(t) if integer_x else tick_label(t, xstep))}</text>")
    out.append(f'<text class="xlabel" x="{M_LEFT + plot_w / 2:.1f}" y="{M_TOP + PLOT_H + 29}" text-anchor="middle" '
               f'fill="#59636e">{text(x_label, 40)}</text>')
    return out


def _curve(s: Series, x: np.ndarray, y: np.ndarray, i: int, sx, sy, x_label: str) -> list[str]:
    """A series' polylines (one per run of drawable points), and a marker per point when it has few."""
    color, dash = _style(s, i)
    at = np.flatnonzero(~np.isnan(y) & np.isfinite(x))
    runs = np.split(at, np.flatnonzero(np.diff(at) > 1) + 1) if len(at) else []
    px, py = sx(x).tolist(), sy(y).tolist()
    out = [f'<g class="series" data-name="{text(s.name, 200)}" data-points="{len(at)}">'
           f"<title>{text(s.name, 300)}</title>"]
    for run in runs:
        if len(run) > 1:
            coords = " ".join(f"{px[j]:.1f},{py[j]:.1f}" for j in run.tolist())
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6" '
                       f'stroke-linejoin="round"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    if len(at) <= MARKERS_UP_TO:
        for j in at.tolist():
            out.append(f'<circle cx="{px[j]:.1f}" cy="{py[j]:.1f}" r="2.6" fill="{color}">'
                       f"<title>{text(s.name, 120)}: {text(x_label)} {text(value_label(float(x[j])))}, "
                       f"{text(value_label(float(y[j])))}</title></circle>")
    else:  # a lone point between gaps would not show as a line
        for run in runs:
            if len(run) == 1:
                j = int(run[0])
                out.append(f'<circle cx="{px[j]:.1f}" cy="{py[j]:.1f}" r="2" fill="{color}"/>')
    out.append("</g>")
    return out


# ---------------------------------------------------------------------- the run page's charts


@dataclass
class Chart:
    """A chart of the run page: its anchor, title and SVG (and the metric keys it draws)."""

    id: str
    title: str
    svg: str
    keys: list[str] = field(default_factory=list)
    #: "main": the charts every run has (FIXED and the evaluations); "prefix": a metric prefix's own
    kind: str = "main"


@dataclass
class RunCurves:
    """What :func:`run_charts` reads of one run: its name, its learner steps (``step``, ``loss``,
    ``metrics``; oldest first) and its held-out evaluations (``policy_version``, ``attempts``,
    ``pass_at_1``)."""

    name: str
    steps: list[Mapping[str, Any]]
    evaluations: list[Mapping[str, Any]] = field(default_factory=list)


#: the charts every learner's metrics fill: (id, title, keys or a key prefix ending in "/")
FIXED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "mean reward per step", ("reward/mean",)),
    ("pass-at-1", "pass@1 per step (the policy's own samples)", ("reward/pass_at_1",)),
    ("loss", "loss and its terms", ("loss", "loss/")),
    ("staleness", "staleness (policy versions behind the learner)", ("staleness/",)),
    ("tokens-per-s", "learner tokens/s per step", ("perf/tokens_per_s",)),
)


_JSON = json.JSONDecoder(parse_int=float)


def _load(metrics: Any) -> Any:
    """A step's metrics as stored: JSON text parsed (integers as floats, so a 5,000-digit one is
    inf rather than Python's refusal), a mapping as it is; anything unreadable as nothing."""
    if isinstance(metrics, str):
        try:
            return _JSON.raw_decode(metrics)[0]
        except (ValueError, RecursionError):
            return None
    return metrics


def _columns(steps: Sequence[Mapping[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each numeric metric of a run's steps (``loss`` from its column) as arrays: the steps that
    hold it and its values (NaN for a NULL loss). Text, booleans, nulls and objects are left out."""
    x = np.array([row["step"] for row in steps], dtype=np.float64)
    dicts = [m if isinstance(m := _load(row.get("metrics")), Mapping) else {} for row in steps]
    keys: dict[str, None] = {}
    for d in dicts:
        keys.update(dict.fromkeys(d))
    cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for k in keys:
        has = np.array([k in d for d in dicts], dtype=bool)
        vals = [d[k] for d in dicts if k in d]
        if not all(type(v) is float for v in vals):  # the common case above: one C loop
            nums = [number(v) for v in vals]
            has[has] = [f is not None for f in nums]
            vals = [f for f in nums if f is not None]
        if vals:
            cols[str(k)] = (x[has], np.array(vals, dtype=np.float64))
    if steps and "loss" in steps[0]:
        cols["loss"] = (x, np.array([math.nan if (f := number(row["loss"])) is None else f for row in steps],
                                    dtype=np.float64))
    return cols


def _claims(key: str, spec: tuple[str, ...]) -> bool:
    return any(key == s or (s.endswith("/") and key.startswith(s)) for s in spec)


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:40] or "other"


def run_charts(runs: Sequence[RunCurves], max_points: int = MAX_POINTS) -> list[Chart]:
    """The run page's charts for ``runs`` (one run, or several drawn on the same axes): the fixed
    charts of :data:`FIXED`, held-out pass@1 by policy version, then one chart per prefix of every
    other numeric metric (the text before the first ``/``; keys without one under ``other``)."""
    per_run = [(r, _columns(r.steps)) for r in runs]
    names = sorted({k for _, cols in per_run for k in cols})
    several = len(runs) > 1
    charts: list[Chart] = []

    def series_for(chart_keys: list[str]) -> list[Series]:
        out: list[Series] = []
        for ri, (r, cols) in enumerate(per_run):
            for ki, k in enumerate(chart_keys):
                if k not in cols:
                    continue
                if several and len(chart_keys) == 1:
                    color, dash = ri, 0
                else:
                    color, dash = ki, ri
                label = f"{r.name} · {k}" if several else k
                out.append(Series(label, x=cols[k][0], y=cols[k][1], color=color, dash=dash))
        return out

    claimed: set[str] = set()
    for cid, title, spec in FIXED:
        ks = [k for k in names if _claims(k, spec)]
        if spec[0] == "loss":  # the column first, then its terms
            ks.sort(key=lambda k: (k != "loss", k))
        claimed.update(ks)
        charts.append(Chart(cid, title, line_chart(title, series_for(ks), max_points=max_points, chart_id=f"chart-{cid}"),
                            ks))
        if cid == "pass-at-1":
            charts.append(_evaluations(runs, max_points))
    prefixes: dict[str, list[str]] = {}
    for k in names:
        if k not in claimed:
            prefixes.setdefault(k.split("/", 1)[0] if "/" in k else "", []).append(k)
    for i, (prefix, ks) in enumerate(sorted(prefixes.items(), key=lambda kv: (kv[0] == "", kv[0]))):
        if i >= MAX_PREFIX_CHARTS:
            break
        title = f"{prefix}/*" if prefix else "other metrics"
        cid = f"metrics-{_slug(prefix)}-{i}"
        charts.append(Chart(cid, title, line_chart(title, series_for(ks), max_points=max_points,
                                                   chart_id=f"chart-{cid}"), ks, kind="prefix"))
    return charts


def _evaluations(runs: Sequence[RunCurves], max_points: int) -> Chart:
    title = "held-out pass@1 by policy version"
    several = len(runs) > 1
    series: list[Series] = []
    for ri, r in enumerate(runs):
        by_attempts: dict[int, list[tuple[float, float | None]]] = {}
        for e in r.evaluations:
            by_attempts.setdefault(int(e.get("attempts") or 1), []).append(
                (float(e["policy_version"]), number(e.get("pass_at_1"))))
        for ai, (attempts, pts) in enumerate(sorted(by_attempts.items())):
            what = "pass@1" if attempts == 1 else f"solved within {attempts} attempts"
            series.append(Series(f"{r.name} · {what}" if several else what, sorted(pts, key=lambda p: p[0]),
                                 color=ri if several else ai, dash=ai if several else 0))
    return Chart("evaluations", title, line_chart(title, series, x_label="policy version", max_points=max_points,
                                                  chart_id="chart-evaluations"), ["evaluations"])


class ChartCache:
    """The charts last drawn, by what they were drawn from (a key the caller makes of its runs' marks):
    at most ``size`` entries, each kept for ``ttl`` seconds; safe across the server's threads."""

    def __init__(self, size: int = 16, ttl: float = 60.0, clock: Any = None):
        import threading
        import time

        self.size, self.ttl, self.clock = size, ttl, clock or time.monotonic
        self._items: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._items.pop(key, None)
            if hit is None or self.clock() - hit[0] > self.ttl:
                return None
            self._items[key] = hit  # the newest use last
            return hit[1]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = (self.clock(), value)
            while len(self._items) > self.size:
                del self._items[next(iter(self._items))]


__all__ = ["MAX_POINTS", "Chart", "ChartCache", "RunCurves", "Series", "decimate", "line_chart", "nice_ticks", "run_charts",
           "text", "tick_label"]
