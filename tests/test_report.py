"""The Snakemake report (`make report`): entries, captions, table pages, provenance, and the page
itself as headless Chromium shows it after a one-table run."""

import base64
import json
import os
import re
import struct
from pathlib import Path

import jinja2
import pytest
import yaml
from docutils.core import publish_parts
from helpers import ROOT, build_targets, configs, run_snakemake

from fedrepro.reporting import browser, site
from fedrepro.reporting.make_report import build as build_report


# -- which entries, which captions ------------------------------------------------------------
def test_report_items_pick_tables_and_figures_in_paper_order(tmp_path):
    outputs = [
        "results/tables/fedmcp_table2.csv", "results/tables/fedmcp_table2.md",
        "results/tables/fedmcp_table1.md", "results/tables/fedmcp_table1.tex",
        "results/figures/fedmcp_figure3.png", "results/figures/fedmcp_figure3.csv",
        "results/tables/adafedseleckd_table10.md", "results/tables/adafedseleckd_table3.md",
        "results/human_eval/adafedseleckd", "results/stats/sources.csv",
    ]
    (tmp_path / "results/tables").mkdir(parents=True)
    (tmp_path / "results/tables/fedmcp_table1.md").write_text("x")
    items = site.report_items(outputs, root=tmp_path)
    assert [i["stem"] for i in items] == [
        "adafedseleckd_table3", "adafedseleckd_table10", "fedmcp_table1", "fedmcp_table2",
        "fedmcp_figure3",
    ]
    t1 = items[2]
    assert t1 == {
        "paper": "fedmcp", "kind": "table", "name": "table1", "stem": "fedmcp_table1",
        "source": "results/tables/fedmcp_table1.md",
        "show": "results/report/tables/fedmcp_table1.html",
        "caption": "report/fedmcp_table1.rst", "exists": True,
    }
    assert items[4]["show"] == "results/figures/fedmcp_figure3.png" and not items[4]["exists"]
    with pytest.raises(ValueError, match="fedfoo"):
        site.report_items(["results/tables/fedfoo_table1.md"])


