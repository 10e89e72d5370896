"""One row per server when Prometheus scrapes a server's SGLang and its sidecar as two targets: the SGLang
target (SGLang's own metrics only) is merged into its sidecar's row, which keeps every signal the sidecar gave
and takes the rest from SGLang's (its latency histograms, hybrid-pool gauges, SLO burn).

The pairing is the native alert rules' (render/options.dedup_on): the host part of `instance`
(guide/native.HOST_REGEX: a sidecar runs beside its SGLang, same pod IP or host, another port) and the model
name. Neither target's series name the other (the sidecar's `sglang_tuning_*` carry its own instance only), so
the report merges only when that is unambiguous: on one host, for one model, exactly one sidecar and one target
without sidecar series; two servers of one model on one host keep a row per target. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.fleet.promapi import Sample
from sglang_tuning_exporter.fleet.queries import InstanceData
from sglang_tuning_exporter.guide.native import HOST_REGEX

_HOST = re.compile(HOST_REGEX)
# Answers only a sidecar's own series give: its windowed signals and the server facts it exports.
SIDECAR_KEYS = ("sidecar_signals", "args", "info")
Signals = dict[Rank, dict[str, float | None]]
V = TypeVar("V")


def host_of(instance: str) -> str:
    """The host part of an instance, as the rules' label_replace takes it."""
    m = _HOST.fullmatch(instance)
    return m.group(1) if m else instance


def sidecar_instances(results: Mapping[str, Sequence[Sample]]) -> set[str]:
    """Instances with series of our sidecar (its windowed signals, arguments or server info)."""
    return {name for key in SIDECAR_KEYS for s in results.get(key, ()) if (name := s.labels.get("instance"))}


def pair(data: Mapping[str, InstanceData], sidecars: set[str]) -> dict[str, str]:
    """SGLang's target -> its sidecar's, where one sidecar and one other target share a host and a model."""
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for name, d in data.items():
        if d.model_name:
            group = groups.setdefault((host_of(name), d.model_name), ([], []))
            group[0 if name in sidecars else 1].append(name)
    return {others[0]: ours[0] for ours, others in groups.values() if len(ours) == 1 and len(others) == 1}


def fill_gaps(into: Signals, src: Mapping[Rank, Mapping[str, float | None]]) -> Signals:
    """`into`'s per-rank signals with the ones it lacks (absent or unknown) taken from `src`."""
    out = {rank: dict(sig) for rank, sig in into.items()}
    for rank, sig in src.items():
        mine = out.setdefault(rank, {})
        mine.update({k: v for k, v in sig.items() if v is not None and mine.get(k) is None})
    return out


def merge(data: Mapping[str, InstanceData], pairs: Mapping[str, str]) -> dict[str, InstanceData]:
    """The instances with each paired SGLang target folded into its sidecar's (the sidecar's values win)."""
    out = {name: d for name, d in data.items() if name not in pairs}
    for native, sidecar in pairs.items():
        ours, theirs = data[sidecar], data[native]
        out[sidecar] = dataclasses.replace(ours, signals=fill_gaps(ours.signals, theirs.signals),
                                           version=ours.version or theirs.version)
    return out


def merge_by_instance(values: Mapping[str, Mapping[str, V]], pairs: Mapping[str, str]) -> dict[str, dict[str, V]]:
    """Per-instance values (SLO ratios, charts) with each paired target's folded into its sidecar's, the
    sidecar's winning."""
    out = {name: dict(v) for name, v in values.items() if name not in pairs}
    for native, sidecar in pairs.items():
        if native in values:
            out[sidecar] = {**values[native], **out.get(sidecar, {})}
    return out


def partners(pairs: Mapping[str, str], sidecars: Iterable[str]) -> list[str]:
    """The SGLang targets paired with these sidecars."""
    wanted = set(sidecars)
    return sorted(native for native, sidecar in pairs.items() if sidecar in wanted)


def merge_slices(slices: Mapping[str, Mapping[float, Signals]], pairs: Mapping[str, str]) -> dict[str, dict[float, Signals]]:
    """The change verdicts' slices (instance -> slice end -> per-rank signals) with each paired target's folded
    into its sidecar's slice by slice."""
    out = {name: dict(by_t) for name, by_t in slices.items() if name not in pairs}
    for native, sidecar in pairs.items():
        mine = out.setdefault(sidecar, {})
        for t, sig in slices.get(native, {}).items():
            mine[t] = fill_gaps(mine.get(t, {}), sig)
    return out
