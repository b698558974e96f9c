"""The pages of the Snakemake report (``make report``; ``rules/report.smk``).

Snakemake's own report (``snakemake --report``) shows every output marked ``report()`` with its RST
caption, category and labels, and embeds the files: an image inline, an HTML file in a frame, any
other file as a download. This module makes what Snakemake does not:

* :func:`report_items` -- which tables and figures a config's run writes, per paper, and where
  each one's HTML rendering and caption live;
* :func:`table_page` -- a paper table's Markdown file (title, notes, ours beside the paper's
  numbers; written by each paper's table rule) as a stand-alone HTML page, so that the report shows
  the table itself and not a CSV download (markdown-it-py renders it; no hand-written parser);
* :func:`run_summary` -- what a config runs per paper (scale, backbone, clients, rounds, seeds,
  engine), for the captions;
* :func:`provenance` / :func:`provenance_page` -- package versions, git commit, config hash and
  machine of the report and of every training cell, per-job wall and CPU time from Snakemake's
  ``benchmark:`` files, and total CPU/GPU time per table and figure. The jobs behind a table are
  found by walking Snakemake's own metadata records (``.snakemake/metadata``, the records that
  ``snakemake --summary`` reads) upstream from the table's file: each record names the rule and
  the input files of the job that wrote a file. A job's benchmark file is found by matching the
  written file against its rule's output pattern and filling the rule's benchmark pattern with the
  wildcards (Snakemake's own pattern functions).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedrepro.provenance import git_commit, package_versions

PAPERS = ("adafedseleckd", "fedmcp", "fedsum", "fedsumm")
PAPER_TITLES = {
    "adafedseleckd": "AdaFedSelecKD",
    "fedmcp": "FedMCP",
    "fedsum": "FedSum",
    "fedsumm": "FedSUMM",
}
# the packages whose versions the provenance page lists (beside Python)
PACKAGES = (
    "snakemake", "torch", "transformers", "tokenizers", "flwr", "ray", "numpy", "pandas",
    "matplotlib", "rouge-score", "spacy", "peft", "markdown-it-py", "docutils",
)
PAGE_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 13px;
       margin: 12px; color: #1f2328; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 7px; }
th { background: #f6f8fa; position: sticky; top: 0; }
tr:nth-child(even) td { background: #fbfbfc; }
td[style*="right"], th[style*="right"] { font-variant-numeric: tabular-nums; }
blockquote { border-left: 4px solid #d4a72c; background: #fff8c5; margin: 8px 0;
             padding: 4px 10px; }
h1, h2, h3 { font-size: 15px; }
code { background: #f6f8fa; padding: 0 3px; }
"""


# -- what a run writes -------------------------------------------------------------------------
def report_items(outputs: Iterable[str], root: str | os.PathLike = ".") -> list[dict]:
    """The report entries of a run's ``outputs`` (the tables and figures the config's targets
    name): one per table (its ``.md``, shown as ``results/report/tables/<name>.html``) and one
    per figure (its ``.png``, shown inline). Each entry has ``paper``, ``kind`` ("table" or
    "figure"), ``name`` (e.g. ``table3``), ``stem`` (``adafedseleckd_table3``), ``source`` (the
    file the paper's rule writes), ``show`` (the file the report embeds), ``caption`` (the RST
    caption under ``report/``, relative to the workflow's root) and ``exists`` (``source`` is on
    disk under ``root``)."""
    items = {}
    for f in outputs:
        p = Path(f)
        kind = {("tables", ".md"): "table", ("figures", ".png"): "figure"}.get(
            (p.parent.name, p.suffix)
        )
        if kind is None or p.parent.parent.name != "results":
            continue
        paper, _, name = p.stem.partition("_")
        if paper not in PAPERS:
            raise ValueError(f"{f}: no paper named {paper!r} (one of {', '.join(PAPERS)})")
        show = f"results/report/tables/{p.stem}.html" if kind == "table" else str(p)
        items[p.stem] = {
            "paper": paper, "kind": kind, "name": name, "stem": p.stem, "source": str(p),
            "show": show, "caption": f"report/{p.stem}.rst",
            "exists": (Path(root) / p).is_file(),
        }
    return [items[k] for k in sorted(items, key=lambda s: (s.split("_")[0], _natural(s)))]


