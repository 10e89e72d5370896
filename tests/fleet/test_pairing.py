"""fleet/pairing.py: a sidecar's target and its SGLang's merge into one row only when the pairing (host part of
`instance`, model name: the native rules' join) is unambiguous, the sidecar's values winning."""

from __future__ import annotations

from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.fleet import pairing
from sglang_tuning_exporter.fleet.promapi import Sample
from sglang_tuning_exporter.fleet.queries import InstanceData

M, N = "model-a", "model-b"


def _d(name: str, model: str | None, **signals: float | None) -> InstanceData:
    return InstanceData(name, {Rank(): dict(signals)}, model_name=model)


def test_host_part_as_the_rules_take_it() -> None:
    assert [pairing.host_of(i) for i in ("gpu-a:30000", "[::1]:9470", "10.0.0.1:9470", "pod-a")] == [
        "gpu-a", "[::1]", "10.0.0.1", "pod-a"]


def test_sidecar_instances_are_those_with_sidecar_series() -> None:
    results = {"sidecar_signals": [Sample({"instance": "a:9470", "signal": "x"}, 1.0, 0.0)],
               "info": [Sample({"instance": "b:9470"}, 1.0, 0.0)],
               "queue_empty_ratio": [Sample({"instance": "a:30000"}, 0.0, 0.0)]}
    assert pairing.sidecar_instances(results) == {"a:9470", "b:9470"}


def test_pairs_only_when_unambiguous() -> None:
    data = {n: _d(n, m) for n, m in (("a:9470", M), ("a:30000", M),  # a pair
                                     ("b:9470", M), ("b:30000", N),  # another model: apart
                                     ("c:9470", M), ("c:9471", M), ("c:30000", M),  # two sidecars: apart
                                     ("d:9470", None), ("d:30000", M))}  # no model to match
    sidecars = {"a:9470", "b:9470", "c:9470", "c:9471", "d:9470"}
    assert pairing.pair(data, sidecars) == {"a:30000": "a:9470"}


def test_merged_row_keeps_the_sidecars_values_and_takes_the_rest() -> None:
    side = InstanceData("a:9470", {Rank(dp=0): {"retractions_per_minute": 6.0, "ttft_p95_seconds": None}},
                        version="0.5.23", model_name=M)
    native = InstanceData("a:30000", {Rank(dp=0): {"retractions_per_minute": 1.0, "ttft_p95_seconds": 0.9},
                                      Rank(): {"itl_p95_seconds": 0.05}}, model_name=M)
    merged = pairing.merge({"a:9470": side, "a:30000": native}, {"a:30000": "a:9470"})
    assert list(merged) == ["a:9470"]
    assert merged["a:9470"].signals == {Rank(dp=0): {"retractions_per_minute": 6.0, "ttft_p95_seconds": 0.9},
                                        Rank(): {"itl_p95_seconds": 0.05}}
    assert pairing.merge_by_instance({"a:30000": {"t": 0.2}, "a:9470": {"u": 0.1}}, {"a:30000": "a:9470"}) == {
        "a:9470": {"t": 0.2, "u": 0.1}}
    slices = pairing.merge_slices({"a:9470": {60.0: {Rank(): {"x": 1.0}}}, "a:30000": {60.0: {Rank(): {"y": 2.0}}}},
                                  {"a:30000": "a:9470"})
    assert slices == {"a:9470": {60.0: {Rank(): {"x": 1.0, "y": 2.0}}}}
