#!/usr/bin/env python3
"""Release audit: which of an SGLang release's tuning-relevant messages the parser reads.

  pip download sglang==0.5.24 --no-deps -d /tmp/audit/        # never `pip install sglang`
  python3 scripts/audit_release.py /tmp/audit/sglang-0.5.24-*.whl            # report against the catalogue
  python3 scripts/audit_release.py /tmp/audit/sglang-0.5.24-*.whl --write    # and record the release in it

Every logging call (`logger.info/warning/error/...`, `*_once` helpers, `log_info_on_rank0`, `rank0_log`) and
raised message (`raise XError("...")`) under `sglang/srt` is read with `ast` (f-strings, `%`, `.format`,
concatenations), the sites passing the keyword filter (KEYWORDS) are matched with the reviewed catalogue
(audit/sglang-catalogue.yaml, keyed by file and format string), and each is rendered with plausible values
(tests/helpers/release_audit.py) and run through the project's reader, with and without SGLang's prefix.
The report lists: sites new to the catalogue (to review: `read`, `unread` or `not_relevant` with a reason),
relevant sites the parser does not read (or reads without their numbers), sites marked `read` that are no
longer read, and the per-release counts. docs/parsing.md, "Auditing a new SGLang release".
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "exporter"))

from helpers import release_audit as ra  # noqa: E402  (needs tests/ on sys.path first)

CATALOGUE = ROOT / "audit" / "sglang-catalogue.yaml"
LEVELS = {"debug": "DEBUG", "info": "INFO", "info_once": "INFO", "warning": "WARNING", "warn": "WARNING",
          "warning_once": "WARNING", "error": "ERROR", "exception": "ERROR", "critical": "CRITICAL"}
HELPERS = {"print_warning_once": ("WARNING", 0), "print_info_once": ("INFO", 0), "rank0_log": ("INFO", 0),
           "log_info_on_rank0": ("INFO", 1)}
# The keyword filter: a site is a candidate when its format string (lower-cased) holds one of these; the
# review then marks each candidate relevant (read / unread) or not_relevant with a reason.
KEYWORDS = re.compile("|".join((
    r"max[_ -]running[_ -]requests", r"max_total_num_tokens", r"max_prefill_tokens", r"chunked[_ -]prefill",
    r"out of memory", r"\boom\b", r"retract", r"mem[_-]fraction", r"(?:memory|token|kv|state|mamba|swa) pool",
    r"kv cache (?:is|pool|capacity|size)", r"\bcache size", r"mamba[_ ](?:cache|state)", r"state cache",
    r"sliding window memory", r"pool sizes?\b", r"context[_ -]length", r"\bcapped\b", r"\breduced\b",
    r"not enough (?:gpu )?memory", r"gpu memory", r"avail(?:able)? mem", r"cuda[ _-]graph.{0,40}(?:disabl|fail|max.bs)",
    r"disabl.{0,40}cuda[ _-]graph", r"radix cache.{0,30}disabl|disabl.{0,30}radix cache",
    r"server args updated", r"context override", r"^updating \{",
)), re.I)


# --------------------------------------------------------------------------------------- extraction
# Module-level string constants of the release (`CUDA_GRAPH_CAPTURE_FAILED_MSG = ("Possible solutions: ...")`):
# a message that interpolates one gets its text inlined (extract fills it before reading any site).
CONSTANTS: dict[str, str] = {}


def _constants_of(tree: ast.Module) -> None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.isupper():
            fmt = _literal(node.value)
            if fmt is not None and "{" not in fmt.replace("{{", "").replace("}}", ""):
                CONSTANTS[node.targets[0].id] = fmt


def _literal(node: ast.expr) -> str | None:
    """A message expression as a format string, or None when it is not built from literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value).replace("{", "{{").replace("}", "}}"))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in CONSTANTS \
                    and v.format_spec is None:
                out.append(CONSTANTS[v.value.id])
            elif isinstance(v, ast.FormattedValue):
                conv = "" if v.conversion == -1 else "!" + chr(v.conversion)
                spec = ""
                if v.format_spec is not None:
                    inner = _literal(v.format_spec)
                    spec = ":" + (inner or "").replace("{{", "{").replace("}}", "}")
                out.append("{" + _field(ast.unparse(v.value)) + conv + spec + "}")
        return "".join(out)
    if isinstance(node, ast.IfExp):  # `"KV cache pool is full. ..." if full else "Testing retraction. "`
        return _literal(node.body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return a + b if a is not None and b is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        base = _literal(node.left)
        if base is None:
            return None
        args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        return _percent(base, [ast.unparse(a) for a in args])
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
        return _dot_format(node.func.value.value, node)
    return None


def _field(expr: str) -> str:
    """An expression as a format field's name: the characters a format string reserves replaced."""
    return expr.translate(_RESERVED)


_RESERVED = str.maketrans({":": "\u2236", "!": "\u01c3", "{": "(", "}": ")", "[": "(", "]": ")"})
_PCT = re.compile(r"%(?:\((\w+)\))?([-+ #0]*\d*(?:\.\d+)?)([sdifrxeEgGc%])")


def _percent(fmt_escaped: str, args: list[str]) -> str:
    it = iter(args)

    def sub(m: re.Match[str]) -> str:
        if m.group(3) == "%":
            return "%"
        name = _field(m.group(1) or next(it, "arg"))
        flags, kind = m.group(2), m.group(3)
        if kind == "s":
            return "{" + name + "}"
        if kind == "r":
            return "{" + name + "!r}"
        if kind == "i":
            kind = "d"
        return "{" + name + ":" + flags + kind + "}"

    return _PCT.sub(sub, fmt_escaped)


def _dot_format(fmt: str, call: ast.Call) -> str:
    pos = [_field(ast.unparse(a)) for a in call.args]
    kw = {k.arg: _field(ast.unparse(k.value)) for k in call.keywords if k.arg}
    out, auto = [], 0
    for literal, name, spec, conv in ra._FORMATTER.parse(fmt):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is None:
            continue
        if name == "":
            expr = pos[auto] if auto < len(pos) else "arg"
            auto += 1
        elif name.isdigit():
            expr = pos[int(name)] if int(name) < len(pos) else "arg"
        else:
            expr = kw.get(name, name)
        out.append("{" + expr + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}")
    return "".join(out)


def _assigned(scope: ast.AST, name: str, before: int) -> str | None:
    """A local message variable (`msg = f"..."`, then `msg += f"..."`) as one format string: its last plain
    assignment before the call and the additions after it (optional parts included: the fullest form)."""
    parts: list[tuple[int, str, bool]] = []
    for node in ast.walk(scope):
        if getattr(node, "lineno", before) >= before:
            continue
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            fmt = _literal(node.value)
            if fmt is not None:
                parts.append((node.lineno, fmt, True))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name \
                and isinstance(node.op, ast.Add):
            fmt = _literal(node.value)
            if fmt is not None:
                parts.append((node.lineno, fmt, False))
    parts.sort()
    start = max((i for i, p in enumerate(parts) if p[2]), default=None)
    if start is None:
        return None
    return "".join(p[1] for p in parts[start:])


def _message(call: ast.Call, at: int, scope: ast.AST) -> str | None:
    if len(call.args) <= at:
        return None
    msg = call.args[at]
    extra = call.args[at + 1:]
    fmt = _assigned(scope, msg.id, call.lineno) if isinstance(msg, ast.Name) else _literal(msg)
    if fmt is not None and extra and "%" in fmt:
        fmt = _percent(fmt, [ast.unparse(a) for a in extra])
    return fmt


def sites_of(source: str, rel: str) -> list[dict[str, Any]]:
    """Every logging call and raised message of one module with a literal-built message."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[dict[str, Any]] = []
    scopes: dict[int, ast.AST] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                scopes[id(node)] = fn  # the innermost function wins: walked after its parents
    for node in ast.walk(tree):
        scope = scopes.get(id(node), tree)
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            f = node.exc.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name[:1].isupper() and node.exc.args:
                arg = node.exc.args[0]
                fmt = _assigned(scope, arg.id, node.lineno) if isinstance(arg, ast.Name) else _literal(arg)
                if fmt is not None:
                    out.append({"file": rel, "line": node.lineno, "level": "raise", "exception": name,
                                "format": fmt})
            continue
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        level, at = None, 0
        if isinstance(f, ast.Attribute) and f.attr in LEVELS and isinstance(f.value, ast.Name) \
                and "log" in f.value.id.lower():
            level = LEVELS[f.attr]
        elif isinstance(f, ast.Name) and f.id in HELPERS:
            level, at = HELPERS[f.id]
        if level is None:
            continue
        fmt = _message(node, at, scope)
        if fmt is not None:
            out.append({"file": rel, "line": node.lineno, "level": level, "format": fmt})
    return out


def _modules(source: Path) -> list[tuple[str, str]]:
    if source.is_dir():
        root = source / "sglang" / "srt" if (source / "sglang").is_dir() else source
        return [(p.relative_to(root).as_posix(), p.read_text(encoding="utf-8", errors="replace"))
                for p in sorted(root.rglob("*.py"))]
    with zipfile.ZipFile(source) as z:
        return [(name[len("sglang/srt/"):], z.read(name).decode("utf-8", "replace")) for name in sorted(z.namelist())
                if name.startswith("sglang/srt/") and name.endswith(".py")]


def extract(source: Path) -> list[dict[str, Any]]:
    """Every site under sglang/srt of a wheel (or an unpacked tree)."""
    modules = _modules(source)
    CONSTANTS.clear()
    for _, text in modules:
        try:
            _constants_of(ast.parse(text))
        except SyntaxError:
            continue
    out: list[dict[str, Any]] = []
    for rel, text in modules:
        out.extend(sites_of(text, rel))
    return out


def release_of(source: Path) -> str:
    m = re.search(r"sglang-(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)", source.name)
    if m is None:
        raise SystemExit(f"audit_release: cannot tell the release from {source.name}; pass --release")
    return m.group(1)


def candidate(site: dict[str, Any]) -> bool:
    """Passes the keyword filter (DEBUG lines are not in a default log)."""
    return site["level"] != "DEBUG" and KEYWORDS.search(site["format"]) is not None


# --------------------------------------------------------------------------------------- catalogue
def load_catalogue(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return list(doc.get("sites", []))


def key(site: dict[str, Any]) -> tuple[str, str]:
    return site["file"], site["format"]


def observe(site: dict[str, Any]) -> dict[str, Any]:
    """What the reader makes of the site now: with SGLang's prefix and bare."""
    exc = site.get("exception")
    with_prefix = ra.check(site["format"], exception=exc)
    bare = ra.check(site["format"], prefix="", exception=exc)
    return {"read": with_prefix.read and bare.read, "kind": with_prefix.kind,
            "fields": sorted(with_prefix.fields), "missing_numbers": with_prefix.missing_numbers,
            "unparsed": with_prefix.unparsed}


def merge(catalogue: list[dict[str, Any]], release: str, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The catalogue with this release's candidates recorded (new ones `unreviewed`)."""
    by_key = {key(s): s for s in catalogue}
    for s in by_key.values():
        s.setdefault("releases", {}).pop(release, None)
    for site in found:
        if not candidate(site):
            continue
        entry = by_key.get(key(site))
        if entry is None:
            entry = by_key[key(site)] = {"file": site["file"], "level": site["level"], "format": site["format"],
                                         "status": "unreviewed", "releases": {}}
            if site.get("exception"):
                entry["exception"] = site["exception"]
        entry["releases"].setdefault(release, site["line"])
    return sorted(by_key.values(), key=lambda s: (s["file"], min(s["releases"].values(), default=0), s["format"]))


def dump(catalogue: list[dict[str, Any]], path: Path) -> None:
    order = ("file", "level", "exception", "format", "releases", "status", "kind", "fields", "reason", "note")
    sites = [{k: s[k] for k in order if k in s} for s in catalogue]
    text = ("# The release audit's reviewed catalogue (scripts/audit_release.py; docs/parsing.md, \"Auditing a new\n"
            "# SGLang release\"): every site of SGLang's logging and raised messages under sglang/srt that passes the\n"
            "# keyword filter, keyed by file and format string, with the line in each audited release.\n"
            "# status: read (kind, fields: the event the parser makes of it) | unread | not_relevant (reason);\n"
            "# note: a reviewer's correction of what the extraction saw (kept by every run).\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + yaml.safe_dump({"sites": sites}, sort_keys=False, width=1000, allow_unicode=True),
                    encoding="utf-8")


def report(catalogue: list[dict[str, Any]], release: str) -> int:
    """Print the release's state; 1 when a site marked read is not read or a site is unreviewed."""
    present = [s for s in catalogue if release in s.get("releases", {})]
    counts = Counter(s["status"] for s in present)
    bad = 0
    for s in present:
        if s["status"] == "not_relevant":
            continue
        o = observe(s)
        where = f"{s['file']}:{s['releases'][release]} {s['level']}"
        if s["status"] == "read" and (not o["read"] or o["kind"] != s.get("kind")):
            bad += 1
            print(f"NO LONGER READ  {where}  {s['format'][:140]!r}  (now: {o['kind']}, missing {o['missing_numbers']})")
        elif s["status"] == "unreviewed":
            bad += 1
            state = f"read as {o['kind']}" if o["read"] else f"not read ({o['kind']}, missing {o['missing_numbers']})"
            print(f"TO REVIEW       {where}  {s['format'][:140]!r}  [{state}]")
        elif s["status"] == "unread":
            state = "now read: mark it read" if o["read"] else f"{o['kind']}, missing {o['missing_numbers']}"
            print(f"UNREAD          {where}  {s['format'][:140]!r}  [{state}]")
    print(f"sglang {release}: {len(present)} candidate sites: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("sources", nargs="*", type=Path, help="SGLang wheels (or unpacked trees)")
    ap.add_argument("--refresh", action="store_true",
                    help="offline, no wheel: mark read every `unread` site today's parser reads (kind, fields)")
    ap.add_argument("--release", help="the release of a single unpacked tree")
    ap.add_argument("--catalogue", type=Path, default=CATALOGUE)
    ap.add_argument("--write", action="store_true", help="record the releases in the catalogue")
    a = ap.parse_args(argv)
    catalogue = load_catalogue(a.catalogue)
    if a.refresh:
        for s in catalogue:
            o = observe(s) if s["status"] == "unread" else None
            if o is not None and o["read"]:
                s.update(status="read", kind=o["kind"], fields=o["fields"])
                print(f"now read: {s['file']} {s['format'][:120]!r} ({o['kind']})")
        dump(catalogue, a.catalogue)
        releases = sorted({r for s in catalogue for r in s["releases"]})
        return max((report(catalogue, r) for r in releases), default=0)
    if not a.sources:
        ap.error("give the wheels to audit, or --refresh")
    rc = 0
    for source in a.sources:
        release = a.release or release_of(source)
        found = extract(source)
        catalogue = merge(catalogue, release, found)
        print(f"sglang {release}: {len(found)} logging and raise sites under sglang/srt, "
              f"{sum(1 for s in found if candidate(s))} pass the keyword filter")
    for source in a.sources:
        rc |= report(catalogue, a.release or release_of(source))
    if a.write:
        dump(catalogue, a.catalogue)
    return rc


if __name__ == "__main__":
    sys.exit(main())
