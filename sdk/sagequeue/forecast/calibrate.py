"""Calibrated ranges: each forecast's P10-P90 range widened or narrowed by what past forecasts of the same
pool got wrong (docs/forecast.md, "Calibrated ranges"; docs/adr/0026-calibrated-forecast-ranges.md).

The engine's quantiles come from a model of the queue; where the model is off (arrivals that do not come,
run times of a kind it cannot tell apart), its ranges are too narrow or too wide. This module learns, per
pool, by how much the range had to be stretched around its P50 to hold the starts that followed, and
stretches a new forecast's range by as much: a normalized conformal score in the manner of conformalized
quantile regression (Romano, Patterson and Candès, 2019), learnt again at each forecast from the outcomes
known by then, with recent ones weighing more, as adaptive conformal inference (Gibbs and Candès, 2021)
follows a changing distribution.

- **In log-wait space.** A wait `w` (seconds from the forecast to the start) is measured as
  `log(1 + w / SCALE_SECONDS)`: a miss of an hour counts for much on a forecast of minutes and little on one
  of a day, and waits of zero are defined. A past forecast's score is how far its start fell from its P50,
  over the distance from its P50 to its P10 (a start before the P50) or to its P90 (after): inside the
  range the score is at most 1. The pool's scale is the `coverage` quantile of the scores (0.85 by
  default, the middle of the 75-95 % docs/forecast.md targets for a P10-P90 range: past forecasts each
  stretched by it would have held 85 % of their starts), and a new forecast's P10 and P90 move away from (or toward) its
  P50 by that factor. Each arm is at least `FLOOR` wide, so a range that collapsed on its P50 can open.
- **The P50 is the engine's** unless `shift_p50` is set: then it moves by the median of past starts'
  distance from their P50 (a bias correction). On the documented traces the bias of one day did not say
  the next day's, and the shift made the P50's error worse (docs/forecast.md), so it is off by default.
- **Censoring.** A forecast whose job still waits is known only as "after t": its score is at least that
  of a start at t (past its P50), or unknown (before its P50). Scoring only the forecasts whose jobs started
  would learn from short waits alone and pull every range in; the quantiles here are Kaplan-Meier
  quantiles, where a job still waiting counts as a start somewhere above where it has got to, and a job
  waiting past its P90 is a miss at once. Forecasts whose job left without starting are not given here.
- **Recent forecasts count more**: weights halve every `half_life_seconds`, so the calibration follows the
  queue's load as it changes.
- **Few data, small moves.** A pool's scale is shrunk toward all pools' by its weight `n` as
  `n / (n + prior)`, and all pools' toward 1 (no change) the same way: with no past forecasts the
  calibration is the identity; a pool with few borrows from the others.
- **Bounded**: the scale stays within `1 / max_scale` and `max_scale`, the P50's shift within `max_shift`,
  and the quantiles stay in order. Whoever shapes which forecasts get scored (a tenant's submissions and
  cancellations) can move a pool's ranges at most that much; nothing here decides anything about
  scheduling.

Pure and deterministic: numbers in, numbers out; no clock, no I/O.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Waits are measured as log(1 + wait / SCALE_SECONDS).
SCALE_SECONDS = 600.0
#: The narrowest arm (P50 to P10, P50 to P90) a score is measured by and a scale applies to, in log-wait.
FLOOR = 0.1


@dataclass(frozen=True)
class CalibrationSettings:
    #: the share of past starts the stretched ranges would have held
    coverage: float = 0.85
    #: a past forecast's weight halves every this many seconds of age (inf: all weigh the same)
    half_life_seconds: float = 86400.0
    #: shrinkage: a pool's (or all pools') figure is scaled by n / (n + prior), n its forecasts' weight
    prior: float = 20.0
    #: the scale stays within 1 / max_scale and max_scale
    max_scale: float = 3.0
    #: move the P50 by the median of past starts' distance from their P50 (a bias correction)
    shift_p50: bool = False
    #: the P50's shift stays within this (log-wait; log(3): a factor of 3 on 1 + wait / SCALE_SECONDS)
    max_shift: float = math.log(3.0)
    #: past forecasts read at most, per pool (the newest)
    limit: int = 1000


@dataclass(frozen=True)
class Outcome:
    """A past forecast and what came of it by the time the calibration is learnt: the engine's quantiles
    in seconds after it was made (inf: past the horizon), and either the seconds after it the job started
    or, still waiting, the seconds it has waited since."""

    pool: str
    #: seconds before the calibration is learnt that the forecast was made (its age, for the weight)
    age: float
    quantiles: tuple[float, float, float]
    started: float | None = None
    waited: float = 0.0


def measure(seconds: float) -> float:
    """A wait in log-wait space."""
    return math.log1p(max(seconds, 0.0) / SCALE_SECONDS)


#: The largest log-wait whose seconds are a float: beyond it, unmeasure answers infinity.
_LARGEST = math.log(sys.float_info.max / SCALE_SECONDS)


def unmeasure(value: float) -> float:
    """Seconds of a log-wait (none below zero; infinity for one too large for a float)."""
    if not value > 0:
        return 0.0
    return SCALE_SECONDS * math.expm1(value) if value < _LARGEST else math.inf


@dataclass(frozen=True)
class Adjustment:
    """How a pool's ranges are stretched around their P50 (`scale`, 1: unchanged), how far the P50 moves in
    log-wait space (`shift`), and the weight of past forecasts it was learnt from (0: borrowed from all
    pools, or none at all)."""

    scale: float = 1.0
    shift: float = 0.0
    weight: float = 0.0

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.shift == 0.0

    def apply(
        self, quantiles: tuple[float, float, float], horizon: float = math.inf
    ) -> tuple[float, float, float]:
        """The quantiles (seconds after the forecast; inf past the horizon) calibrated, kept in order. A
        forecast with a quantile past the horizon is left as it is (its range has no upper end to stretch).
        A quantile stretched past `horizon` (the engine's: it saw nothing beyond) is inf, "not by the
        horizon", as the engine says of a start it did not see: a range stretched by a factor in log-wait
        from a near P50 to a P90 days away would otherwise end thousands of years on."""
        if self.identity or any(math.isinf(q) or math.isnan(q) for q in quantiles):
            return quantiles
        low, middle, high = (measure(q) for q in quantiles)
        centre = middle + self.shift
        # each arm at least FLOOR wide, as `learn` measured it: a range collapsed on its P50 opens
        below = self.scale * max(middle - low, FLOOR)
        above = self.scale * max(high - middle, FLOOR)
        # without a shift the P50 is the engine's to the last bit (no round trip through log-wait)
        p50 = quantiles[1] if self.shift == 0.0 else unmeasure(centre)
        high = max(unmeasure(centre + above), p50)
        if high > max(horizon, quantiles[2]):
            high = math.inf
        return (min(unmeasure(centre - below), p50), p50, high)

    def to_api(self) -> dict[str, Any]:
        return {"scale": round(self.scale, 4), "shift": round(self.shift, 4), "weight": round(self.weight, 1)}

    @classmethod
    def from_api(cls, data: Any, settings: CalibrationSettings | None = None) -> Adjustment:
        """An adjustment as the API answered it, bounded again: an answer that is not a well-formed
        adjustment is the identity (a forecast without calibration rather than an error)."""
        settings = settings or CalibrationSettings()
        if not isinstance(data, Mapping):
            return cls()
        scale, shift, weight = (_number(data.get(key)) for key in ("scale", "shift", "weight"))
        if scale is None or shift is None or scale <= 0:
            return cls()
        return cls(
            scale=_bounded(scale, 1.0 / settings.max_scale, settings.max_scale),
            shift=_bounded(shift, -settings.max_shift, settings.max_shift),
            weight=max(weight, 0.0) if weight is not None else 0.0,
        )


def _number(value: Any) -> float | None:
    """A finite number as a float; None for anything else (a bool, a string, NaN, infinity)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _bounded(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


@dataclass(frozen=True)
class Calibration:
    """Per pool adjustments, and the one learnt from all pools for a pool with none of its own."""

    pools: Mapping[str, Adjustment] = field(default_factory=dict)
    fallback: Adjustment = Adjustment()

    def for_pool(self, pool: str) -> Adjustment:
        return self.pools.get(pool, self.fallback)

    def apply(
        self, pool: str, quantiles: tuple[float, float, float], horizon: float = math.inf
    ) -> tuple[float, float, float]:
        return self.for_pool(pool).apply(quantiles, horizon)

    def to_api(self) -> dict[str, Any]:
        return {
            "pools": {pool: adjustment.to_api() for pool, adjustment in sorted(self.pools.items())},
            "all": self.fallback.to_api(),
        }

    @classmethod
    def from_api(cls, data: Any, settings: CalibrationSettings | None = None) -> Calibration:
        """A calibration as the API answered it (each adjustment bounded again); anything else: identity."""
        if not isinstance(data, Mapping):
            return cls()
        pools = data.get("pools")
        return cls(
            pools={
                str(pool): Adjustment.from_api(value, settings)
                for pool, value in (pools.items() if isinstance(pools, Mapping) else ())
            },
            fallback=Adjustment.from_api(data.get("all"), settings),
        )


def learn(outcomes: Iterable[Outcome], settings: CalibrationSettings | None = None) -> Calibration:
    """Each pool's adjustment from its past forecasts, shrunk toward all pools', itself shrunk toward none."""
    settings = settings or CalibrationSettings()
    by_pool: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_pool.setdefault(outcome.pool, []).append(outcome)
    for pool, past in by_pool.items():
        if len(past) > settings.limit:
            # the newest, ties broken by content, so the order the log is read in changes nothing
            by_pool[pool] = sorted(past, key=_newest_first)[: settings.limit]
    everyone = [o for past in by_pool.values() for o in past]
    fallback = _adjustment(everyone, settings, Adjustment())
    pools = {pool: _adjustment(past, settings, fallback) for pool, past in sorted(by_pool.items())}
    return Calibration(pools=pools, fallback=fallback)


def _newest_first(outcome: Outcome) -> tuple[float, tuple[float, float, float], float, float]:
    started = -1.0 if outcome.started is None else outcome.started
    return (outcome.age, outcome.quantiles, started, outcome.waited)


def _adjustment(past: list[Outcome], settings: CalibrationSettings, toward: Adjustment) -> Adjustment:
    scores: list[tuple[float, bool, float]] = []  # (score, started, weight)
    offsets: list[tuple[float, bool, float]] = []  # (distance from the P50, started, weight)
    for outcome in past:
        if any(math.isinf(q) or math.isnan(q) for q in outcome.quantiles):
            continue  # a range with no upper end is not stretched, and says nothing about stretching
        if any(math.isnan(value) for value in (outcome.age, outcome.waited, outcome.started or 0.0)):
            continue  # no time at all: nothing to weigh or to score
        weight = 0.5 ** (max(outcome.age, 0.0) / settings.half_life_seconds)
        low, middle, high = (measure(q) for q in outcome.quantiles)
        below, above = max(middle - low, FLOOR), max(high - middle, FLOOR)
        started = outcome.started is not None
        at = measure(outcome.started if outcome.started is not None else outcome.waited)
        if at >= middle:
            scores.append(((at - middle) / above, started, weight))
        elif started:
            scores.append(((middle - at) / below, True, weight))
        else:  # waiting, short of its P50: its score could yet be anything from 0 up
            scores.append((0.0, False, weight))
        offsets.append((at - middle, started, weight))
    scale, weight = _censored_quantile(scores, settings.coverage)
    scale = _shrunk(scale, weight, toward.scale, settings.prior)
    shift = toward.shift
    if settings.shift_p50:
        offset, offset_weight = _censored_quantile(offsets, 0.5)
        shift = _shrunk(offset, offset_weight, toward.shift, settings.prior)
    return Adjustment(
        scale=_bounded(scale, 1.0 / settings.max_scale, settings.max_scale),
        shift=_bounded(shift, -settings.max_shift, settings.max_shift),
        weight=weight,
    )


def _shrunk(value: float, weight: float, toward: float, prior: float) -> float:
    if weight <= 0:
        return toward
    return toward + weight / (weight + prior) * (value - toward)


def _censored_quantile(points: list[tuple[float, bool, float]], level: float) -> tuple[float, float]:
    """The `level` quantile of right-censored values (Kaplan-Meier, weighted), and the weight it rests on:
    the starts, and the jobs still waiting above it (known to be above). (0, 0): nothing known.

    Where the survival never falls to 1 - level (too many still waiting), the quantile is at least the
    highest value seen: that lower bound is the answer when above zero, and the bounds cap it."""
    if not points:
        return 0.0, 0.0
    # starts before jobs still waiting at the same value: a job waiting at v will start after v
    points = sorted(points, key=lambda p: (p[0], not p[1]))
    at_risk = sum(weight for _, _, weight in points)
    survival = 1.0
    for value, started, weight in points:
        if started and at_risk > 0:
            survival *= 1.0 - weight / at_risk
            if survival <= 1.0 - level + 1e-12:
                return value, sum(w for v, s, w in points if s or v >= value)
        at_risk -= weight
    # the survival never fell that far: the quantile is above every value seen, a lower bound that says
    # something only above zero (jobs waiting past where their forecast put them), resting on them
    highest = points[-1][0]
    if highest <= 0:
        return 0.0, 0.0
    return highest, sum(w for v, s, w in points if s or v > 0)


__all__ = [
    "FLOOR",
    "SCALE_SECONDS",
    "Adjustment",
    "Calibration",
    "CalibrationSettings",
    "Outcome",
    "learn",
    "measure",
    "unmeasure",
]