def _config_outputs(cfg_name):
    """Every table and figure file a config's targets name (from the dry run of the full
    report target)."""
    res = run_snakemake("report_contents_full", "-n", "--configfile", f"config/{cfg_name}",
                        timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    out = res.stdout + res.stderr
    found = set(re.findall(r"results/(?:tables|figures)/\w+\.(?:md|png)", out))
    # the scorecard's own figures (results/figures/scorecard_<paper>.png) are no paper's figure
    return out, sorted(f for f in found if not f.startswith("results/figures/scorecard_"))


@pytest.mark.parametrize("cfg_name", ["config.yaml", "paper.yaml"])
def test_every_caption_renders_with_the_config_and_says_what_was_run(cfg_name):
    """Each table and figure of the config has its caption; rendered as Snakemake does (Jinja with
    the config and the report rule's params, then docutils RST -> HTML) it names the scale and the
    run, labels demo numbers as demo, and links the paper's decisions file."""
    cfg = yaml.safe_load((ROOT / "config" / cfg_name).read_text())
    out, files = _config_outputs(cfg_name)
    items = site.report_items(files)
    assert {i["paper"] for i in items} == set(site.PAPERS)
    assert len(items) >= 30
    runs = site.run_summary(cfg)

    class Params:  # what the caption sees as snakemake.params
        pass

    Params.runs = runs

    class Snakemake:
        config = cfg
        params = Params

    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for item in items:
        path = ROOT / item["caption"]
        assert path.is_file(), f"{item['stem']}: no caption {path}"
        text = env.from_string(path.read_text()).render(snakemake=Snakemake)
        body = publish_parts(text, writer="html",
                             settings_overrides={"report_level": 2, "halt_level": 2})["body"]
        assert runs[item["paper"]] in body.replace("\n", " ")
        assert f"scale {cfg['scale']}" in body
        assert ("DEMO SCALE" in body) == (cfg["scale"] == "demo")
        assert 'href="../docs/decisions' in body
    for extra in ("provenance.rst", "scorecard.rst", "scorecard_figure.rst", "workflow.rst"):
        env.from_string((ROOT / "report" / extra).read_text()).render(snakemake=Snakemake)
    # the dry run of the full report resolves the paper grid and one rendering per table
    n_tables = sum(i["kind"] == "table" for i in items)
    assert re.search(rf"^report_table_html\s+{n_tables}$", out, flags=re.MULTILINE), out[-3000:]


def test_run_summary_reads_the_config():
    demo, paper = (site.run_summary(c) for c in configs())
    assert demo["fedmcp"] == (
        "scale demo; backbone roberta-base (tiny); clients the six GLUE tasks (MRPC, RTE, SST-2, "
        "QNLI, QQP, MNLI); 5 rounds; runs (seeds) 1; engine inprocess"
    )
    assert paper["fedmcp"] == (
        "scale paper; backbone roberta-base (hub); clients the six GLUE tasks (MRPC, RTE, SST-2, "
        "QNLI, QQP, MNLI); 25 rounds; runs (seeds) 1, 2, 3; engine inprocess"
    )
    assert "bart-large (hub)" in paper["adafedseleckd"] and "seeds 1, 2, 3" in paper["adafedseleckd"]
    assert "50 clients" in paper["fedsumm"] and "4 clients" in demo["fedsumm"]


# -- a table as a page ------------------------------------------------------------------------
def test_table_page_renders_the_markdown_table_with_notes_and_escapes_html():
    md = (
        "**Table X: ours vs paper (DEMO SCALE)**\n\n> **DEMO-SCALE numbers**\n\n"
        "| Method | R-1 (ours) | R-1 (paper) |\n|---|---:|---:|\n"
        "| A <b> | 1.00 † | 2.00 |\n| B | 3.00 | 4.00 †† |\n| C | — | 5.00 |\n\nNote: † best.\n"
    )
    page = site.table_page(md, "t")
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<table>") == 1 and page.count("<tr>") == 4  # header + 3 rows
    assert page.count('<td style="text-align:right">') == 6
    assert "<blockquote>" in page and "<strong>Table X: ours vs paper (DEMO SCALE)</strong>" in page
    assert "A &lt;b&gt;" in page and "<b>" not in page.replace("<body>", "")


# -- provenance -------------------------------------------------------------------------------
def _record(meta: Path, output: str, rec: dict) -> None:
    meta.mkdir(parents=True, exist_ok=True)
    (meta / base64.urlsafe_b64encode(output.encode()).decode()).write_text(json.dumps(rec))


def test_provenance_walks_snakemake_records_and_sums_benchmarks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    meta = tmp_path / ".snakemake/metadata"
    cells = [f"results/p/m{i}/seed~1" for i in (1, 2)]
    _record(meta, "results/tables/fedmcp_table1.md",
            {"rule": "tab", "job_hash": 1, "input": [f"{c}/scores.json" for c in cells],
             "starttime": 100.0, "endtime": 102.5})
    _record(meta, "results/tables/fedmcp_table1.csv",
            {"rule": "tab", "job_hash": 1, "input": [], "starttime": 100.0, "endtime": 102.5})
    for k, c in enumerate(cells):
        _record(meta, f"{c}/scores.json", {"rule": "ev", "job_hash": 10 + k,
                                           "input": [f"{c}/model.bin", "results/data/x.jsonl"]})
        _record(meta, f"{c}/model.bin", {"rule": "tr", "job_hash": 20 + k,
                                         "input": ["results/data/x.jsonl"]})
        Path(c).mkdir(parents=True)
        Path(c, "provenance.json").write_text(json.dumps({
            "git_commit": "abc", "config_hash": f"h{k}", "engine": "inprocess",
            "cell": {"scale": "demo"},
            "machine": {"hostname": "box", "cuda": k == 1},
            "timing": {"rounds": [{"clients": [{"peak_gpu_mb": 100.0 if k == 1 else None}]}]},
        }))
        bench = Path(f"benchmarks/tr/m{k + 1}/seed~1.tsv")
        bench.parent.mkdir(parents=True)
        bench.write_text("s\th:m:s\tmax_rss\tcpu_time\n"
                         f"{10.0 * (k + 1)}\t0:00:10\t500.0\t{7.0 * (k + 1)}\n")
    patterns = {
        "tr": {"outputs": ["results/p/{method,m\\d}/seed~{seed}/model.bin"],
               "benchmark": "benchmarks/tr/{method}/seed~{seed}.tsv"},
        "ev": {"outputs": ["results/p/{method}/seed~{seed}/scores.json"], "benchmark": None},
        "tab": {"outputs": ["results/tables/fedmcp_{t}.md"], "benchmark": None},
    }
    records = site.metadata_records(meta)
    assert set(records) >= {"results/tables/fedmcp_table1.md", f"{cells[0]}/model.bin"}
    assert site.benchmark_file("tr", f"{cells[1]}/model.bin", patterns) == "benchmarks/tr/m2/seed~1.tsv"
    item = site.report_items(["results/tables/fedmcp_table1.md"])[0]
    prov = site.provenance([item], records, patterns, {"scale": "demo"}, root=".")
    (entry,) = prov["entries"]
    # tab + 2 ev + 2 tr; the data file has no record (a source)
    assert entry["jobs"] == 5 and entry["benchmarked_jobs"] == 2
    assert entry["cpu_s"] == 7.0 + 14.0
    assert entry["wall_s"] == 10.0 + 20.0 + 2.5  # two benchmarks + the table job's metadata time
    assert entry["gpu_s"] == 20.0  # the cell whose machine had CUDA and recorded GPU memory
    assert entry["git_commits"] == ["abc"] and entry["config_hashes"] == 2
    assert prov["report"]["config_hash"] == site.config_hash({"scale": "demo"})
    assert entry["cell_scales"] == ["demo"]
    page = site.provenance_page(prov)
    assert "32.5 s" in page and "21.0 s" in page and "snakemake" in page
    assert "Scale mismatch" not in page
    # the same cells reported under the paper config: the page says the captions do not fit
    paper = site.provenance([item], records, patterns, {"scale": "paper"}, root=".")
    assert "Scale mismatch" in site.provenance_page(paper)


# -- the page as a person sees it ------------------------------------------------------------
def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.e2e
@pytest.mark.slow
def test_report_after_one_table_shows_it_in_chromium(tmp_path):
    """Run one table and one figure of FedSum on the demo config in a scratch folder, make the
    report, open it in headless Chromium: exactly those two (plus provenance) are listed, the
    table shows as an HTML table with the CSV's rows, the figure's image decodes, every caption
    shows, and a screenshot is taken."""
    if browser.find_browser() is None:
        pytest.skip("no Chromium-family browser installed (tests/install_chromium.sh installs Debian's chromium, as root)")
    targets = ["fedsum_table1", "fedsum_figure4"]
    cfg, res = build_targets(tmp_path, None, targets, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    report = build_report(ROOT, Path("results/report.html"), [str(cfg)], str(tmp_path), cores="2")
    assert report == tmp_path / "results/report.html" and report.stat().st_size > 100_000
    assert not (tmp_path / "results/report.zip").exists()

    seen = browser.inspect(report)
    assert seen["errors"] == []
    assert set(seen["categories"]) == {"FedSum", "Provenance", "Scorecard"}
    assert set(seen["categories"]["FedSum"]) == {"Tables", "Figures"}
    assert "Table 1" in seen["categories"]["FedSum"]["Tables"]
    assert "Figure 4" in seen["categories"]["FedSum"]["Figures"]
    assert "Figure 4" not in seen["categories"]["FedSum"]["Tables"]
    # only what the run built: no other table or figure of the demo config
    assert set(seen["results"]) == {
        "results/report/tables/fedsum_table1.html", "results/figures/fedsum_figure4.png",
        "results/report/provenance.html", "results/report/scorecard/scorecard.html",
        "results/report/scorecard/scorecard_fedsum.png",
    }
    for path, rec in seen["results"].items():
        assert rec["caption_shown"], (path, rec)
        if rec["mime"].startswith("image/"):  # every image decodes
            assert rec["img_found"] and rec["natural_width"] > 0, (path, rec)
        else:  # every page shows a table
            assert rec["frame_found"] and rec["tables"] >= 1, (path, rec)
    table = seen["results"]["results/report/tables/fedsum_table1.html"]
    n_rows = len((tmp_path / "results/tables/fedsum_table1.csv").read_text().splitlines())
    assert table["frame_found"] and table["tables"] == 1 and table["rows"] == n_rows
    assert "FedSum Table 1" in table["frame_text"]
    figure = seen["results"]["results/figures/fedsum_figure4.png"]
    assert figure["img_found"]
    assert (figure["natural_width"], figure["natural_height"]) == _png_size(
        tmp_path / "results/figures/fedsum_figure4.png"
    )
    prov = seen["results"]["results/report/provenance.html"]
    assert prov["tables"] >= 4 and "git commit" in prov["frame_text"]
    provenance = json.loads((tmp_path / "results/report/provenance.json").read_text())
    assert [e["name"] for e in provenance["entries"]] == ["table1", "figure4"]
    # the scorecard covers the tables on disk (here FedSum's Table 1); the provenance page names
    # the config's tables not built yet
    assert "results/tables/fedmcp_table1.csv" in provenance["scorecard_missing"]
    assert "results/tables/fedsum_table1.csv" not in provenance["scorecard_missing"]
    page = (tmp_path / "results/report/provenance.html").read_text()
    assert "covers only the tables on disk" in page and "fedmcp_table1.csv" in page
    card = (tmp_path / "results/report/scorecard/scorecard.csv").read_text()
    assert ",fedsum,table1," in card and ",fedmcp," not in card
    assert all(e["benchmarked_jobs"] >= 1 and e["cpu_s"] > 0 for e in provenance["entries"])

    shot = browser.screenshot(report, tmp_path / "report.png",
                              result="results/report/tables/fedsum_table1.html")
    assert _png_size(shot) == (1400, 900) and shot.stat().st_size > 20_000
    if os.environ.get("FEDREPRO_KEEP_SCREENSHOT"):
        Path(os.environ["FEDREPRO_KEEP_SCREENSHOT"]).write_bytes(shot.read_bytes())
