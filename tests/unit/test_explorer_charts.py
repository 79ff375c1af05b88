"""The explorer's SVG line charts (explorer/charts.py): well-formed XML whatever the names, axes
with round ticks, min-max decimation to a bounded number of points, non-finite and huge values
left out and counted, empty charts, and the run page's charts built from learner steps."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from decimal import Decimal

import numpy as np
import pytest

from reflexdb.explorer.charts import (MAX_POINTS, MAX_SERIES, ChartCache, RunCurves, Series, decimate, line_chart, nice_ticks,
                                      number, run_charts, tick_label)

NS = "{http://www.w3.org/2000/svg}"
SCRIPT = '<script>alert("x")</script>'
HOSTILE_PREFIX = "<img src=x onerror=alert(1)>"


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything not well-formed
    assert root.tag == f"{NS}svg"
    return root


def _texts(root: ET.Element, cls: str | None = None) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text") if cls is None or t.get("class") == cls]


def _polylines(root: ET.Element) -> list[list[tuple[float, float]]]:
    return [[tuple(map(float, p.split(","))) for p in line.get("points").split()]
            for line in root.iter(f"{NS}polyline")]


def test_a_chart_has_axes_ticks_a_legend_and_a_line_per_series():
    root = _parse(line_chart("reward", [Series("reward/mean", [(float(s), s / 10) for s in range(1, 101)]),
                                        Series("reward/max", [(float(s), 1.0) for s in range(1, 101)])]))
    assert _texts(root, "chart-title") == ["reward"]
    yticks = _texts(root, "ytick")
    assert yticks == ["0.0", "2.5", "5.0", "7.5", "10.0"]
    xticks = [int(t) for t in _texts(root, "xtick")]
    assert xticks[0] >= 1 and xticks[-1] <= 100 and len(xticks) >= 3
    assert _texts(root, "xlabel") == ["step"]
    legend = [g for g in root.iter(f"{NS}g") if g.get("class") == "legend-item"]
    assert ["".join(t.itertext()) for g in legend for t in g.iter(f"{NS}text")] == ["reward/mean", "reward/max"]
    lines = _polylines(root)
    assert len(lines) == 2 and all(len(line) == 100 for line in lines)
    # y grows upwards: the larger value is higher on the page
    first, last = lines[0][0], lines[0][-1]
    assert last[0] > first[0] and last[1] < first[1]
    # every point inside the plot
    rect = next(root.iter(f"{NS}rect"))
    x0, y0 = float(rect.get("x")), float(rect.get("y"))
    x1, y1 = x0 + float(rect.get("width")), y0 + float(rect.get("height"))
    assert all(x0 - 0.05 <= x <= x1 + 0.05 and y0 - 0.05 <= y <= y1 + 0.05 for line in lines for x, y in line)


def test_markup_in_names_and_titles_is_text():
    evil = SCRIPT + '&amp; "quoted" \x00\x01 \ud800 end'
    svg = line_chart(evil, [Series(evil, [(1.0, 1.0), (2.0, 2.0)])], x_label=evil, chart_id='x" onload="alert(1)')
    assert "<script>" not in svg and 'onload="' not in svg
    root = _parse(svg)
    assert root.get("id") == 'x" onload="alert(1)'
    assert all(not e.tag.endswith("script") for e in root.iter())
    shown = "".join(_texts(root))
    assert '<script>alert("x")</script>&amp; "quoted"' in shown
    # characters XML cannot hold are replaced, not passed through
    assert "\x00" not in svg and "\ufffd\ufffd" in svg
    [series] = [g for g in root.iter(f"{NS}g") if g.get("class") == "series"]
    assert series.get("data-name").startswith(SCRIPT)


def test_non_finite_and_huge_values_break_the_line_and_are_counted():
    pts = [(1.0, 1.0), (2.0, 2.0), (3.0, math.nan), (4.0, 3.0), (5.0, 4.0), (6.0, math.inf), (7.0, -math.inf),
           (8.0, 1e301), (9.0, None), (10.0, 5.0), (11.0, 6.0)]
    root = _parse(line_chart("odd", [Series("v", pts)]))
    lines = _polylines(root)
    assert [len(line) for line in lines] == [2, 2, 2]
    assert "5 values not drawn" in " ".join(_texts(root, "note"))
    # the scale is that of the drawable values: 1e301 did not flatten them
    ys = [y for line in lines for _, y in line]
    assert max(ys) - min(ys) > 50


def test_values_near_the_float_limit_are_drawn_without_overflow():
    root = _parse(line_chart("big", [Series("v", [(1.0, -1e300), (2.0, 1e300), (3.0, 0.0)])]))
    [line] = _polylines(root)
    assert len(line) == 3 and all(math.isfinite(c) for p in line for c in p)


def test_an_empty_chart_says_so():
    for series in ([], [Series("v", [])], [Series("v", [(1.0, math.nan), (2.0, None)])]):
        root = _parse(line_chart("nothing", series))
        assert "no value recorded" in _texts(root, "empty")
        assert not _polylines(root)


def test_a_single_point_and_a_constant_series_are_visible():
    root = _parse(line_chart("one", [Series("v", [(5.0, 0.5)])]))
    [circle] = root.iter(f"{NS}circle")
    assert circle.find(f"{NS}title").text == "v: step 5, 0.5"
    assert _texts(root, "xtick") == ["5"]
    root = _parse(line_chart("flat", [Series("v", [(float(i), 2.0) for i in range(100)])]))
    [line] = _polylines(root)
    assert len({y for _, y in line}) == 1  # one height, inside the plot (the range was widened)


def test_decimation_bounds_the_points_and_keeps_the_extremes():
    x = np.arange(1_000_000, dtype=np.float64)
    y = np.sin(x / 500)
    y[123_457] = 10.0
    y[654_321] = -3.0
    dx, dy = decimate(x, y, MAX_POINTS)
    assert len(dx) <= MAX_POINTS and len(dx) == len(dy)
    assert (np.diff(dx) > 0).all()  # in x order, no point twice
    assert dy.max() == 10.0 and dy.min() == -3.0  # the spikes survive
    assert dx[0] == 0 and dx[-1] == 999_999  # the first and the last point too
    assert (y[dx.astype(int)] == dy).all()  # points of the curve only
    assert len(decimate(x[:10], y[:10], MAX_POINTS)[0]) == 10
    # a bucket of nothing drawable is one gap (NaN), not a point
    holes = np.where((np.arange(4000) >= 400) & (np.arange(4000) < 600), np.nan, 1.0)
    hx, hy = decimate(np.arange(4000.0), holes, 100)
    assert len(hx) <= 100 and np.isnan(hy).any() and not np.isnan(hy[:5]).any()
    root = _parse(line_chart("big", [Series("v", x=x, y=y)]))
    [series] = [g for g in root.iter(f"{NS}g") if g.get("class") == "series"]
    assert int(series.get("data-points")) <= MAX_POINTS
    assert len(root.findall(f".//{NS}circle")) == 0  # no per-point markers on a long curve
    lines = _polylines(root)
    assert sum(len(line) for line in lines) <= MAX_POINTS


def test_ticks_are_round_and_labelled_with_the_digits_they_need():
    assert nice_ticks(0, 1) == [0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(0, 1562)[:3] == [0, 500, 1000]
    assert tick_label(1500, 500) == "1500" and tick_label(0.25, 0.25) == "0.25"
    assert tick_label(0.30000000000000004, 0.1) == "0.3"
    assert tick_label(-3.2e-6) == "-3.2e-6" and tick_label(2e7, 1e7) == "2e7" and tick_label(0) == "0"
    root = _parse(line_chart("tiny", [Series("loss/policy", [(1.0, -3.2e-6), (2.0, 1e-6)])]))
    assert all(re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", t) for t in _texts(root, "ytick"))
    assert "-0.0000" not in "".join(_texts(root, "ytick"))


def test_too_many_series_are_named_not_drawn():
    root = _parse(line_chart("many", [Series(f"k{i}", [(1.0, i), (2.0, i)]) for i in range(MAX_SERIES + 5)]))
    assert len(_polylines(root)) == MAX_SERIES
    assert "5 more series not drawn: k12, k13, k14…" in _texts(root, "note")


def test_numbers_from_json_and_sql():
    assert number(1) == 1.0 and number(Decimal("0.5")) == 0.5 and number(True) is None
    assert number("1.0") is None and number(None) is None and number([1]) is None
    assert number(Decimal("1e400")) == math.inf


def test_run_charts_draw_every_metric_once_by_prefix_and_name_no_method():
    steps = [{"step": s, "loss": 0.1 * s, "metrics": {
        "reward/mean": 0.1 * s, "reward/pass_at_1": 0.2, "reward/missing": 0.0, "loss/policy": 0.3,
        "staleness/mean": 1.0, "perf/tokens_per_s": 1000.0, "perf/step_seconds": 2.0, "somemethod/share": 0.5,
        "bare": 1.0, HOSTILE_PREFIX + "/x": 2.0, "label": "text"}} for s in range(1, 4)]
    charts = run_charts([RunCurves("a", steps, [{"policy_version": 0, "attempts": 1, "pass_at_1": Decimal("0.5")}])])
    ids = [c.id for c in charts]
    assert ids[:6] == ["reward", "pass-at-1", "evaluations", "loss", "staleness", "tokens-per-s"]
    drawn = [k for c in charts for k in c.keys if c.id != "evaluations"]
    assert sorted(drawn) == sorted({"loss", *steps[0]["metrics"]} - {"label"})  # each numeric key exactly once
    by_title = {c.title: c for c in charts if c.kind == "prefix"}
    assert set(by_title) == {"perf/*", "reward/*", "somemethod/*", HOSTILE_PREFIX + "/*", "other metrics"}
    assert by_title["other metrics"].keys == ["bare"]
    for c in charts:
        _parse(c.svg)
    # two runs: the same charts, a series per run; one key: a colour per run
    two = run_charts([RunCurves("a", steps), RunCurves("b", steps[:1])])
    reward = _parse(next(c.svg for c in two if c.id == "reward"))
    names = [g.get("data-name") for g in reward.iter(f"{NS}g") if g.get("class") == "series"]
    assert names == ["a · reward/mean", "b · reward/mean"]
    colours = [p.get("fill") for g in reward.iter(f"{NS}g") if g.get("class") == "series" for p in g.iter(f"{NS}circle")]
    assert len(set(colours)) == 2


@pytest.mark.parametrize("metrics", [None, [], "text", {"reward/mean": {"nested": 1}}])
def test_metrics_that_are_not_an_object_of_numbers_draw_nothing(metrics):
    charts = run_charts([RunCurves("a", [{"step": 1, "loss": None, "metrics": metrics}])])
    root = _parse(next(c.svg for c in charts if c.id == "reward"))
    assert "no value recorded" in _texts(root, "empty")


def test_metrics_as_stored_json_text_even_hostile():
    """The page reads metrics as JSON text: integers as floats (a 5,000-digit one is inf, not
    Python's refusal to parse it), nesting too deep or broken text as no metrics."""
    steps = [{"step": 1, "loss": 0.5, "metrics": '{"reward/mean": 0.25, "n": 3}'},
             {"step": 2, "loss": None, "metrics": '{"reward/mean": 1' + "0" * 5000 + ', "n": 4}'},
             {"step": 3, "loss": 0.25, "metrics": "[" * 100_000 + "]" * 100_000},
             {"step": 4, "loss": 0.125, "metrics": "{not json"}]
    charts = {c.id: _parse(c.svg) for c in run_charts([RunCurves("a", steps)])}
    reward = charts["reward"]
    [series] = [g for g in reward.iter(f"{NS}g") if g.get("class") == "series"]
    assert [c.find(f"{NS}title").text for c in series.iter(f"{NS}circle")] == ["reward/mean: step 1, 0.25"]
    assert "1 value not drawn" in " ".join(_texts(reward, "note"))
    other = next(svg for svg in charts.values() if "other metrics" in _texts(svg, "chart-title"))
    assert [c.find(f"{NS}title").text for c in other.iter(f"{NS}circle")] == ["n: step 1, 3", "n: step 2, 4"]


def test_the_chart_cache_keeps_the_newest_for_a_while():
    now = [0.0]
    cache = ChartCache(size=2, ttl=60, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the newest used
    cache.put("c", 3)  # b goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    now[0] = 61.0
    assert cache.get("a") is None and cache.get("c") is None
