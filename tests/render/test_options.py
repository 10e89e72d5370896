"""Render options: every problem listed at once, durations in whole seconds."""

from __future__ import annotations

import pytest

from sglang_tuning_exporter.render import options as render_options


def test_options_errors_are_listed() -> None:
    """Bad option values raise OptionsError naming each problem."""
    with pytest.raises(render_options.OptionsError) as exc:
        render_options.options_from_mapping({"override_for": "soon", "dedup_on": "model_name", "native": "yes"})
    assert len(exc.value.problems) == 3


def test_render_durations_are_whole_seconds() -> None:
    """PromQL ranges and `for:` are written in whole seconds: `500ms` (which would become `[0s]`, rejected
    by Prometheus) and `1.4s` are listed problems, `1.5m` is 90 s."""
    with pytest.raises(render_options.OptionsError) as exc:
        render_options.options_from_mapping({"override_window": "500ms", "override_for": "1.4s"})
    assert len(exc.value.problems) == 2 and all("whole number of seconds" in p for p in exc.value.problems)
    assert render_options.options_from_mapping({"override_window": "1.5m"}).override_window_s == 90
