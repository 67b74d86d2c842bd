"""The self-contained HTML report, checked as a file and in headless Chromium.

The browser tests carry the ``browser`` marker: they need Chromium (``apt-get install -y
chromium``) and fail, never skip, when it is missing. A small harness is injected around the
report: before it, a script that records every error and ``console.error``; after it, a script
that clicks the first collapsed toggle and counts the visible rows. Chromium's ``--dump-dom``
gives back the page after the scripts ran.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyhpctk.cli.pyview import main
from pyhpctk.present import open_database
from pyhpctk.present.html import render_html

BEFORE = (
    "<script>window.__errors=[];"
    'window.addEventListener("error",function(e){window.__errors.push(String(e.message));});'
    "var __ce=console.error;console.error=function(){"
    'window.__errors.push(Array.prototype.join.call(arguments," "));};</script>'
)
AFTER = r"""<script>
(function () {
  var out = {};
  try {
    var rows = document.querySelectorAll("#tree-body tr");
    var visible = function () {
      return Array.prototype.filter.call(rows, function (r) { return r.style.display !== "none"; })
        .length;
    };
    out.rows = rows.length;
    out.before = visible();
    var toggles = Array.prototype.filter.call(
      document.querySelectorAll("#tree-body .toggle"),
      function (t) {
        return t.textContent === "\u25B8" && t.closest("tr").style.display !== "none";
      });
    out.collapsed = toggles.length;
    if (toggles.length) {
      var id = Number(toggles[0].closest("tr").dataset.id);
      toggles[0].click();
      out.after = visible();
      out.opened = id;
      toggles[0].click();
      out.again = visible();
    }
    out.flame = document.querySelectorAll("#flame .fl").length;
    out.lanes = document.querySelectorAll("#timeline canvas").length;
    out.ready = document.body.dataset.ready || null;
  } catch (e) { window.__errors.push("harness: " + e); }
  out.errors = window.__errors;
  var pre = document.createElement("pre");
  pre.id = "harness";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("the browser tests need Chromium: apt-get install -y chromium (marker: browser)")


def run_in_browser(page: str, tmp_path: Path) -> dict[str, Any]:
    html_file = tmp_path / "page.html"
    html_file.write_text(
        page.replace("<head>", "<head>" + BEFORE, 1).replace("</body>", AFTER + "</body>", 1),
        encoding="utf-8",
    )
    result = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            html_file.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = re.search(r'<pre id="harness">(.*?)</pre>', result.stdout, re.S)
    assert found, f"the page did not run: {result.stderr[-2000:]}"
    data: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return data


def report(reference: Path, name: str) -> tuple[str, int]:
    db = open_database(reference / "dbase" / name)
    view = db.view("top-down")
    return render_html(db, view), sum(1 for _ in view.root.walk())


def test_report_is_self_contained(reference: Path) -> None:
    page, _ = report(reference, "loops-cputime-t.d")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "@import" not in page
    embedded = re.search(r'id="report-data">(.*?)</script>', page, re.S)
    assert embedded is not None
    data = json.loads(embedded.group(1))
    assert data["tree"]["nodes"][0]["l"] == "testmeas-loops"
    assert len(data["timeline"]["rows"]) == 4


def test_report_escapes_script_endings(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.d")
    view = db.view("top-down")
    view.root.label = "</script><b>x"
    page = render_html(db, view)
    assert page.count("</script>") == 2  # the data block and the code block, nothing else


def test_cli_writes_the_report(reference: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    assert main([str(reference / "dbase" / "small.d"), "--html", str(target)]) == 0
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


@pytest.mark.browser
@pytest.mark.parametrize("name", ["loops-cputime-t.d", "loops-cuda-nvidiapc-t.d", "small.d"])
def test_report_renders_and_expands_in_chromium(reference: Path, tmp_path: Path, name: str) -> None:
    page, n_rows = report(reference, name)
    result = run_in_browser(page, tmp_path)
    assert result["errors"] == []
    assert result["ready"] == "yes"
    assert result["rows"] == n_rows
    assert result["flame"] > 0
    assert result["lanes"] == (4 if name == "loops-cputime-t.d" else 1 if name == "small.d" else 2)
    if result["collapsed"]:
        assert result["after"] > result["before"]  # the click expanded the tree
        assert result["again"] == result["before"]  # and a second click folded it back


@pytest.mark.browser
def test_browser_harness_catches_script_errors(reference: Path, tmp_path: Path) -> None:
    page, _ = report(reference, "small.d")
    broken = page.replace('"use strict";', '"use strict"; console.error("boom"); nosuch();', 1)
    result = run_in_browser(broken, tmp_path)
    assert "boom" in result["errors"]
    assert any("nosuch" in e for e in result["errors"])
    assert result["ready"] is None


def test_huge_trees_are_cut_for_the_report(
    reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyhpctk.present import html as report

    db = open_database(reference / "dbase" / "loops-cputime-t.d")
    full = sum(1 for _ in db.view("top-down").root.walk())
    monkeypatch.setattr(report, "LARGE_TREE_ROWS", 20)
    view = report.report_view(db, None, None, None, 0.0, False)
    rows = sum(1 for _ in view.root.walk())
    assert rows < full
    assert "small scopes hidden)" in render_html(db, view)
    chosen = report.report_view(db, None, None, None, 0.5, False)  # the user's threshold wins
    assert sum(1 for _ in chosen.root.walk()) > rows
