"""Prometheus range queries as metric points: the query and its answer, without the HTTP.

One selector fetches every mapped metric (``{__name__=~"a|b|..."}``) at a fixed step; times are
aligned to the step, so that a re-read asks for the same instants again; a long range is cut
into chunks under Prometheus' 11,000 points per series; an answer becomes the points of each
instant. Ingest's ``prometheus`` source and ``fracpilot recommend`` both read Prometheus through
these.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from fracpilot_libs.usage.attribution import MetricPoint

log = logging.getLogger(__name__)
MAX_POINTS_PER_QUERY = 10_000


def selector(metric_names: Sequence[str], matchers: str = "") -> str:
    """One PromQL selector for every mapped metric, plus optional label matchers."""
    names = "|".join(re.escape(n) for n in metric_names)
    # Inside a PromQL double-quoted string a backslash starts an escape, and `\.` is a parse
    # error: the regex's backslashes (and any quote) are escaped once more.
    names = names.replace("\\", "\\\\").replace('"', '\\"')
    extra = f", {matchers.strip()}" if matchers.strip() else ""
    return f'{{__name__=~"{names}"{extra}}}'


def gpu_selector(
    metric_names: Sequence[str], matchers: str, gpu_labels: Sequence[str], uuid_regex: str
) -> str:
    """:func:`selector` for the series of the GPUs whose UUID matches ``uuid_regex``, and the
    series naming no GPU (an application's, joined to its pod's GPU later). A series' GPU is
    its first of ``gpu_labels`` that is set, so one selector per label, each with the labels
    before it empty, and one with all of them empty, joined by ``or`` (the parts are disjoint:
    ``or`` keeps each series whole, its name too)."""
    base = [matchers.strip()] if matchers.strip() else []
    parts = []
    for i, label in enumerate(gpu_labels):
        unset = [f'{name}=""' for name in gpu_labels[:i]]
        parts.append(selector(metric_names, ", ".join([*base, *unset, f'{label}=~"{uuid_regex}"'])))
    parts.append(selector(metric_names, ", ".join([*base, *(f'{n}=""' for n in gpu_labels)])))
    return " or ".join(parts)


def aligned(ts: float, step_s: float) -> float:
    return math.floor(ts / step_s) * step_s


def chunks(start: float, end: float, step_s: float) -> list[tuple[float, float]]:
    """[start, end] cut into pieces of at most MAX_POINTS_PER_QUERY steps."""
    span = MAX_POINTS_PER_QUERY * step_s
    out = []
    while start <= end:
        stop = min(end, start + span - step_s)
        out.append((start, stop))
        start = stop + step_s
    return out


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        return float(raw)
    except (ValueError, OverflowError):
        return None


_ABSENT = object()  # a series without its "metric" or "values" key


def points_by_instant(result: Any, *, owned: bool = False) -> dict[float, list[MetricPoint]]:
    """A range-query result as metric points grouped by their timestamp.

    Whatever the response holds, this never raises: a series or point of the wrong shape (labels
    that are not strings, a point that is not ``[time, value]``, a time that is not a finite
    number) is left out and logged, so one bad series never stops the others; a value that is
    not a number becomes NaN, which attribution rejects with a reason.

    ``owned``: the result is the caller's to give away (a response just decoded): each series'
    label dict becomes its points' labels, ``__name__`` taken out of it, rather than a copy
    (a dict copied and one freed per series, a tenth of the parse)."""
    instants: dict[float, list[MetricPoint]] = defaultdict(list)
    malformed = 0
    # Per series and point (300,000 of them for 100,000 GPUs): the checks inline, the point
    # made as a tuple without the named tuple's Python __new__, and the list of the instant of
    # the point before kept at hand (a series' points are in time order, and most responses
    # hold one instant).
    isfinite, new_tuple, point_type = math.isfinite, tuple.__new__, MetricPoint
    join = "".join
    last_ts, bucket = math.nan, []
    for series in result if isinstance(result, list) else [result]:
        if type(series) is not dict and not isinstance(series, dict):
            malformed += 1
            continue
        # (No default made for every series: ``get(key, {})`` built a dict and a list each.)
        if (metric := series.get("metric", _ABSENT)) is _ABSENT:
            metric = {}
        if (values := series.get("values", _ABSENT)) is _ABSENT:
            values = []
        if not isinstance(metric, dict) or not isinstance(values, list):
            malformed += 1
            continue
        try:  # every key and value a string: str.join checks them in C (a generator over the
            # labels of 100,000 series was a tenth of the ingest cycle), one join of a list of
            # both (two joins cost a fifth more)
            join([*metric, *metric.values()])
        except TypeError:
            malformed += 1
            continue
        labels = metric if owned else dict(metric)
        name = labels.pop("__name__", "")
        for point in values:
            if (type(point) is not list and not isinstance(point, list)) or len(point) != 2:
                malformed += 1
                continue
            raw_ts, raw_value = point
            # Prometheus' own types first (a float time, a string value): no call for them.
            ts = raw_ts if type(raw_ts) is float else _number(raw_ts)
            if ts is None or not isfinite(ts):
                malformed += 1
                continue
            if type(raw_value) is str:
                try:
                    value = float(raw_value)
                except ValueError:
                    value = math.nan
            else:
                number = _number(raw_value)
                value = math.nan if number is None else number
            if ts != last_ts:
                last_ts, bucket = ts, instants[ts]
            bucket.append(new_tuple(point_type, (name, labels, value, ts)))
    if malformed:
        log.warning("malformed parts of a range-query result left out", extra={"parts": malformed})
    return dict(instants)
