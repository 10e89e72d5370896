"""One precedence for the guide profile and workload in every product (guide/settings.py): a flag given
beats the --config file, which beats the defaults; serve, diagnose and report agree."""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_tuning_exporter.core.flags import add_guide_flags
from sglang_tuning_exporter.core.model import ServerState
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config, load_config
from sglang_tuning_exporter.guide.settings import DEFAULT_WORKLOAD, resolve
from sglang_tuning_exporter.offline import diagnose
from sglang_tuning_exporter.sidecar.serve import build_advisor
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config

TABLE = load_table()


def test_flag_beats_config_beats_default(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("guide_profile: older-web\nworkload: latency\n", encoding="utf-8")
    config = load_config(str(cfg_file), TABLE)
    assert resolve(TABLE, Config(), profile=None, workload=None) == (TABLE.default_profile(), DEFAULT_WORKLOAD)
    assert resolve(TABLE, config, profile=None, workload=None) == ("older-web", "latency")
    assert resolve(TABLE, config, profile="older-md", workload="throughput") == ("older-md", "throughput")


def test_serve_and_diagnose_resolve_alike(tmp_path: Path) -> None:
    """The drift the products had: serve let the config file's workload win over the flag, diagnose the
    flag (and only when it was not `throughput`). Now both take the flag."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("workload: latency\n", encoding="utf-8")
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    served = build_config(p.parse_args(["--sglang.url", "http://x:1", "--config", str(cfg_file),
                                        "--workload", "throughput"]))
    adv = build_advisor(served)
    d = argparse.ArgumentParser()
    diagnose.add_arguments(d)
    _table, _cfg, _profile, workload, _ = diagnose._setup(d.parse_args(["x.log", "--config", str(cfg_file),
                                                                        "--workload", "throughput"]))
    assert workload == "throughput"
    assert adv.document is not None
    assert adv.document([], {}, ServerState(), 0.0)["workload"] == "throughput"
    q = argparse.ArgumentParser()
    add_guide_flags(q)
    assert q.parse_args([]).workload is None  # not given: the config file decides
