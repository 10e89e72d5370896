"""Docs that cannot drift (issue #24): every `$ sglang-tuning-exporter ...` example in README.md and docs/
is run and its shown output compared with the real one; every count the docs state about the product is
checked against the checks table, the query plan or the code; every file, module and endpoint they name
exists. A stale statement fails here, not in a reader's hands."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROMPT = "$ sglang-tuning-exporter "
ELIDED = "..."


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ----------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    """One fenced command and the output the docs show for it."""

    where: str  # file:line
    argv: list[str]
    shown: list[str]  # output lines; "..." stands for lines left out


def fenced_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line number of the first line inside, lines) of every ``` block."""
    out: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            out.append((start + 1, lines[start:j]))
            i = j + 1
        else:
            i += 1
    return out


def examples(text: str, name: str) -> list[Example]:
    """Every fenced block whose first line is `$ sglang-tuning-exporter ...`."""
    return [Example(f"{name}:{line}", shlex.split(block[0][len(PROMPT):]), block[1:])
            for line, block in fenced_blocks(text) if block and block[0].startswith(PROMPT)]


def mismatch(shown: list[str], output: str) -> str | None:
    """None when `shown` is the output's beginning with `...` standing for left-out lines (an example may
    also stop early); else the first shown line that is not where it should be."""
    real = [line.rstrip() for line in output.splitlines()]
    pos, anchored = 0, True
    for line in (s.rstrip() for s in shown):
        if line == ELIDED:
            anchored = False
            continue
        if anchored:
            if pos >= len(real) or real[pos] != line:
                return f"expected {line!r} at output line {pos + 1}, found {real[pos] if pos < len(real) else 'the end'!r}"
            pos += 1
        else:
            try:
                pos = real.index(line, pos) + 1
            except ValueError:
                return f"{line!r} is not in the output (after line {pos})"
            anchored = True
    return None


ALL_EXAMPLES = [e for doc in DOCS for e in examples(doc.read_text(encoding="utf-8"), rel(doc))]


def run_cli(argv: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True, timeout=300, check=False)
    assert proc.returncode in (0, 3), f"exit {proc.returncode}: {proc.stdout}"
    return proc.stdout


def test_the_docs_show_examples() -> None:
    """The examples below are found (a change of the prompt or fences would silently test nothing)."""
    assert len(ALL_EXAMPLES) >= 5, [e.where for e in ALL_EXAMPLES]


@pytest.mark.parametrize("example", ALL_EXAMPLES, ids=[e.where for e in ALL_EXAMPLES])
def test_each_example_prints_what_the_docs_show(example: Example) -> None:
    """Each example's shown lines are the command's real output (`...` for lines left out)."""
    for path in (a for a in example.argv if a.endswith(".log") and "/shared/" in a):
        if not (ROOT / path).exists():
            pytest.skip(f"{path} is not here")
    problem = mismatch(example.shown, run_cli(example.argv))
    assert problem is None, f"{example.where}: {problem}"


def test_a_planted_stale_example_fails() -> None:
    """The checker is not a tautology: an example whose count is off by one, whose line is gone or whose
    lines are out of order fails; the true one passes."""
    text = "intro\n```\n$ sglang-tuning-exporter diagnose examples/recorded.log\n...\n{line}\n```\n"
    real = run_cli(["diagnose", "examples/recorded.log"])
    fired = next(line for line in real.splitlines() if "checks fired" in line)
    (good,) = examples(text.format(line=fired), "x.md")
    assert good.argv == ["diagnose", "examples/recorded.log"] and mismatch(good.shown, real) is None
    stale = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), fired, count=1)
    (planted,) = examples(text.format(line=stale), "x.md")
    assert mismatch(planted.shown, real) is not None
    assert mismatch(["...", "a line diagnose never prints"], real) is not None
    assert mismatch(["...", fired, "...", real.splitlines()[0]], real) is not None  # out of order
    assert mismatch([fired], real) is not None  # not the output's first line, and no `...` says so


# ----------------------------------------------------------------------------- stated counts


def checks_count() -> int:
    from sglang_tuning_exporter.guide.checks import load_table

    return len(load_table().checks)


def non_checks_count() -> int:
    from sglang_tuning_exporter.guide.checks import load_table

    return len(load_table().non_checks)


def report_instant_queries() -> int:
    from sglang_tuning_exporter.fleet import queries

    w = queries.Window(0.0, 7 * 86400.0, 900.0)
    return len(queries.plan(w)) + len(queries.identity_queries(w))


def report_signal_queries() -> int:
    from sglang_tuning_exporter.fleet import queries

    return len(queries.plan(queries.Window(0.0, 7 * 86400.0, 900.0)))


