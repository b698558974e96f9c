"""Look at the Snakemake report the way a person does: in a browser (headless Chromium).

Snakemake's report is a React page whose results are embedded as data URIs. :func:`inspect`
opens a copy of it in headless Chromium with a small script appended that, after the page has
rendered, goes through the menu as a reader would: opens each category (paper), lists the entries
the page shows, opens every result in the content pane (an image as the page's ``<img>``, an HTML
table in the page's frame) and records whether the image decoded (``naturalWidth``) and how many
table rows the frame shows. Chromium prints the DOM afterwards (``--dump-dom``), from which the
script's JSON is read back. :func:`screenshot` opens one result the same way and saves a PNG.

No browser automation library is needed: Chromium's command line (``--headless``,
``--virtual-time-budget``, ``--dump-dom``, ``--screenshot``) runs the page's own JavaScript.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
          "--allow-file-access-from-files", "--disable-dev-shm-usage")

_PROBE = r"""
<script>
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const out = { categories: {}, shown: {}, results: {}, errors: [] };
  try {
    for (let i = 0; i < 100 && typeof app === "undefined"; i++) await sleep(50);
    for (const cat of Object.keys(categories)) {
      app.showCategory(cat);
      await sleep(300);
      out.categories[cat] = {};
      for (const sub of Object.keys(categories[cat])) {
        // as a reader: back to the paper's page, then into the subcategory (a fresh list)
        app.setView({ navbarMode: "category", category: cat });
        await sleep(200);
        app.setView({ navbarMode: "subcategory", category: cat, subcategory: sub });
        await sleep(300);
        out.categories[cat][sub] = document.body.innerText;
      }
    }
    for (const [path, entry] of Object.entries(results)) {
      const rec = { name: entry.name, mime: entry.mime_type, labels: entry.labels,
                    caption_chars: (entry.caption || "").length };
      app.showResultInfo(path);
      await sleep(200);
      const squash = (t) => (t || "").replace(/\s+/g, " ").trim();
      const capDoc = new DOMParser().parseFromString(entry.caption || "", "text/html");
      const first = capDoc.querySelector("strong, p");
      rec.caption_title = squash(first ? first.textContent : "");
      rec.caption_shown = rec.caption_title.length > 0
        && squash(document.body.innerText).includes(rec.caption_title);
      if (entry.mime_type.startsWith("image/")) {
        app.setView({ content: "img", contentPath: entry.data_uri });
        let img = null;
        for (let i = 0; i < 100; i++) {
          await sleep(50);
          img = document.querySelector('img[src="' + entry.data_uri + '"]');
          if (img && img.complete) break;
        }
        rec.img_found = !!img;
        rec.natural_width = img ? img.naturalWidth : 0;
        rec.natural_height = img ? img.naturalHeight : 0;
      } else if (entry.mime_type === "text/html") {
        app.setView({ content: "html", contentPath: entry.data_uri });
        let frame = null;
        for (let i = 0; i < 100 && !frame; i++) {
          await sleep(50);
          frame = document.querySelector('iframe[src="' + entry.data_uri + '"]');
        }
        rec.frame_found = !!frame;
        // a data: frame is opaque to the page (another origin): read the document it shows
        const text = await (await fetch(entry.data_uri)).text();
        const d = new DOMParser().parseFromString(text, "text/html");
        rec.tables = d.querySelectorAll("table").length;
        rec.rows = d.querySelectorAll("tr").length;
        rec.frame_text = d.body.innerText.slice(0, 300);
      }
      out.results[path] = rec;
    }
  } catch (err) {
    out.errors.push(String(err && err.stack || err));
  }
  const pre = document.createElement("pre");
  pre.id = "fedrepro-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""

_SHOW = r"""
<script>
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  for (let i = 0; i < 100 && typeof app === "undefined"; i++) await sleep(50);
  const path = __PATH__;
  const entry = results[path];
  const cat = Object.keys(categories).find((c) =>
    Object.values(categories[c]).some((s) => Object.values(s).includes(path)
      || JSON.stringify(s).includes(JSON.stringify(path))));
  if (cat) { app.showCategory(cat); await sleep(300); }
  app.showResultInfo(path);
  await sleep(300);
  app.setView({ content: entry.mime_type.startsWith("image/") ? "img" : "html",
                contentPath: entry.data_uri });
})();
</script>
"""


class BrowserMissing(RuntimeError):
    """No Chromium-family browser on PATH."""


def find_browser() -> str | None:
    """The first Chromium-family browser on PATH, or ``None``."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _with_script(report: Path, script: str, folder: Path) -> Path:
    text = Path(report).read_text(encoding="utf-8")
    if "</body>" not in text:
        raise ValueError(f"{report}: no </body>; is it a Snakemake HTML report (not a .zip)?")
    head, _, tail = text.rpartition("</body>")
    page = folder / "page.html"
    page.write_text(head + script + "</body>" + tail, encoding="utf-8")
    return page


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    browser = find_browser()
    if browser is None:
        raise BrowserMissing(
            "no Chromium-family browser on PATH (tried " + ", ".join(BROWSERS) + "); "
            "install one, e.g. `apt-get install -y chromium`"
        )
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, *_FLAGS, f"--user-data-dir={profile}", *args],
            check=False, capture_output=True, text=True, timeout=timeout,
        )


def inspect(report: str | Path, budget_ms: int = 60000, timeout: int = 300) -> dict:
    """Open ``report`` in headless Chromium and return what a reader sees (see the module
    docstring): ``categories`` (category -> subcategory -> the page's text there), ``results``
    (path -> name, MIME type, labels, whether the caption shows, and ``natural_width`` for an
    image or ``tables``/``rows`` for an HTML page) and ``errors`` (JavaScript errors)."""
    with tempfile.TemporaryDirectory() as tmp:
        page = _with_script(Path(report), _PROBE, Path(tmp))
        res = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", page.as_uri()], timeout)
    m = re.search(r'<pre id="fedrepro-probe">(.*?)</pre>', res.stdout, flags=re.DOTALL)
    if m is None:
        raise RuntimeError(
            f"{report}: the probe wrote nothing (the page did not finish in {budget_ms} ms of "
            f"virtual time?); browser said: {res.stderr[-2000:]}"
        )
    import html

    return json.loads(html.unescape(m.group(1)))


def screenshot(report: str | Path, png: str | Path, result: str | None = None,
               size: tuple[int, int] = (1400, 900), budget_ms: int = 15000,
               timeout: int = 180) -> Path:
    """Save a PNG of ``report`` as Chromium shows it; with ``result`` (a path as the report lists
    it, e.g. ``results/report/tables/fedmcp_table1.html``), with that result open."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = _SHOW.replace("__PATH__", json.dumps(result)) if result else ""
        page = _with_script(Path(report), script, Path(tmp))
        res = _run([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
                    f"--screenshot={png}", page.as_uri()], timeout)
    if not png.is_file():
        raise RuntimeError(f"{report}: Chromium wrote no screenshot; it said: {res.stderr[-2000:]}")
    return png
