"""Which OmniInteract cases a run replays: seeded sampling with scenario tags, or a replay list.

``sample_cases(cases, num, tags=..., focus=..., seed=..., shuffle=...)``:

* ``num`` is a total across subsets; ``0`` (or more than there are) means every case;
* the order is shuffled with ``seed`` (a ``random.Random``) unless ``shuffle`` is off;
* **cover** (default): for each requested tag in order, the first case carrying it is picked
  unless an already-picked case covers it; the rest of the budget is then filled in order. Cover
  picks come first and are cut to the budget;
* **focus**: only cases carrying at least one requested tag are eligible (cover still applies);
* a requested tag that no eligible case carries is an error (``SamplingError``).

``read_video_list(path, cases)`` replays a ``sampled_cases.jsonl`` (rows ``{video_path,
output_name, subset}``) in its order: every row must name a discovered case and its
``official_output_name``; duplicates are refused. ``sampled_cases_rows(cases)`` writes that format.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.omniinteract.dataset import SCENARIO_TAGS, Case

__all__ = ["SamplingError", "read_video_list", "sample_cases", "sampled_cases_rows"]


class SamplingError(ValueError):
    """The requested sample cannot be drawn (the message says why)."""


def sample_cases(
    cases: Sequence[Case],
    num: int = 3,
    *,
    tags: Sequence[str] = (),
    focus: bool = False,
    seed: int = 0,
    shuffle: bool = True,
) -> tuple[list[Case], list[str]]:
    """The sampled cases, and warnings (for example an oversized ``num``)."""
    warnings: list[str] = []
    if num < 0:
        raise SamplingError("the number of cases must be >= 0")
    for t in tags:
        if t not in SCENARIO_TAGS:
            raise SamplingError(f"unknown scenario tag {t!r}; choose from {', '.join(SCENARIO_TAGS)}")
    if focus and not tags:
        raise SamplingError("focus mode needs scenario tags")
    order = list(cases)
    if shuffle:
        random.Random(seed).shuffle(order)
    if focus:
        order = [c for c in order if c.tags & set(tags)]
    budget = len(order) if num == 0 else num
    if num > len(order):
        warnings.append(f"asked for {num} cases, {len(order)} available: taking all")
        budget = len(order)
    picked: list[Case] = []
    for t in tags:
        if any(t in c.tags for c in picked):
            continue
        match = next((c for c in order if t in c.tags), None)
        if match is None:
            raise SamplingError(f"no case carries the scenario tag {t!r}")
        picked.append(match)
    picked = picked[:budget]
    for c in order:
        if len(picked) >= budget:
            break
        if c not in picked:
            picked.append(c)
    return picked, warnings


def sampled_cases_rows(cases: Sequence[Case]) -> list[dict[str, Any]]:
    """``sampled_cases.jsonl`` rows: ``{video_path (absolute), output_name, subset}``."""
    return [
        {"video_path": str(c.video_path), "output_name": c.output_name, "subset": c.subset} for c in cases
    ]


def read_video_list(path: str | Path, cases: Sequence[Case], num: int = 0) -> list[Case]:
    """The cases a ``sampled_cases.jsonl`` names, in its order (the first ``num`` when ``num > 0``)."""
    by_path = {c.video_path: c for c in cases}
    out: list[Case] = []
    seen: set[Path] = set()
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            video = Path(row["video_path"]).resolve()
            name, subset = row["output_name"], row["subset"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise SamplingError(f"{path}:{lineno}: {exc}") from None
        case = by_path.get(video)
        if case is None or case.subset != subset:
            raise SamplingError(f"{path}:{lineno}: {video} is not a case of subset {subset!r}")
        if name != case.output_name:
            raise SamplingError(f"{path}:{lineno}: output_name {name!r} should be {case.output_name!r}")
        if video in seen:
            raise SamplingError(f"{path}:{lineno}: {video} is listed twice")
        seen.add(video)
        out.append(case)
    return out[:num] if num > 0 else out