def report_chart_queries() -> int:
    from sglang_tuning_exporter.fleet import queries

    return len(queries.chart_queries(queries.Window(0.0, 7 * 86400.0, 900.0)))


def scenario_checks() -> int:
    """Checks stated by a conformance scenario (docs/signals.md, "Conformance")."""
    tree = ast.parse((ROOT / "tests/conformance/test_conformance.py").read_text(encoding="utf-8"))
    not_in = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "NOT_IN_SCENARIOS" for t in n.targets))
    assert isinstance(not_in.value, ast.Dict)
    return checks_count() - len(not_in.value.keys)


# (file, pattern with one group per stated number, what each number must be). Each pattern must be found:
# a reworded statement must be registered here again.
STATED: list[tuple[str, str, tuple[Callable[[], int], ...]]] = [
    ("README.md", r"as a check \((\d+)\) or a documented non-check \((\d+),", (checks_count, non_checks_count)),
    ("README.md", r"(\d+) queries \(\+(\d+) for HTML charts\)", (lambda: report_instant_queries() + 1,
                                                                report_chart_queries)),
    ("docs/report.md", r"\*\*(\d+) instant queries\*\* — (\d+) for signals", (report_instant_queries,
                                                                              report_signal_queries)),
    ("docs/report.md", r"plus \*\*(\d+) range queries?\*\* for the HTML charts", (report_chart_queries,)),
    ("docs/report.md", r"`queries` \((\d+) for a range without changes\)", (lambda: report_instant_queries() + 1,)),
    ("docs/signals.md", r"(\d+) of the (\d+) checks are stated today", (scenario_checks, checks_count)),
    ("docs/checks.md", r"the table holds (\d+) checks and (\d+) non-checks", (checks_count, non_checks_count)),
]


@pytest.mark.parametrize(("name", "pattern", "truths"), STATED, ids=[f"{s[0]}:{s[1][:30]}" for s in STATED])
def test_each_stated_count_is_true(name: str, pattern: str, truths: tuple[Callable[[], int], ...]) -> None:
    """Counts the docs state about the product are the product's."""
    text = (ROOT / name).read_text(encoding="utf-8")
    found = list(re.finditer(pattern, text))
    assert found, f"{name}: the statement {pattern!r} is gone; register its new wording in STATED"
    for m in found:
        stated = [int(g) for g in m.groups()]
        real = [t() for t in truths]
        assert stated == real, f"{name}: {m.group(0)!r} states {stated}, the product has {real}"


# ----------------------------------------------------------------------------- names that must exist

PKG = ROOT / "exporter" / "sglang_tuning_exporter"
_PATH = re.compile(r"(?<![\w./-])((?:exporter|alerts|dashboards|deploy|docs|tests|bench|examples|scripts)"
                   r"/[\w./-]*\w)")
# A module named by its place in the package (`guide/config.py`): SGLang's files (`scheduler.py`) are named too.
_MODULE = re.compile(r"(?<![\w./])((?:core|sources|pipeline|guide|sidecar|offline|fleet|render)/[\w/]*\w\.py)\b")


def named_paths(text: str) -> set[str]:
    return {m.group(1).rstrip(".") for m in _PATH.finditer(text)}


def test_every_named_file_exists() -> None:
    """Files the docs name (`docs/interfaces.md`, `alerts/changes.rules.yaml`, `tests/...`) are in the
    repository; a module named by its place in the package (`guide/config.py`) is one of the package's."""
    modules = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")}
    missing: list[str] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for path in sorted(named_paths(text)):
            if "*" in path or "<" in path or path.endswith("/"):
                continue
            if not (ROOT / path).exists():
                missing.append(f"{rel(doc)}: {path}")
        for m in _MODULE.finditer(text):
            name = m.group(1)
            if name not in modules:
                missing.append(f"{rel(doc)}: {name}")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


def test_python_imports_shown_in_the_docs_work() -> None:
    """Every `from sglang_tuning_exporter... import ...` in a fenced block imports."""
    failures: list[str] = []
    for doc in DOCS:
        for line_no, block in fenced_blocks(doc.read_text(encoding="utf-8")):
            for i, line in enumerate(block):
                stmt = line.strip()
                if re.match(r"(from|import) sglang_tuning_exporter\b", stmt):
                    try:
                        exec(compile(stmt, f"{rel(doc)}:{line_no + i}", "exec"), {})
                    except ImportError as exc:
                        failures.append(f"{rel(doc)}:{line_no + i}: {stmt} ({exc})")
    assert not failures, "\n".join(failures)


