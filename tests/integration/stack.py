"""The whole paging path on loopback: stand-in SGLang servers, our `serve`, Prometheus, Alertmanager.

Used by the integration suite (tests/integration/conftest.py) and by `make stack` (scripts/stack.py).
Each *target* is one simulated SGLang server (a scenario and a metric-name spelling) with its own
exporter; Prometheus scrapes both, loads the shipped rules rendered with short windows and `for:`,
and sends to Alertmanager, whose example routing is pointed at a webhook receiver.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from helpers.paths import ROOT
from integration.harness import (
    LOOPBACK,
    ManagedProcess,
    ProcessError,
    free_port,
    python_env,
    python_module,
)

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
EXPORTER_JOB = "sglang-tuning-exporter"
SGLANG_JOB = "sglang"


@dataclass(frozen=True)
class Timing:
    """How fast the stack reacts: Prometheus intervals and the rule overrides for render."""

    scrape_s: int = 1
    window_s: int = 20  # every rule's range window (the shipped 10 min would take 10 min to fill)
    for_s: int = 3  # every alert's `for:` (0 stays 0)
    exporter_window_s: int = 20  # the exporter's own signal window (--window)
    exporter_poll_s: float = 1.0  # how often the exporter scrapes SGLang (--sglang.scrape-interval)


@dataclass(frozen=True)
class TargetSpec:
    """One simulated SGLang server: a scenario served in one spelling, with or without our exporter."""

    key: str
    scenario: str
    spelling: str = "colon"
    exporter: bool = True  # False: SGLang alone, watched only by the native rules
    model_name: str | None = None  # None: the recorded Qwen/Qwen2.5-7B-Instruct


@dataclass
class Target:
    """A running target: its stand-in SGLang, its exporter, its log."""

    spec: TargetSpec
    sglang_port: int
    exporter_port: int
    log_file: Path
    standin: ManagedProcess | None = None
    exporter: ManagedProcess | None = None
    # Each server on a host of its own (127.0.0.x, all loopback): a sidecar and its SGLang share the
    # host, as in one pod, and the rules pair them by it.
    host: str = LOOPBACK

    @property
    def sglang_instance(self) -> str:
        """Prometheus `instance` of the stand-in SGLang."""
        return f"{self.host}:{self.sglang_port}"

    @property
    def exporter_instance(self) -> str:
        """Prometheus `instance` of our exporter."""
        return f"{self.host}:{self.exporter_port}"


def missing_binaries() -> list[str]:
    """Names of the Debian binaries the stack needs that are not installed."""
    return [name for name, path in (("prometheus", PROMETHEUS), ("prometheus-alertmanager", ALERTMANAGER))
            if path is None]


STACK_SLO = {"ttft_p95_seconds": 2.0, "itl_p95_seconds": 0.1, "objective": 0.99}


def render_rules(out_dir: Path, timing: Timing, config: Path | None = None) -> list[Path]:
    """The shipped rule files, rendered by our own `render` with only the windows and `for:` overridden
    and the exporter's `--config` (e.g. its `slo:`) where given, else an `slo:` of STACK_SLO."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if config is None:
        # The SLO group too, so the dashboards' SLO row has its burn rates (the healthy server answers
        # well inside these targets: no burn alert).
        config = out_dir / "slo-config.yaml"
        config.write_text(yaml.safe_dump({"slo": STACK_SLO}), encoding="utf-8")
    argv = python_module("sglang_tuning_exporter", "render", "--out", str(out_dir), "--rules-only",
                         "--override-window", f"{timing.window_s}s", "--override-for", f"{timing.for_s}s",
                         "--config", str(config))
    res = subprocess.run(argv, cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=120)
    files = sorted((out_dir / "alerts").glob("*.rules.yaml"))
    if res.returncode != 0 or not files:
        raise ProcessError(f"render with overrides failed ({res.returncode}, {len(files)} rule files): "
                           f"{' '.join(argv)}\n{res.stdout}\n{res.stderr}")
    return files


