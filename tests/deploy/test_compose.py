"""docker-compose stack: the file validates, images are pinned, profiles and volumes wire the sidecar to
SGLang's log; the Prometheus, Alertmanager and Grafana files it mounts are valid; the demo replayer works."""

from __future__ import annotations

import importlib.util
import io
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from helpers.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
GRAFANA = ROOT / "deploy" / "grafana" / "provisioning"
PINNED = re.compile(r"^(?P<repo>[a-z0-9./_-]+):(?P<tag>v?\d+\.\d+\.\d+[A-Za-z0-9.-]*)$")


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


SERVICES: dict[str, Any] = _compose()["services"]


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, **kwargs)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Debian package) not installed")
@pytest.mark.parametrize("profile", [None, "demo", "gpu"])
def test_docker_compose_config_validates(profile: str | None) -> None:
    """`docker-compose config -q` accepts the file, with each profile."""
    cmd = ["docker-compose", "-f", str(COMPOSE)]
    if profile:
        cmd += ["--profile", profile]
    proc = _run([*cmd, "config", "-q"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_every_image_is_pinned_to_a_version() -> None:
    """No `latest`, no bare repository: every image carries an exact version tag."""
    images = {name: svc["image"] for name, svc in SERVICES.items()}
    for name, image in images.items():
        assert PINNED.match(image), f"{name}: image {image!r} is not pinned to a version"
    repos = {PINNED.match(i).group("repo") for i in images.values()}  # type: ignore[union-attr]
    assert {"prom/prometheus", "prom/alertmanager", "grafana/grafana", "lmsysorg/sglang"} <= repos


def test_profiles_select_the_log_source() -> None:
    """Monitoring always runs; `gpu` adds SGLang and its sidecar, `demo` the replayer and a log-only sidecar."""
    for name in ("prometheus", "alertmanager", "grafana"):
        assert "profiles" not in SERVICES[name]
    assert SERVICES["sglang"]["profiles"] == ["gpu"]
    assert SERVICES["sidecar"]["profiles"] == ["gpu"]
    assert SERVICES["replay"]["profiles"] == ["demo"]
    assert SERVICES["sidecar-demo"]["profiles"] == ["demo"]
    assert SERVICES["sidecar-demo"]["networks"]["default"]["aliases"] == ["sidecar"]
    assert SERVICES["replay"]["depends_on"] == ["sidecar-demo"]


@pytest.mark.parametrize("name", ["sidecar", "sidecar-demo"])
def test_sidecar_is_built_here_and_reads_the_shared_log(name: str) -> None:
    """The sidecar builds from ./Dockerfile, listens on 9470 and tails the log volume read-only."""
    sidecar = SERVICES[name]
    assert sidecar["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    command = sidecar["command"]
    assert command[0] == "serve"
    assert "--web.listen-address=:9470" in command
    assert "--sglang.log-file=/logs/sglang.log" in command
    assert "sglang-logs:/logs:ro" in sidecar["volumes"]
    assert "127.0.0.1:9470:9470" in sidecar["ports"]
    assert "http://127.0.0.1:9470/-/healthy" in " ".join(sidecar["healthcheck"]["test"])


def test_only_the_gpu_sidecar_scrapes_sglang() -> None:
    """The demo has no SGLang: its sidecar must not scrape (a failing scrape inhibits the check alerts)."""
    assert "--sglang.url=http://sglang:30000" in SERVICES["sidecar"]["command"]
    assert not any(a.startswith("--sglang.url") for a in SERVICES["sidecar-demo"]["command"])


def test_sglang_service_reserves_gpus_enables_metrics_and_tees_its_log() -> None:
    """SGLang gets GPUs via deploy.resources, exports metrics, and copies stdout+stderr to the shared log."""
    sglang = SERVICES["sglang"]
    devices = sglang["deploy"]["resources"]["reservations"]["devices"]
    assert devices and all("gpu" in d["capabilities"] for d in devices)
    script = " ".join(sglang["command"])
    assert "sglang.launch_server" in script and "--enable-metrics" in script
    assert "--port 30000" in script
    assert re.search(r"2>&1 \| python3 /opt/sglang-tuning/logtee\.py /logs/sglang\.log --max-bytes \d+ --backups \d",
                     script)  # rotated: a plain `tee -a` grew without bound
    assert "./exporter/sglang_tuning_exporter/sources/logtee.py:/opt/sglang-tuning/logtee.py:ro" in sglang["volumes"]
    assert "pipefail" in script  # the container exits with SGLang's status, not tee's
    assert "sglang-logs:/logs" in sglang["volumes"]
    assert sglang["environment"]["PYTHONUNBUFFERED"] == "1"


def test_demo_replays_the_recorded_log_into_the_shared_volume() -> None:
    """The replayer runs the sidecar image, reads examples/recorded.log, writes the sidecar's log file."""
    replay = SERVICES["replay"]
    assert replay["image"] == SERVICES["sidecar"]["image"]
    assert replay["build"] == SERVICES["sidecar"]["build"]
    assert "./examples/recorded.log:/demo/recorded.log:ro" in replay["volumes"]
    assert "./deploy/demo/replay.py:/demo/replay.py:ro" in replay["volumes"]
    assert "sglang-logs:/logs" in replay["volumes"]
    assert "--output=/logs/sglang.log" in replay["command"]
    assert replay["user"] == "0:0"  # the named volume is root-owned; the image's user could not write


def test_named_volumes_declared_and_ports_on_loopback() -> None:
    """Every named volume is declared at the top level; published ports bind 127.0.0.1 only."""
    declared = set(_compose()["volumes"])
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if not source.startswith((".", "/", "$")):
                assert source in declared, f"{name}: volume {source} not declared"
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is published on every interface"


def _bind_sources() -> list[tuple[str, Path]]:
    return [(name, ROOT / vol.split(":")[0]) for name, svc in SERVICES.items()
            for vol in svc.get("volumes", []) if vol.startswith("./")]


def test_bind_mounted_files_of_this_stack_exist() -> None:
    """Every ./path the compose file mounts exists and is not empty (the demo log and the Alertmanager
    templates among them)."""
    sources = _bind_sources()
    assert {ROOT / "examples" / "recorded.log", ROOT / "alerts" / "alertmanager.templates.tmpl"} <= {
        s for _, s in sources}
    for name, source in sources:
        assert source.exists(), f"{name}: {source} missing"
        assert source.is_dir() or source.stat().st_size > 0, f"{name}: {source} is empty"


def test_dockerfile_exists_for_the_sidecar_build() -> None:
    """The sidecar's build context has the Dockerfile."""
    assert "FROM" in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_prometheus_scrapes_sidecar_and_sglang_and_alerts_to_alertmanager() -> None:
    """Jobs and targets match the compose service names; rules come from the mounted alerts/."""
    doc = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["sglang-tuning-exporter"]["static_configs"][0]["targets"] == ["sidecar:9470"]
    assert jobs["sglang"]["static_configs"][0]["targets"] == ["sglang:30000"]
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    mount = next(v for v in SERVICES["prometheus"]["volumes"] if v.startswith("./alerts:"))
    target_dir = mount.split(":")[1]
    assert all(rf.startswith(target_dir + "/") for rf in doc["rule_files"])


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_prometheus_config_with_the_shipped_rules(tmp_path: Path) -> None:
    """promtool check config passes, with rule_files pointed at the repository's alerts/."""
    doc = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    doc["rule_files"] = [rf.replace("/etc/prometheus/rules", str(ROOT / "alerts")) for rf in doc["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    proc = _run(["promtool", "check", "config", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool not installed")
def test_amtool_accepts_the_alertmanager_config() -> None:
    """amtool check-config passes and routes critical alerts to the paging receiver."""
    proc = _run(["amtool", "check-config", str(ALERTMANAGER)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(ALERTMANAGER.read_text(encoding="utf-8"))
    routes = {r["receiver"]: r["matchers"] for r in doc["route"]["routes"]}
    assert routes["page"] == ['severity="critical"']


def test_grafana_provisioning_matches_the_mounts() -> None:
    """The datasource points at the prometheus service; the provider reads where dashboards/ is mounted."""
    ds = yaml.safe_load((GRAFANA / "datasources" / "prometheus.yml").read_text(encoding="utf-8"))
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((GRAFANA / "dashboards" / "sglang-tuning.yml").read_text(encoding="utf-8"))
    path = provider["providers"][0]["options"]["path"]
    assert f"./dashboards:{path}:ro" in SERVICES["grafana"]["volumes"]
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in SERVICES["grafana"]["volumes"]
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / Path(home).name).is_file()


def _replayer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replay", ROOT / "deploy" / "demo" / "replay.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_appends_every_line_with_the_interval() -> None:
    """replay() terminates every line, flushes, and sleeps the interval after each (fake sleep)."""
    sleeps: list[float] = []
    out = io.StringIO()
    n = _replayer().replay(["a\n", "b"], out, 0.25, sleeps.append)
    assert (n, out.getvalue(), sleeps) == (2, "a\nb\n", [0.25, 0.25])


def test_replay_command_line(tmp_path: Path) -> None:
    """One pass copies the log; a missing or empty input is a usage error (exit 2), not a traceback."""
    main = _replayer().main
    src, dst = tmp_path / "in.log", tmp_path / "logs" / "out.log"
    src.write_text("[2025-01-01 00:00:00] Decode batch. #running-req: 1\nsecond\n", encoding="utf-8")
    assert main(["--input", str(src), "--output", str(dst), "--interval", "0"], sleep=lambda _: None) == 0
    assert dst.read_text(encoding="utf-8") == src.read_text(encoding="utf-8")
    assert main(["--input", str(tmp_path / "nope"), "--output", str(dst)]) == 2
    (tmp_path / "empty.log").write_text("")
    assert main(["--input", str(tmp_path / "empty.log"), "--output", str(dst), "--loop"]) == 2