def result_label(item: Mapping[str, Any]) -> str:
    """How the report names a table or figure: ``table3`` -> ``Table 3``, ``table_wikihow`` ->
    ``Table (wikihow)``, ``dp_tradeoff`` as it is."""
    name = item["name"]
    for word, nice in (("table", "Table "), ("figure", "Figure ")):
        if name.startswith(word):
            rest = name[len(word):].lstrip("_").replace("_", " ")
            return nice + (rest if rest[:1].isdigit() else f"({rest})" if rest else "")
    return name


def report_entries(items: Iterable[Mapping[str, Any]], scale: str,
                   scorecard_papers: Iterable[str],
                   scorecard_files: tuple[str, str] = (
                       "results/report/scorecard/scorecard.html",
                       "results/report/scorecard/scorecard_{paper}.png",
                   )) -> list[tuple[str, dict]]:
    """The arguments of Snakemake's ``report()`` flag for each report entry: (file, keywords).

    Every item of :func:`report_items` (category = the paper, subcategory = Tables / Figures,
    labels paper / result / kind / scale, its own caption), the provenance page and, where
    ``scorecard_papers`` names any paper, the scorecard of the tables on disk
    (``report_scorecard``) and its figure for each of those papers (``scorecard_files``: the page
    and the figure pattern; the full scorecard of ``rule all`` is ``results/scorecard/...``).
    Caption paths are relative to ``rules/``."""
    items = list(items)
    out = []
    for item in items:
        paper = PAPER_TITLES[item["paper"]]
        out.append((item["show"], {
            "caption": f"../{item['caption']}", "category": paper,
            "subcategory": "Tables" if item["kind"] == "table" else "Figures",
            "labels": {"paper": paper, "result": result_label(item), "kind": item["kind"],
                       "scale": scale},
        }))
    out.append(("results/report/provenance.html", {
        "caption": "../report/provenance.rst", "category": "Provenance",
        "subcategory": "Provenance", "labels": {"page": "provenance", "scale": scale},
    }))
    scorecard_papers = sorted(scorecard_papers)
    if scorecard_papers:
        out.append((scorecard_files[0], {
            "caption": "../report/scorecard.rst", "category": "Scorecard",
            "subcategory": "Scorecard", "labels": {"page": "scorecard", "scale": scale},
        }))
        for paper in scorecard_papers:
            out.append((scorecard_files[1].format(paper=paper), {
                "caption": "../report/scorecard_figure.rst", "category": "Scorecard",
                "subcategory": "Scorecard",
                "labels": {"page": PAPER_TITLES[paper], "scale": scale},
            }))
    return out


def rule_patterns(rules: Iterable[Any]) -> dict[str, dict]:
    """Each Snakemake rule's output patterns and benchmark pattern (for :func:`benchmark_file`)."""
    return {
        r.name: {"outputs": [str(o) for o in r.output],
                 "benchmark": str(r.benchmark) if r.benchmark else None}
        for r in rules
    }


def _natural(stem: str) -> tuple:
    """``table10`` after ``table9``; tables before figures."""
    name = stem.partition("_")[2]
    digits = "".join(ch for ch in name if ch.isdigit())
    return (not name.startswith("table"), int(digits) if digits else 0, name)


def run_summary(config: Mapping[str, Any]) -> dict[str, str]:
    """One line per paper saying what the config runs: scale, backbone(s) and whether they are
    tiny (demo) or the hub checkpoints, clients, rounds, seeds and federation engine."""
    backbones = config.get("backbones", {})

    def bb(names):
        names = [names] if isinstance(names, str) else list(names)
        return ", ".join(f"{n} ({backbones.get(n, {}).get('kind', '?')})" for n in names)

    def seeds(block):
        return ", ".join(map(str, block.get("seeds", config.get("seeds", []))))

    scale = config.get("scale", "?")
    out = {}
    a = config.get("adafedseleckd", {})
    if a:
        out["adafedseleckd"] = (
            f"scale {scale}; backbones {bb(a.get('backbones', []))}; clients "
            f"{', '.join(a.get('clients', []))} (partition {a.get('partition', '?')}); "
            f"{a.get('train', {}).get('rounds', '?')} rounds; seeds {seeds(config)}; "
            f"engine {a.get('engine', '?')}"
        )
    m = config.get("fedmcp", {})
    if m:
        out["fedmcp"] = (
            f"scale {scale}; backbone {bb(m.get('backbone', '?'))}; clients the six GLUE tasks "
            f"(MRPC, RTE, SST-2, QNLI, QQP, MNLI); {m.get('train', {}).get('rounds', '?')} rounds; "
            f"runs (seeds) {seeds(m)}; engine {m.get('engine', '?')}"
        )
    s = config.get("fedsumm", {})
    if s:
        kind = (s.get("backbone") or {}).get("kind", "?")
        out["fedsumm"] = (
            f"scale {scale}; backbone Chinese BART ({kind}) and the copy transformer; "
            f"{s.get('clients', '?')} clients; {s.get('train', {}).get('rounds', '?')} rounds; "
            f"seeds {seeds(s)}; engine {s.get('engine', '?')}"
        )
    f = config.get("fedsum", {})
    if f:
        out["fedsum"] = (
            f"scale {scale}; backbone {bb(f.get('backbone', '?'))} (BERTSUM); datasets "
            f"{', '.join(f.get('datasets', []))}; Dir alpha {f.get('alpha', '?')}; "
            f"{f.get('clients_per_round', '?')} clients per round; "
            f"{f.get('train', {}).get('rounds', '?')} rounds; seeds {seeds(f)}; "
            f"engine {f.get('engine', '?')}"
        )
    return out