def test_every_endpoint_and_rule_file_is_documented() -> None:
    """The sidecar's routes are in docs/sidecar.md's endpoint table; every rule file in alerts/ is in
    docs/alerts.md."""
    web = (PKG / "sidecar" / "web.py").read_text(encoding="utf-8")
    routes = set(re.findall(r'path == "(/[^"]*)"', web))
    assert {"/api/findings", "/api/changes"} <= routes
    endpoints = (ROOT / "docs/sidecar.md").read_text(encoding="utf-8").split("## Endpoints", 1)[1].split("\n## ", 1)[0]
    assert not {r for r in routes if f"| `{r}`" not in endpoints}, "routes missing from docs/sidecar.md"
    alerts_doc = (ROOT / "docs/alerts.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in (ROOT / "alerts").glob("*.rules.yaml"))
    assert [f for f in files if f"`alerts/{f}`" not in alerts_doc] == []


def test_the_checker_finds_stale_names() -> None:
    """The name checks fail on a stale path: planted names are reported."""
    assert named_paths("see `exporter/sglang_tuning_exporter/config.py` and docs/interfaces.md.") == {
        "exporter/sglang_tuning_exporter/config.py", "docs/interfaces.md"}
    assert not (ROOT / "exporter/sglang_tuning_exporter/config.py").exists()


def table_cells(line: str) -> int:
    """Cells of a Markdown table row (a `|` inside backticks or escaped does not split)."""
    count, tick, i, text = 0, False, 0, line.strip()
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "`":
            tick = not tick
        elif text[i] == "|" and not tick:
            count += 1
        i += 1
    return count - 1


def spliced_rows(text: str) -> list[tuple[int, str]]:
    """Rows whose cell count differs from their table's header (one row pasted into another table)."""
    out: list[tuple[int, str]] = []
    header: int | None = None
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, header = not fenced, None
            continue
        if fenced or not line.strip().startswith("|"):
            header = None
            continue
        cells = table_cells(line)
        if header is None:
            header = cells
        elif cells != header:
            out.append((n, line[:80]))
    return out


def test_no_table_row_is_spliced() -> None:
    """Every row of every table has its header's cells (docs/sidecar.md's Sources table once held a row of
    the Flags table, cutting the log row in two)."""
    bad = [f"{rel(doc)}:{n}: {row}" for doc in DOCS for n, row in spliced_rows(doc.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)
    planted = "| a | b |\n|---|---|\n| log | `--x` | `X` | - | y |\n| `--z` | w |\n"
    assert [n for n, _ in spliced_rows(planted)] == [3]


# ----------------------------------------------------------------------------- every command line shown

# A command line in the docs: inline code or a line of a fenced block (continued with `\`), after an optional
# `$ `; placeholders (FILE, FILE..., a.log) are kept: the parser only has to accept the flags and choices.
_COMMAND = re.compile(r"(?:^|`|\$ )sglang-tuning-exporter (serve|parse|diagnose|report|render)\b([^`\n]*)")


def command_lines(text: str) -> list[tuple[int, str, str]]:
    """(line, command, the rest) of every command line the text shows, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for m in _COMMAND.finditer(joined):
        line = joined.count("\n", 0, m.start()) + 1
        out.append((line, m.group(1), m.group(2).split(" | ")[0].split(" && ")[0].split(" # ")[0].strip()))
    return out


def refused(command: str, rest: str) -> str | None:
    """Why `sglang-tuning-exporter COMMAND REST` would be refused by its parser (None: accepted)."""
    import contextlib
    import io

    from sglang_tuning_exporter.cli import command_parser

    parser, _ = command_parser(command)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(shlex.split(rest.replace("...", "")))
    except SystemExit as exc:
        return None if exc.code == 0 else (err.getvalue().strip().splitlines() or ["refused"])[-1]
    return None


def test_every_command_line_shown_is_accepted() -> None:
    """Each `sglang-tuning-exporter ...` line in README and docs/ uses flags and values its command accepts
    (those whose output is shown also run, above): a renamed or removed flag fails here."""
    shown, problems = 0, []
    for doc in DOCS:
        for line, command, rest in command_lines(doc.read_text(encoding="utf-8")):
            shown += 1
            why = refused(command, rest)
            if why is not None:
                problems.append(f"{rel(doc)}:{line}: sglang-tuning-exporter {command} {rest}: {why}")
    assert shown >= 10, shown  # the docs show 15 today
    assert not problems, "\n".join(problems)


def test_a_planted_stale_command_line_is_refused() -> None:
    """The check can fail: a flag the command does not have, and a value outside its choices."""
    assert command_lines("run `sglang-tuning-exporter diagnose a.log --colour never` now") == [
        (1, "diagnose", "a.log --colour never")]
    assert refused("diagnose", "a.log --colour never") is not None
    assert refused("report", "--format text") is not None
    assert refused("diagnose", "a.log --format json") is None
