"""Headless Debian chromium for the page tests: the binary, a run, and a probe that lays a page out in a
frame of a given width (a phone is 390 px) and reports what sticks out to the right."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# In the frame: the page's own scroll width, and every table, svg, pre or img whose right edge passes the
# frame's width without an ancestor that scrolls it sideways inside the width (a wide table in an
# `overflow-x: auto` box is fine: it scrolls in its box, the page does not).
_PROBE = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="{src}" style="width:{w}px;height:900px;border:0"></iframe>
<script>
document.getElementById('f').onload = function () {{
  var d = this.contentDocument, w = {w}, bad = [];
  var boxed = function (el) {{
    for (var p = el.parentElement; p && p !== d.body; p = p.parentElement) {{
      var o = d.defaultView.getComputedStyle(p).overflowX;
      if ((o === 'auto' || o === 'scroll') && p.getBoundingClientRect().right <= w + 0.5) return true;
    }}
    return false;
  }};
  d.querySelectorAll('table, svg, pre, img, h1, h2, h3, p, li').forEach(function (el) {{
    if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') return;
    if (el.getBoundingClientRect().right > w + 0.5 && !boxed(el))
      bad.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
               (el.getAttribute('class') ? '.' + el.getAttribute('class') : ''));
  }});
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({{scroll: d.documentElement.scrollWidth, tables: d.querySelectorAll('table').length,
                                     outside: bad.slice(0, 20)}});
  document.body.appendChild(out);
}};
</script></body></html>"""


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless chromium run with a fresh profile under `tmp`, nothing fetched from outside."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def layout(tmp: Path, page: str, width: int) -> dict[str, Any]:
    """Lay `page` (an HTML document) out `width` px wide: {scroll, tables, outside: [elements past the edge]}."""
    (tmp / "page.html").write_text(page, encoding="utf-8")
    probe = tmp / f"probe-{width}.html"
    probe.write_text(_PROBE.format(src="page.html", w=width), encoding="utf-8")
    proc = chromium(tmp, "--allow-file-access-from-files", "--dump-dom", "--virtual-time-budget=5000",
                    probe.as_uri())
    text = proc.stdout.split('<pre id="probe">', 1)[-1].split("</pre>", 1)[0]
    assert text.startswith("{"), proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(text.replace("&quot;", '"').replace("&amp;", "&"))
    return out
