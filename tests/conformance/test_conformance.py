"""One meaning everywhere: every scenario read by every evaluator gives the same verdicts and signal
values at its end (docs/signals.md, "Conformance").  A new evaluator or check joins here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .evaluators import Reading, diagnose, live, replay, sidecar_restarted
from .scenarios import ALL, Scenario

SCENARIOS = {f().name: f for f in ALL}
PY_EVALUATORS = {"diagnose": diagnose, "replay": replay, "live": live}


def _applies(sc: Scenario, evaluator: str) -> bool:
    if not sc.lines:
        return evaluator == "live"  # metrics only: nothing to replay or diagnose
    return True


def check_reading(sc: Scenario, r: Reading, who: str) -> None:
    for check, want in sc.statuses.items():
        assert r.worst_status(check) == want, f"{who}: {check} is {r.worst_status(check)}, want {want}"
    for name, want in sc.signals.items():
        got = r.worst_signal(name)
        assert got is not None and math.isclose(got, want, rel_tol=sc.rel, abs_tol=0.02), \
            f"{who}: {name} = {got}, want {want} (±{sc.rel:.0%})"
    for rank_text, checks in sc.rank_statuses.items():
        dim, _, value = rank_text.partition("=")
        ranks = [rk for rk in r.statuses if getattr(rk, dim) == int(value)]
        assert ranks, f"{who}: no rank {rank_text} in {list(r.statuses)}"
        for check, want in checks.items():
            got = {r.statuses[rk].get(check) for rk in ranks}
            assert got == {want}, f"{who}: {check} on {rank_text} is {got}, want {want}"


@pytest.mark.parametrize("evaluator", sorted(PY_EVALUATORS))
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_python_evaluators_agree(name: str, evaluator: str, tmp_path: Path) -> None:
    """Each Python evaluator reads each scenario's end as the scenario states."""
    sc = SCENARIOS[name]()
    if not _applies(sc, evaluator):
        pytest.skip(f"{evaluator} does not read a scenario without a log")
    check_reading(sc, PY_EVALUATORS[evaluator](sc, tmp_path), evaluator)


def test_sidecar_restarted_mid_log_knows_the_startup_facts(tmp_path: Path) -> None:
    """A sidecar started without --from-start reads the running server's startup section."""
    sc = SCENARIOS["sidecar_restart"]()
    check_reading(sc, sidecar_restarted(sc, tmp_path), "sidecar restarted")