def config_hash(config: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of the config as canonical JSON (sorted keys)."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- a table as a page -------------------------------------------------------------------------
def table_page(markdown_text: str, title: str) -> str:
    """A paper table's Markdown (pipe tables, bold title, block-quoted notes) as a stand-alone
    HTML page with its own style sheet (the report shows it in a frame)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown_text)
    return _page(title, body)


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{PAGE_CSS}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


# -- provenance --------------------------------------------------------------------------------
def metadata_records(metadata_dir: str | os.PathLike) -> dict[str, dict]:
    """Snakemake's metadata records (``.snakemake/metadata``) by the output file they describe.

    A record's file name is the urlsafe base64 of the output path, cut into chunks where it is
    longer than a file name may be (the leading chunks are folders named ``@<chunk>``)."""
    root = Path(metadata_dir)
    out: dict[str, dict] = {}
    if not root.is_dir():
        return out
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        parts = path.relative_to(root).parts
        b64 = "".join(p.removeprefix("@") for p in parts)
        try:
            name = base64.urlsafe_b64decode(b64.encode()).decode()
            record = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue  # not a record (Snakemake keeps nothing else here, but be lenient)
        out[name] = record
    return out


def upstream_jobs(path: str, records: Mapping[str, dict]) -> dict[tuple, dict]:
    """The Snakemake jobs that ``path`` was made from (``path``'s own job included), keyed by
    (rule, job hash): each with the rule, one file it wrote, start and end times. Files without a
    record (sources, or made before Snakemake kept records) end the walk."""
    jobs: dict[tuple, dict] = {}
    seen: set[str] = set()
    todo = [str(path)]
    while todo:
        f = os.path.normpath(todo.pop())
        if f in seen:
            continue
        seen.add(f)
        rec = records.get(f)
        if rec is None:
            continue
        key = (rec.get("rule"), rec.get("job_hash"))
        job = jobs.setdefault(key, {
            "rule": rec.get("rule"), "output": f, "starttime": rec.get("starttime"),
            "endtime": rec.get("endtime"),
        })
        job["output"] = min(job["output"], f)
        inputs = rec.get("input") or []
        if isinstance(inputs, str):  # very old records kept the list as text
            continue
        todo.extend(inputs)
    return jobs


def benchmark_file(rule: str, output: str, patterns: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The benchmark file of the job of ``rule`` that wrote ``output``: the wildcards of the
    first output pattern of the rule that matches, filled into the rule's benchmark pattern
    (``None`` where the rule keeps no benchmark or no pattern matches)."""
    import re

    from snakemake.io import apply_wildcards, regex_from_filepattern

    spec = patterns.get(rule) or {}
    bench = spec.get("benchmark")
    if not bench:
        return None
    for pat in spec.get("outputs", []):
        m = re.match(regex_from_filepattern(pat), output)
        if m:
            return apply_wildcards(bench, m.groupdict())
    return None


def read_benchmark(path: str | os.PathLike) -> dict | None:
    """The last row of a Snakemake benchmark TSV as numbers (``s``, ``cpu_time``, ``max_rss``, ...)
    or ``None`` when there is none."""
    p = Path(path)
    if not p.is_file():
        return None
    lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    head, row = lines[0].split("\t"), lines[-1].split("\t")
    out = {}
    for k, v in zip(head, row):
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = None if v in ("", "NA", "-") else v
    return out


def _cell_provenance(output: str) -> dict | None:
    prov = Path(output).parent / "provenance.json"
    if prov.is_file():
        try:
            return json.loads(prov.read_text())
        except ValueError:
            return None
    return None


def _used_gpu(prov: dict | None) -> bool:
    """A cell ran on a GPU where its machine had CUDA and a round recorded GPU memory."""
    if not prov or not (prov.get("machine") or {}).get("cuda"):
        return False
    rounds = (prov.get("timing") or {}).get("rounds") or []
    return any(c.get("peak_gpu_mb") for r in rounds for c in r.get("clients", []))


def machine() -> dict:
    """This machine: host, platform, CPUs, memory and GPU (``torch`` is asked only if installed)."""
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        mem_gb = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        gpu = "unknown (torch not installed)"
    return {"hostname": platform.node(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "memory_gib": mem_gb, "gpu": gpu}


def provenance(
    items: Iterable[Mapping[str, Any]],
    records: Mapping[str, dict],
    patterns: Mapping[str, Mapping[str, Any]],
    config: Mapping[str, Any],
    root: str | os.PathLike = ".",
    scorecard_missing: list[str] | None = None,
) -> dict:
    """The provenance of a report: this checkout and machine, and per table/figure the jobs it
    was made from with their benchmark wall and CPU time, the GPU time of the jobs that ran on a
    GPU, and the distinct git commits, config hashes, engines and machines of its training cells.
    Paths are relative to ``root`` (the workflow's working directory). ``scorecard_missing``:
    the config's tables not on disk, which the report's scorecard (over the tables on disk)
    therefore does not cover (``[]``: it covers every table of the config)."""
    root = Path(root)
    entries = []
    for item in items:
        jobs = upstream_jobs(item["source"], records)
        rows = []
        for (rule, _), job in sorted(jobs.items(), key=lambda kv: (kv[0][0] or "", kv[1]["output"])):
            bfile = benchmark_file(rule, job["output"], patterns)
            bench = read_benchmark(root / bfile) if bfile else None
            prov = _cell_provenance(str(root / job["output"]))
            wall = bench.get("s") if bench else None
            if wall is None and job["starttime"] and job["endtime"]:
                wall = job["endtime"] - job["starttime"]
            rows.append({
                "rule": rule, "output": job["output"], "benchmark": bfile,
                "wall_s": wall, "cpu_s": bench.get("cpu_time") if bench else None,
                "max_rss_mb": bench.get("max_rss") if bench else None,
                "gpu": _used_gpu(prov), "timed_by": "benchmark" if bench else "metadata",
                "git_commit": prov.get("git_commit") if prov else None,
                "config_hash": prov.get("config_hash") if prov else None,
                "engine": prov.get("engine") if prov else None,
                "host": ((prov.get("machine") or {}).get("hostname")) if prov else None,
                "scale": ((prov.get("cell") or {}).get("scale")) if prov else None,
            })

        def total(key, rows=rows):
            return round(sum(r[key] or 0.0 for r in rows), 2)

        entries.append({
            "paper": item["paper"], "kind": item["kind"], "name": item["name"],
            "source": item["source"], "jobs": len(rows),
            "benchmarked_jobs": sum(r["timed_by"] == "benchmark" for r in rows),
            "wall_s": total("wall_s"), "cpu_s": total("cpu_s"),
            "gpu_s": round(sum(r["wall_s"] or 0.0 for r in rows if r["gpu"]), 2),
            "git_commits": sorted({r["git_commit"] for r in rows if r["git_commit"]}),
            "config_hashes": len({r["config_hash"] for r in rows if r["config_hash"]}),
            "engines": sorted({r["engine"] for r in rows if r["engine"]}),
            "hosts": sorted({r["host"] for r in rows if r["host"]}),
            "cell_scales": sorted({r["scale"] for r in rows if r["scale"]}),
            "job_rows": rows,
        })
    return {
        "report": {
            "git_commit": git_commit(root), "config_hash": config_hash(config),
            "scale": config.get("scale"), "machine": machine(), "packages": package_versions(PACKAGES),
        },
        "run": run_summary(config),
        "entries": entries,
        "scorecard_missing": None if scorecard_missing is None else list(scorecard_missing),
        "notes": [
            ("Wall and CPU time per job are Snakemake's benchmark files (benchmarks/); jobs "
             "without one (tables, figures, data preparation) are timed from Snakemake's "
             "metadata (start to end)."),
            ("GPU time is the wall time of the training and evaluation jobs whose cell recorded "
             "GPU memory on a CUDA machine (provenance.json); 0 on a CPU-only run."),
            "A job shared by several tables (a backbone, a partition, a cell) counts in each.",
        ],
    }


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "—"
    s = float(s)
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def _table(head: list[str] | None, rows: list[list[Any]], right: Iterable[int] = ()) -> str:
    right = set(right)
    esc = html.escape

    def cell(tag, i, v):
        style = ' style="text-align: right; white-space: nowrap"' if i in right else ""
        return f"<{tag}{style}>{esc(str(v))}</{tag}>"

    out = ["<table>"]
    if head:
        out.append("<thead><tr>" + "".join(cell("th", i, h) for i, h in enumerate(head))
                   + "</tr></thead>")
    out.append("<tbody>")
    for r in rows:
        out.append("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def provenance_page(prov: Mapping[str, Any]) -> str:
    """:func:`provenance` as an HTML page: this checkout, the run per paper, time per table and
    figure, the package versions, and each table's jobs."""
    rep = prov["report"]
    esc = html.escape
    parts = ["<h1>Provenance</h1>"]
    mach = rep["machine"]
    parts.append(_table(None, [
        ["git commit (report)", rep["git_commit"]],
        ["config hash (report)", rep["config_hash"]],
        ["scale", rep["scale"]],
        ["machine (report)", (f"{mach['hostname']}: {mach['cpus']} CPUs, "
                              f"{mach['memory_gib']} GiB, GPU {mach['gpu']}; {mach['platform']}")],
    ]))
    odd = [f"{PAPER_TITLES.get(e['paper'], e['paper'])} {e['name']} ({', '.join(e['cell_scales'])})"
           for e in prov["entries"] if set(e["cell_scales"]) - {rep["scale"]}]
    if odd:
        parts.append(
            "<blockquote><strong>Scale mismatch</strong>: the report's config is "
            f"<code>scale: {esc(str(rep['scale']))}</code> but these results were made by cells "
            f"of another scale, so their captions describe a run they did not come from: "
            f"{esc('; '.join(odd))}. Make the report with the config of the run "
            "(<code>make report CONFIG=...</code>).</blockquote>"
        )
    missing = prov.get("scorecard_missing")
    if missing:
        parts.append(
            "<blockquote><strong>The scorecard covers only the tables on disk</strong>: "
            f"{len(missing)} tables of the config are not built yet: "
            f"{esc(', '.join(missing))}. Build them (<code>make demo</code>, or their targets) "
            "and make the report again to score them too.</blockquote>"
        )
    parts.append("<h2>What was run</h2>")
    parts.append(_table(["paper", "run"], [[PAPER_TITLES.get(p, p), s]
                                          for p, s in prov["run"].items()]))
    parts.append("<h2>Time per table and figure</h2>")
    parts.append(_table(
        ["paper", "table / figure", "jobs", "benchmarked", "wall", "CPU", "GPU",
         "git commits of its cells", "cell configs (distinct hashes)", "engines", "hosts"],
        [[PAPER_TITLES.get(e["paper"], e["paper"]), e["name"], e["jobs"], e["benchmarked_jobs"],
          _fmt_s(e["wall_s"]), _fmt_s(e["cpu_s"]), _fmt_s(e["gpu_s"]),
          ", ".join(c[:12] for c in e["git_commits"]) or "—", e["config_hashes"],
          ", ".join(e["engines"]) or "—", ", ".join(e["hosts"]) or "—"]
         for e in prov["entries"]],
        right=(2, 3, 4, 5, 6, 8),
    ))
    parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in prov["notes"]) + "</ul>")
    parts.append("<h2>Packages (report)</h2>")
    parts.append(_table(["package", "version"], [[k, v] for k, v in rep["packages"].items()]))
    parts.append("<h2>Jobs per table and figure</h2>")
    for e in prov["entries"]:
        parts.append(f"<details><summary>{esc(PAPER_TITLES.get(e['paper'], e['paper']))} "
                     f"{esc(e['name'])}: {e['jobs']} jobs</summary>")
        parts.append(_table(
            ["rule", "a file it wrote", "wall", "CPU", "max RSS (MB)", "GPU", "timed by"],
            [[r["rule"], r["output"], _fmt_s(r["wall_s"]), _fmt_s(r["cpu_s"]),
              "—" if r["max_rss_mb"] is None else f"{r['max_rss_mb']:.0f}",
              "yes" if r["gpu"] else "no", r["timed_by"]] for r in e["job_rows"]],
            right=(2, 3, 4),
        ))
        parts.append("</details>")
    return _page("Provenance", "\n".join(parts))