def alertmanager_config(example: dict[str, Any], webhook_url: str, group_wait_s: int = 1) -> dict[str, Any]:
    """The example routing unchanged, but every receiver posts to `webhook_url/<receiver>` and waits briefly."""
    cfg: dict[str, Any] = json.loads(json.dumps(example))  # deep copy
    for receiver in cfg.get("receivers") or []:
        name = receiver["name"]
        for key in [k for k in receiver if k.endswith("_configs")]:
            del receiver[key]
        receiver["webhook_configs"] = [{"url": f"{webhook_url}/{name}", "send_resolved": True}]

    def speed_up(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", f"{group_wait_s}s"), ("group_interval", "2s")):
            if key in route or route is cfg["route"]:
                route[key] = value
        for child in route.get("routes") or []:
            speed_up(child)

    speed_up(cfg["route"])
    cfg.get("global", {}).pop("smtp_smarthost", None)
    return cfg


def prometheus_config(targets: list[Target], rule_files: list[Path], am_port: int, timing: Timing) -> dict[str, Any]:
    """Scrape every exporter and stand-in each second, evaluate the rules, alert to our Alertmanager."""
    def static(job: str, pick: str) -> dict[str, Any]:
        return {"job_name": job, "static_configs": [
            {"targets": [t.exporter_instance if pick == "exporter" else t.sglang_instance],
             "labels": {"scenario": t.spec.key}} for t in targets if pick == "sglang" or t.spec.exporter]}

    return {
        "global": {"scrape_interval": f"{timing.scrape_s}s", "scrape_timeout": f"{timing.scrape_s}s",
                   "evaluation_interval": f"{timing.scrape_s}s"},
        "rule_files": [str(p) for p in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{LOOPBACK}:{am_port}"]}]}]},
        "scrape_configs": [static(EXPORTER_JOB, "exporter"), static(SGLANG_JOB, "sglang")],
    }


@dataclass
class Stack:
    """Starts and stops everything; `workdir` holds configs, logs and data."""

    workdir: Path
    specs: list[TargetSpec]
    webhook_url: str
    timing: Timing = field(default_factory=Timing)
    ports: dict[str, int] = field(default_factory=dict)  # fixed ports for `make stack`; free ones otherwise
    targets: list[Target] = field(default_factory=list)
    prometheus: ManagedProcess | None = None
    alertmanager: ManagedProcess | None = None
    rule_files: list[Path] = field(default_factory=list)
    detached: bool = False  # `make stack`: the processes outlive the script that starts them
    config: Path | None = None  # the exporter's --config, also rendered into the rules (its `slo:`)

    @property
    def prom_url(self) -> str:
        """Prometheus base URL."""
        return f"http://{LOOPBACK}:{self.ports['prometheus']}"

    @property
    def am_url(self) -> str:
        """Alertmanager base URL."""
        return f"http://{LOOPBACK}:{self.ports['alertmanager']}"

    def _port(self, name: str) -> int:
        if name not in self.ports:
            self.ports[name] = free_port()
        return self.ports[name]

    def exporter_argv(self, t: Target) -> list[str]:
        """How the exporter of target `t` is started (the same on restart)."""
        return python_module(
            "sglang_tuning_exporter", "serve",
            "--sglang.url", f"http://{t.sglang_instance}",
            "--sglang.log-file", str(t.log_file),
            "--web.listen-address", t.exporter_instance,
            "--sglang.scrape-interval", f"{self.timing.exporter_poll_s}s",
            "--sglang.scrape-timeout", f"{self.timing.exporter_poll_s}s",
            "--window", f"{self.timing.exporter_window_s}s",
            "--evaluation-interval", f"{self.timing.exporter_poll_s}s",
            *(("--config", str(self.config)) if self.config else ()),
        )

    def start_exporter(self, t: Target, *, wait: bool = True) -> None:
        """Start (or restart) the exporter of `t`; by default wait until it answers."""
        t.exporter = ManagedProcess(f"exporter-{t.spec.key}", self.exporter_argv(t), self.workdir / "logs",
                                    cwd=self.workdir, env=python_env(), die_with_parent=not self.detached).start()
        if wait:
            self.wait_exporter(t)

    def wait_exporter(self, t: Target) -> None:
        """Wait until the exporter of `t` answers."""
        assert t.exporter is not None
        t.exporter.wait_http(f"http://{t.exporter_instance}/-/healthy", timeout_s=60)

    def start_standin(self, t: Target) -> None:
        """Start the stand-in SGLang of `t`; its log starts on `start_log` (after the exporter tails it)."""
        argv = python_module("integration.standin_sglang", "--host", t.host, "--port", str(t.sglang_port),
                             "--scenario", t.spec.scenario, "--spelling", t.spec.spelling,
                             "--log-file", str(t.log_file), "--hold-log")
        if t.spec.model_name:
            argv += ["--model-name", t.spec.model_name]
        t.standin = ManagedProcess(f"sglang-{t.spec.key}", argv, self.workdir / "logs", env=python_env(),
                                   die_with_parent=not self.detached).start()

    def start_log(self, t: Target) -> None:
        """Wait for the stand-in of `t`, then let it start its log."""
        assert t.standin is not None
        t.standin.wait_http(f"http://{t.sglang_instance}/health", timeout_s=60)
        requests.post(f"http://{t.sglang_instance}/_standin/log", timeout=5).raise_for_status()

    def write_configs(self) -> None:
        """Render rules and write Prometheus, Alertmanager and exporter configs into `workdir`."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.rule_files = render_rules(self.workdir / "rules", self.timing, self.config)
        example = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
        am_dir = self.workdir / "alertmanager"
        am_dir.mkdir(exist_ok=True)
        for tmpl in AM_EXAMPLE.parent.glob("*.tmpl"):
            shutil.copy(tmpl, am_dir / tmpl.name)  # templates are relative to the config file
        (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(example, self.webhook_url)))
        prom = prometheus_config(self.targets, self.rule_files, self._port("alertmanager"), self.timing)
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(prom))

    def start(self) -> Stack:
        """Start everything; on any failure stop what was started and raise with the outputs."""
        for i, spec in enumerate(self.specs):
            self.targets.append(Target(spec, self._port(f"sglang-{spec.key}"), self._port(f"exporter-{spec.key}"),
                                       self.workdir / f"sglang-{spec.key}.log", host=f"127.0.0.{i + 2}"))
        self._port("prometheus")
        try:
            self.write_configs()
            self._start_alertmanager()
            self._start_prometheus()
            # SGLang answers before its exporter's first scrape (no scrape-down alert at start) but
            # its log appears only once the exporter tails the path, as in a pod that starts both.
            for t in self.targets:
                self.start_standin(t)
            for t in self.targets:
                if t.spec.exporter:
                    self.start_exporter(t, wait=False)
            for t in self.targets:
                if t.spec.exporter:
                    self.wait_exporter(t)
            for t in self.targets:
                self.start_log(t)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_alertmanager(self) -> None:
        assert ALERTMANAGER is not None
        am_dir = self.workdir / "alertmanager"
        self.alertmanager = ManagedProcess("alertmanager", [
            ALERTMANAGER, f"--config.file={am_dir / 'alertmanager.yml'}", f"--storage.path={am_dir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self.ports['alertmanager']}",
            "--cluster.listen-address=",  # no gossip port: loopback only, one instance
        ], self.workdir / "logs", die_with_parent=not self.detached).start()
        self.alertmanager.wait_http(f"{self.am_url}/-/ready", timeout_s=30)

    def _start_prometheus(self) -> None:
        assert PROMETHEUS is not None
        self.prometheus = ManagedProcess("prometheus", [
            PROMETHEUS, f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address={LOOPBACK}:{self.ports['prometheus']}",
            "--web.enable-lifecycle",
            # an alert sent before the notifier has discovered Alertmanager is dropped; resend soon, not after 1m
            "--rules.alert.resend-delay=2s",
        ], self.workdir / "logs", die_with_parent=not self.detached).start()
        self.prometheus.wait_http(f"{self.prom_url}/-/ready", timeout_s=30)

    def processes(self) -> list[ManagedProcess]:
        """Every process started, in start order."""
        procs = [self.alertmanager, self.prometheus]
        procs += [t.exporter for t in self.targets] + [t.standin for t in self.targets]
        return [p for p in procs if p is not None]

    def describe(self, key: str | None = None) -> str:
        """Status and output tail of every process (or of target `key`'s), for failure messages."""
        procs = self.processes() if key is None else [
            p for p in (self.target(key).exporter, self.target(key).standin) if p is not None]
        return "\n".join(p.describe() for p in procs)

    def stop(self) -> None:
        """Stop every process (stand-ins and exporters first)."""
        for p in reversed(self.processes()):
            p.stop(timeout_s=5)

    def target(self, key: str) -> Target:
        """The target named `key`."""
        for t in self.targets:
            if t.spec.key == key:
                return t
        raise KeyError(key)

    # --- Prometheus HTTP API
    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; raises with Prometheus' error text when the query fails."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = requests.get(f"{self.prom_url}/api/v1/query", params=params, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise PromQLError(expr, str(body.get("error") or body))
        return list(body["data"]["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1.0) -> list[dict[str, Any]]:
        """Range query; raises with Prometheus' error text when the query fails."""
        r = requests.get(f"{self.prom_url}/api/v1/query_range", timeout=10, params={
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s}"})
        body = r.json()
        if body.get("status") != "success":
            raise PromQLError(expr, str(body.get("error") or body))
        return list(body["data"]["result"])

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its health and last error."""
        r = requests.get(f"{self.prom_url}/api/v1/rules", timeout=10)
        return [rule for g in r.json()["data"]["groups"] for rule in g["rules"]]

    def firing(self) -> list[dict[str, Any]]:
        """Alerts currently firing in Prometheus."""
        r = requests.get(f"{self.prom_url}/api/v1/alerts", timeout=10)
        return [a for a in r.json()["data"]["alerts"] if a.get("state") == "firing"]


class PromQLError(RuntimeError):
    """Prometheus rejected or failed a query."""

    def __init__(self, expr: str, error: str) -> None:
        super().__init__(f"{error}\n  query: {expr}")
        self.expr = expr
        self.error = error


def wait_for(check: Any, timeout_s: float, interval_s: float = 0.5) -> Any:
    """Poll `check()` until it returns something truthy; returns it, or the last value on timeout."""
    deadline = time.monotonic() + timeout_s
    value = None
    while True:
        try:
            value = check()
        except (requests.RequestException, ValueError, KeyError):
            value = None
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


if __name__ == "__main__":
    sys.exit("use scripts/stack.py (make stack) or the integration tests")
