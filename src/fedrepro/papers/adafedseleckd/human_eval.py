"""The human-evaluation kit of AdaFedSelecKD's Fig. 5 (§V-A.2): build it, then count the judgements.

Protocol (paper, §V-A.2 "Human Evaluation")
-------------------------------------------
"20 meetings are randomly selected per domain, amounting to 60 meetings in total. For each
meeting, we generate its meeting summary based on four methods: AdaCentralized, AdaFedAvg,
AdaFedKD and AdaFedSelectKD. Each evaluator is provided with the meeting and a pair of summaries
generated based on AdaFedSelectKD and another method respectively, in random order. The evaluator
determines which summary is better (wins) or decides a tie between the two summaries according to
domain expertise, informativeness and factual correctness of summaries." Wins, ties and losses are
counted per compared method and averaged over the three evaluators (Fig. 5).

QMSum test examples are *queries* on meetings (several example ids share one meeting), and a
summary answers one query, so the kit samples **examples** (ids) per domain: ``per_domain`` of each
client's ``test.jsonl`` (20 → 60 examples, 180 pairs with three compared methods).

Workflow
--------
1. :func:`build_kit` writes, from every method's ``predictions.jsonl`` and every client's
   ``test.jsonl``::

       <out_dir>/sheet.csv      item_id, domain, query, meeting, summary_A, summary_B, judgement
       <out_dir>/form.html      the same items as a self-contained form (downloads a CSV)
       <out_dir>/README.txt     instructions for the evaluators (the paper's criteria)
       <out_dir>/key/key.json   item -> example id, side of the proposed method, compared method

   Give evaluators ``sheet.csv`` *or* ``form.html`` plus ``README.txt`` -- never the ``key/``
   folder. The sheet and form carry opaque item ids (``H0001`` ...) and no method name.
2. Each evaluator fills the ``judgement`` column with ``A``, ``B`` or ``tie`` (or uses the form's
   download button, which writes ``item_id,judgement``).
3. :func:`aggregate` validates the filled sheets against the key and returns the Fig. 5 counts;
   :func:`write_figure5` writes them as csv / md / png beside the paper values the text gives
   (:data:`PAPER_FIGURE5`).

CLI::

    python -m fedrepro.papers.adafedseleckd.human_eval kit --out DIR \\
        --pred AdaFedSelectKD=P1.jsonl --pred AdaFedAvg=P2.jsonl ... \\
        --meetings Academic=A/test.jsonl --meetings Committee=C/test.jsonl ...
    python -m fedrepro.papers.adafedseleckd.human_eval aggregate --key DIR/key/key.json \\
        --out-prefix results/figure5 --scale paper SHEET1.csv SHEET2.csv SHEET3.csv
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import logging
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from fedrepro.data.sources.qmsum import SEP
from fedrepro.io import (
    InputError,
    atomic_path,
    iter_jsonl,
    read_json,
    write_json_atomic,
    write_text_atomic,
)
from fedrepro.reporting.tables import SCALES

__all__ = [
    "COMPARED",
    "CRITERIA",
    "PAPER_FIGURE5",
    "PAPER_FIGURE5_QUOTES",
    "PROPOSED",
    "SHEET_COLUMNS",
    "aggregate",
    "build_kit",
    "count_judgements",
    "main",
    "write_figure5",
]

log = logging.getLogger(__name__)

PAPER = "adafedseleckd"
PROPOSED = "AdaFedSelectKD"
COMPARED: tuple[str, ...] = ("AdaCentralized", "AdaFedAvg", "AdaFedKD")
"""The methods AdaFedSelectKD is compared with in Fig. 5, in the figure's order."""

CRITERIA: tuple[str, ...] = ("domain expertise", "informativeness", "factual correctness")
"""The judging criteria of §V-A.2."""

SHEET_COLUMNS: tuple[str, ...] = (
    "item_id", "domain", "query", "meeting", "summary_A", "summary_B", "judgement",
)
"""Columns of ``sheet.csv``. ``aggregate`` needs only ``item_id`` and ``judgement``."""

JUDGEMENTS = ("A", "B", "tie")

PAPER_FIGURE5_QUOTES: tuple[str, ...] = (
    ("Fig. 5 caption: \"Generated meeting summary comparison of ADAFEDSELECTKD with other methods "
    "on 60 randomly-chosen meetings. For example, compared with ADAFEDSELECTKD, ADAFEDAVG "
    "performs better on 4 of the 60 summaries and worse on 52.\""),
    ("§V-A.2: \"our method exhibits an impressive win rate of up to 87% vis-à-vis the baseline "
    "ADAFEDAVG method. It is noteworthy that ADAFEDSELECTKD achieves competitive results compared "
    "with the strong ADACENTRALIZED, with a 43% win rate.\""),
)
"""The only sentences of the paper that give Fig. 5 numbers (the figure's bars are not in the
text; the packaged reference CSV has no Fig. 5 rows)."""

PAPER_FIGURE5: dict[str, dict[str, float | None]] = {
    "AdaCentralized": {"wins": None, "ties": None, "losses": None, "wins_pct": 43.0},
    "AdaFedAvg": {"wins": 52.0, "ties": 4.0, "losses": 4.0, "wins_pct": 87.0},
    "AdaFedKD": {"wins": None, "ties": None, "losses": None, "wins_pct": None},
}
"""Fig. 5 values the paper's text gives, from AdaFedSelectKD's side, out of 60 pairs per compared
method (mean over the three evaluators); ``None`` = not given in the text (see
:data:`PAPER_FIGURE5_QUOTES`).

* AdaFedAvg: "performs better on 4 of the 60 summaries and worse on 52" → losses 4, wins 52; ties
  ``60 - 52 - 4 = 4`` are *derived*, not stated; "win rate of up to 87%" (52/60 = 86.7 %).
* AdaCentralized: "a 43% win rate"; its counts are not given.
* AdaFedKD: no number in the text.
"""


# ----------------------------------------------------------------------------- inputs


def _read_test_file(client: str, path: Path) -> dict[str, dict]:
    """id -> {"query", "meeting"} of one client's test file (record schema of the data layer)."""
    out: dict[str, dict] = {}
    for lineno, rec in iter_jsonl(path, what="a JSON object (one test example)"):
        if "id" not in rec or rec["id"] in (None, ""):
            raise InputError(f"{path}:{lineno}: record has no 'id'")
        rid = str(rec["id"])
        # The data layer's records keep the model input in "input" ("source" names the corpus);
        # plain {"id", "source", "target"} files hold the text in "source".
        text = rec.get("input")
        if text is None:
            text = rec.get("source")
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{path}:{lineno}: record {rid!r} has no meeting text "
                             "(expected a non-empty string in 'input' or 'source')")
        if rid in out:
            raise InputError(f"{path}:{lineno}: duplicate id {rid!r}")
        query, sep, meeting = text.partition(f" {SEP} ")
        if not sep:
            query, meeting = "", text
        out[rid] = {"query": query.strip(), "meeting": meeting.strip(), "client": client}
    return out


def _read_predictions(method: str, path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for lineno, rec in iter_jsonl(path, what="a JSON object (one prediction)"):
        if "id" not in rec or rec["id"] in (None, ""):
            raise InputError(f"{path}:{lineno}: prediction row has no 'id' (method {method})")
        rid = str(rec["id"])
        pred = rec.get("prediction")
        if not isinstance(pred, str):
            raise InputError(f"{path}:{lineno}: 'prediction' of {rid!r} must be a string, "
                             f"got {type(pred).__name__}")
        if rid in out:
            raise InputError(f"{path}:{lineno}: duplicate id {rid!r} (method {method})")
        out[rid] = pred
    return out


def _preview(ids: Sequence[str], n: int = 5) -> str:
    ids = sorted(ids)
    more = f" and {len(ids) - n} more" if len(ids) > n else ""
    return ", ".join(ids[:n]) + more


def _check_methods(predictions: Mapping[str, object], compared: Sequence[str],
                   proposed: str) -> list[str]:
    compared = list(compared)
    if not compared:
        raise InputError("build_kit: 'compared' is empty; name at least one method")
    if len(set(compared)) != len(compared):
        raise InputError(f"build_kit: 'compared' repeats a method: {compared}")
    if proposed in compared:
        raise InputError(f"build_kit: the proposed method {proposed!r} is also in 'compared'")
    missing = [m for m in [proposed, *compared] if m not in predictions]
    if missing:
        raise InputError(f"build_kit: no predictions file for {missing}; got "
                         f"{sorted(predictions)}")
    return compared


# ----------------------------------------------------------------------------- kit


def build_kit(
    predictions: Mapping[str, str | os.PathLike],
    meetings: Mapping[str, str | os.PathLike],
    out_dir: str | os.PathLike,
    per_domain: int = 20,
    seed: int = 1,
    compared: Sequence[str] = COMPARED,
    proposed: str = PROPOSED,
) -> dict[str, Path]:
    """Sample test examples and write the blinded pairwise-judgement kit of Fig. 5.

    Parameters
    ----------
    predictions : mapping
        Method -> path of its ``predictions.jsonl`` (rows ``{"client", "id", "prediction",
        "reference"}``, one per test example of every client). Must name ``proposed`` and every
        method of ``compared``; all files must hold the same ids, covering every test example.
    meetings : mapping
        Client (domain) -> path of its ``test.jsonl`` (the data layer's records: ``id`` and the
        input text ``<query> #SEP# <transcript>`` in ``input``; a file whose records hold the text
        in ``source`` instead is accepted too).
    out_dir : path-like
        Kit folder; ``sheet.csv``, ``form.html``, ``README.txt`` and ``key/key.json`` are written
        there, each atomically.
    per_domain : int
        Examples sampled per domain (paper: 20). A domain with fewer takes all of them (warning).
    seed : int
        Sampling is ``random.Random(f"{seed}/human-eval/{client}").sample(sorted ids, k)``; the
        sides and the item order use their own ``f"{seed}/human-eval/..."`` streams, so the kit
        depends only on the seed and the inputs (not on dict order).
    compared, proposed : method names
        Each sampled example gives one item per compared method: the proposed method's summary
        against that method's, sides drawn at random but balanced per compared method (half of
        its items have the proposed summary as ``A``; one random extra when odd).

    Returns
    -------
    dict
        ``{"sheet", "form", "readme", "key"}`` -> written path.

    Notes
    -----
    Items are shuffled over the whole kit (ids ``H0001`` ... in sheet order), so the pairs that
    share an example -- and hence the proposed method's summary -- are not adjacent.

    Raises
    ------
    InputError
        A missing or malformed file (named, with the line), a method without predictions, a
        predictions file that lacks ids the test files or other methods have (named, with the
        ids), an id in two test files, or nothing to sample.
    """
    if not isinstance(per_domain, int) or isinstance(per_domain, bool) or per_domain < 1:
        raise InputError(f"build_kit: per_domain must be a positive integer, got {per_domain!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"build_kit: seed must be an integer, got {seed!r}")
    if not meetings:
        raise InputError("build_kit: no test files given in 'meetings'")
    compared = _check_methods(predictions, compared, proposed)

    examples: dict[str, dict] = {}
    origin: dict[str, Path] = {}
    ids_by_client: dict[str, list[str]] = {}
    for client, path in meetings.items():
        path = Path(path)
        recs = _read_test_file(str(client), path)
        for rid in recs:
            if rid in examples:
                raise InputError(f"{path}: id {rid!r} is also in {origin[rid]}; ids must be "
                                 "unique across clients")
            origin[rid] = path
        examples.update(recs)
        ids_by_client[str(client)] = sorted(recs)

    methods = [proposed, *compared]
    preds = {m: _read_predictions(m, Path(predictions[m])) for m in methods}
    wanted = set(examples).union(*(set(p) for p in preds.values()))
    for m in methods:
        missing = wanted - set(preds[m])
        if missing:
            raise InputError(
                f"{predictions[m]}: predictions of {m} lack {len(missing)} id(s) that the test "
                f"files or the other methods' predictions have: {_preview(missing)}"
            )
    extra = wanted - set(examples)
    if extra:
        raise InputError(f"predictions hold {len(extra)} id(s) that no test file in 'meetings' "
                         f"has: {_preview(extra)} (first file: {predictions[proposed]})")

    sampled: dict[str, list[str]] = {}
    for client, ids in ids_by_client.items():
        k = min(per_domain, len(ids))
        if k < per_domain:
            log.warning("human eval: client %s has only %d test example(s); sampling %d instead "
                        "of %d", client, len(ids), k, per_domain)
        rng = random.Random(f"{seed}/human-eval/{client}")
        sampled[client] = sorted(rng.sample(ids, k))
    if not any(sampled.values()):
        raise InputError("build_kit: the test files hold no examples to sample")

    pairs = sorted((client, rid, m) for client, ids in sampled.items() for rid in ids
                   for m in compared)
    side_of: dict[tuple[str, str, str], str] = {}
    for m in compared:
        mine = [p for p in pairs if p[2] == m]
        rng = random.Random(f"{seed}/human-eval/sides/{m}")
        half = len(mine) // 2
        sides = ["A"] * half + ["B"] * half + ([rng.choice("AB")] if len(mine) % 2 else [])
        rng.shuffle(sides)
        side_of.update(zip(mine, sides))
    random.Random(f"{seed}/human-eval/order").shuffle(pairs)

    width = max(4, len(str(len(pairs))))
    rows, items = [], {}
    for n, (client, rid, m) in enumerate(pairs, start=1):
        item_id = f"H{n:0{width}d}"
        side = side_of[(client, rid, m)]
        ours, theirs = preds[proposed][rid], preds[m][rid]
        a, b = (ours, theirs) if side == "A" else (theirs, ours)
        ex = examples[rid]
        rows.append({"item_id": item_id, "domain": client, "query": ex["query"],
                     "meeting": ex["meeting"], "summary_A": a, "summary_B": b, "judgement": ""})
        items[item_id] = {"domain": client, "id": rid, "proposed_side": side, "other_method": m}

    out_dir = Path(out_dir)
    paths = {"sheet": out_dir / "sheet.csv", "form": out_dir / "form.html",
             "readme": out_dir / "README.txt", "key": out_dir / "key" / "key.json"}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(SHEET_COLUMNS), lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_path(paths["sheet"], suffix=".csv") as tmp:
        # BOM so that spreadsheet programs read the file as UTF-8; aggregate() accepts either.
        tmp.write_text(buf.getvalue(), encoding="utf-8-sig", newline="")
    kit_tag = f"{seed}-{per_domain}-{len(rows)}"
    write_text_atomic(paths["form"], _form_html(rows, kit_tag))
    write_text_atomic(paths["readme"], _readme(len(rows), sum(map(len, sampled.values()))))
    write_json_atomic(paths["key"], {
        "paper": PAPER,
        "figure": "Fig. 5",
        "seed": seed,
        "per_domain": per_domain,
        "proposed": proposed,
        "compared": compared,
        "criteria": list(CRITERIA),
        "sampled": sampled,
        "items": items,
        "predictions": {m: str(predictions[m]) for m in methods},
        "meetings": {str(c): str(p) for c, p in meetings.items()},
    })
    log.info("human eval kit: %d items (%d examples x %d methods) in %s", len(rows),
             sum(map(len, sampled.values())), len(compared), out_dir)
    return paths


def _readme(n_items: int, n_examples: int) -> str:
    crit = ", ".join(CRITERIA[:-1]) + " and " + CRITERIA[-1]
    return f"""HUMAN EVALUATION OF MEETING SUMMARIES -- INSTRUCTIONS
=====================================================

You will judge {n_items} items. Each item shows a meeting excerpt (the part of a meeting
transcript relevant to a query), the query, and two summaries, A and B, that answer the query.
The summaries come from different automatic systems; which system wrote which summary is hidden,
and A/B are in random order. {n_examples} queries are used; the same query can appear in several
items with different pairs of summaries. Judge every item on its own.

For every item decide which summary is better, or whether they are equally good, according to

  * domain expertise      -- does the summary use the meeting's domain (academic research,
                             parliamentary committee, product design) correctly and aptly?
  * informativeness       -- does it answer the query and cover the important points?
  * factual correctness   -- is everything it says supported by the meeting?

(the criteria of the study: {crit}). Answer

  A    if summary A is better,
  B    if summary B is better,
  tie  if neither is better.

Two ways to answer (use one):

  1. form.html -- open it in a web browser (no internet needed). Read each item (click
     "Meeting transcript" to unfold the excerpt), tick A, B or tie, and press "Download
     judgements (CSV)" at the end. Your choices are kept in the browser while you work, but
     only the downloaded file counts: send that file back.
  2. sheet.csv -- open it in a spreadsheet program, write A, B or tie in the "judgement" column
     of every row, do not change or reorder the item_id column, and save it as CSV.

Please work alone and do not discuss items with the other evaluators.

For the organiser: give evaluators README.txt with form.html and/or sheet.csv only. The key/
folder maps items to systems -- never send it. Count the returned files with
`python -m fedrepro.papers.adafedseleckd.human_eval aggregate`.
"""


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}
.item{border:1px solid #bbb;border-radius:6px;padding:.6em 1em;margin:1.2em 0}
.item h2{font-size:1.05em;margin:.2em 0}
.query{background:#f3f3f3;padding:.4em .6em;border-radius:4px}
.meeting{white-space:pre-wrap;max-height:24em;overflow-y:auto;font-size:.9em;
 border-left:3px solid #ccc;padding-left:.6em}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em;margin:.6em 0}
.summary{border:1px solid #ddd;border-radius:4px;padding:.4em .8em;white-space:pre-wrap}
.summary h3{margin:.2em 0;font-size:1em}
.empty{color:#888;font-style:italic}
fieldset{border:none;padding:0}
label{margin-right:1.5em}
#bar{position:sticky;bottom:0;background:#fff;border-top:1px solid #bbb;padding:.6em 0}
"""

_JS = """
(function(){
  var KEY = "fedrepro-human-eval-" + document.body.getAttribute("data-kit");
  var items = Array.prototype.slice.call(document.querySelectorAll("section.item"));
  function state(){
    var s = {};
    items.forEach(function(sec){
      var id = sec.getAttribute("data-item");
      var c = sec.querySelector("input[type=radio]:checked");
      s[id] = c ? c.value : "";
    });
    return s;
  }
  function progress(){
    var s = state(), n = 0;
    for (var k in s) { if (s[k]) { n++; } }
    document.getElementById("progress").textContent = n + " of " + items.length + " judged";
    return n;
  }
  try {
    var saved = JSON.parse(window.localStorage.getItem(KEY) || "{}");
    items.forEach(function(sec){
      var v = saved[sec.getAttribute("data-item")];
      if (v) {
        var r = sec.querySelector("input[value='" + v + "']");
        if (r) { r.checked = true; }
      }
    });
  } catch (e) {}
  document.addEventListener("change", function(){
    try { window.localStorage.setItem(KEY, JSON.stringify(state())); } catch (e) {}
    progress();
  });
  progress();
  document.getElementById("download").addEventListener("click", function(){
    var n = progress();
    if (n < items.length &&
        !window.confirm((items.length - n) + " item(s) have no judgement yet. Download anyway?")) {
      return;
    }
    var s = state(), lines = ["item_id,judgement"];
    items.forEach(function(sec){
      var id = sec.getAttribute("data-item");
      lines.push(id + "," + s[id]);
    });
    var who = document.getElementById("evaluator").value.replace(/[^A-Za-z0-9_-]+/g, "_");
    var blob = new Blob([lines.join("\\r\\n") + "\\r\\n"], {type: "text/csv"});
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "judgements" + (who ? "-" + who : "") + ".csv";
    document.body.appendChild(a);
    a.click();
    document.body.removeChild(a);
  });
})();
"""


def _text_block(text: str) -> str:
    return html.escape(text) if text.strip() else '<span class="empty">(empty summary)</span>'


def _form_html(rows: list[dict], kit_tag: str) -> str:
    esc = html.escape
    crit = ", ".join(CRITERIA)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        "<title>Meeting summary evaluation</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        f'<body data-kit="{esc(kit_tag)}">',
        "<h1>Meeting summary evaluation</h1>",
        (f"<p>For each of the {len(rows)} items, read the query and the meeting excerpt, then "
        f"decide which summary is better according to <b>{esc(crit)}</b>, or choose "
        "<i>tie</i>. A and B are in random order and come from hidden systems. When done, press "
        "<i>Download judgements (CSV)</i> at the bottom and send the downloaded file back.</p>"),
        '<p><label>Your name or initials: <input type="text" id="evaluator"></label></p>',
    ]
    for r in rows:
        iid = esc(r["item_id"])
        query = (f'<p class="query"><b>Query:</b> {esc(r["query"])}</p>' if r["query"] else "")
        radios = "".join(
            f'<label><input type="radio" name="{iid}" value="{v}"> '
            f'{"Tie" if v == "tie" else "Summary " + v}</label>'
            for v in JUDGEMENTS
        )
        parts += [
            f'<section class="item" id="{iid}" data-item="{iid}">',
            f"<h2>Item {iid} &middot; {esc(r['domain'])}</h2>",
            query,
            "<details><summary>Meeting transcript</summary>",
            f'<div class="meeting">{esc(r["meeting"])}</div>',
            "</details>",
            '<div class="pair">',
            f'<div class="summary"><h3>Summary A</h3>{_text_block(r["summary_A"])}</div>',
            f'<div class="summary"><h3>Summary B</h3>{_text_block(r["summary_B"])}</div>',
            "</div>",
            f"<fieldset><legend>Which summary is better?</legend>{radios}</fieldset>",
            "</section>",
        ]
    parts += [
        ('<div id="bar"><button type="button" id="download">Download judgements (CSV)</button> '
        '<span id="progress"></span></div>'),
        f"<script>{_JS}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


# ----------------------------------------------------------------------------- aggregation


def _read_key(key_path: Path) -> tuple[dict, dict[str, dict]]:
    key = read_json(key_path)
    if not isinstance(key, dict) or not isinstance(key.get("items"), dict) or not key["items"]:
        raise InputError(f"{key_path}: not a human-evaluation key (expected an object with a "
                         "non-empty 'items' mapping; see build_kit)")
    for iid, it in key["items"].items():
        if (not isinstance(it, dict) or it.get("proposed_side") not in ("A", "B")
                or not isinstance(it.get("other_method"), str)):
            raise InputError(f"{key_path}: item {iid!r} needs 'proposed_side' (A or B) and "
                             "'other_method'")
    return key, key["items"]


def _read_sheet(path: Path, items: Mapping[str, dict], key_path: Path,
                allow_partial: bool) -> dict[str, str]:
    """item id -> normalized judgement (``A``/``B``/``tie``) of one filled sheet."""
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc}); save the sheet as UTF-8 CSV") from exc
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError(f"{path}: empty file; expected a CSV with columns item_id, judgement")
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from exc
    lower = [h.lower() for h in header]
    for col in ("item_id", "judgement"):
        if col not in lower:
            raise InputError(f"{path}: no {col!r} column (header: {header}); expected the "
                             "columns of sheet.csv or the form's download (item_id,judgement)")
    i_id, i_j = lower.index("item_id"), lower.index("judgement")
    normal = {j.lower(): j for j in JUDGEMENTS}
    out: dict[str, str] = {}
    first_row: dict[str, int] = {}
    row_no = 1  # spreadsheet numbering: the header is row 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputError(f"{path}: row {row_no + 1}: not readable CSV ({exc})") from exc
        row_no += 1
        if not any(cell.strip() for cell in row):
            continue
        iid = row[i_id].strip() if i_id < len(row) else ""
        where = f"{path}: row {row_no}"
        if not iid:
            raise InputError(f"{where}: empty item_id")
        if iid not in items:
            raise InputError(f"{where}: unknown item id {iid!r} (not in {key_path}); was the "
                             "sheet built with another kit?")
        if iid in first_row:
            raise InputError(f"{where}: item {iid} appears twice (first at row "
                             f"{first_row[iid]}); keep one judgement per item")
        first_row[iid] = row_no
        raw = row[i_j].strip() if i_j < len(row) else ""
        if not raw:
            raise InputError(f"{where}: item {iid} has no judgement; write A, B or tie")
        if raw.lower() not in normal:
            raise InputError(f"{where}: item {iid} has judgement {raw!r}; expected A, B or tie")
        out[iid] = normal[raw.lower()]
    if not out:
        raise InputError(f"{path}: no judged items")
    missing = set(items) - set(out)
    if missing and not allow_partial:
        raise InputError(f"{path}: {len(missing)} item(s) of {key_path} have no row: "
                         f"{_preview(missing)} (pass allow_partial=True to count partial sheets)")
    return out


def count_judgements(sheets: Sequence[str | os.PathLike], key_path: str | os.PathLike,
                     allow_partial: bool = False) -> pd.DataFrame:
    """Per-evaluator counts: one row per (filled sheet, compared method).

    Returns a frame with columns ``evaluator`` (the sheet's path), ``method`` (the compared
    method), ``wins``, ``ties``, ``losses`` (of the proposed method; ints) and ``items``. See
    :func:`aggregate` for validation.
    """
    key_path = Path(key_path)
    sheets = [Path(s) for s in sheets]
    if not sheets:
        raise InputError("aggregate: no filled sheets given")
    dup = {str(s) for s in sheets if sheets.count(s) > 1}
    if dup:
        raise InputError(f"aggregate: sheet(s) given twice: {sorted(dup)}")
    key, items = _read_key(key_path)
    methods = list(key.get("compared") or [])
    methods += sorted({it["other_method"] for it in items.values()} - set(methods))
    records = []
    for sheet in sheets:
        judged = _read_sheet(sheet, items, key_path, allow_partial)
        counts = {m: {"wins": 0, "ties": 0, "losses": 0} for m in methods}
        for iid, j in judged.items():
            it = items[iid]
            outcome = "ties" if j == "tie" else "wins" if j == it["proposed_side"] else "losses"
            counts[it["other_method"]][outcome] += 1
        for m in methods:
            c = counts[m]
            records.append({"evaluator": str(sheet), "method": m, **c,
                            "items": c["wins"] + c["ties"] + c["losses"]})
    return pd.DataFrame.from_records(
        records, columns=["evaluator", "method", "wins", "ties", "losses", "items"])


def aggregate(sheets: Sequence[str | os.PathLike], key_path: str | os.PathLike,
              allow_partial: bool = False) -> pd.DataFrame:
    """Fig. 5 counts: wins / ties / losses of the proposed method against each compared method.

    Parameters
    ----------
    sheets : sequence of path-like
        One filled sheet per evaluator: ``sheet.csv`` with its ``judgement`` column filled, or the
        form's download (``item_id,judgement``). Judgements ``A``, ``B``, ``tie`` in any case;
        blank lines are skipped; UTF-8 with or without BOM.
    key_path : path-like
        The kit's ``key/key.json``.
    allow_partial : bool
        By default every sheet must judge every item of the key; with ``True`` a sheet may leave
        items out (its counts cover the items it has).

    Returns
    -------
    pandas.DataFrame
        One row per compared method (the key's order) with columns ``proposed``, ``method``,
        ``wins``, ``ties``, ``losses`` (floats: mean over evaluators), ``wins_pct``, ``ties_pct``,
        ``losses_pct`` (percent of the mean number of items), ``evaluators`` (int) and
        ``items_per_evaluator`` (float).

    Notes
    -----
    Aggregation as in the paper ("we count the number of wins, ties and losses for each method,
    with the average results across the three evaluators"): each evaluator's judgements are
    counted per compared method -- a judgement for the side that holds the proposed method's
    summary is a win, ``tie`` a tie, the other side a loss -- and the counts are then averaged
    over evaluators. Shares are ``100 * mean count / mean items``, which equals the mean of the
    evaluators' shares when all judge the same items.

    Raises
    ------
    InputError
        No sheet, a sheet given twice, a missing or malformed key, or a sheet with an unknown
        item id, a duplicate item, an empty or invalid judgement, no ``item_id``/``judgement``
        column or (unless ``allow_partial``) missing items. Messages name the file and, for a
        row, its spreadsheet row number (header = row 1) and the item.
    """
    per = count_judgements(sheets, key_path, allow_partial=allow_partial)
    key, _ = _read_key(Path(key_path))
    proposed = key.get("proposed", PROPOSED)
    rows = []
    for method, sub in per.groupby("method", sort=False):
        sub = sub[sub["items"] > 0]
        n_eval = len(sub)
        means = {k: float(sub[k].mean()) if n_eval else float("nan")
                 for k in ("wins", "ties", "losses", "items")}
        row = {"proposed": proposed, "method": method,
               **{k: means[k] for k in ("wins", "ties", "losses")}}
        for k in ("wins", "ties", "losses"):
            row[f"{k}_pct"] = 100.0 * means[k] / means["items"] if means["items"] else float("nan")
        row["evaluators"] = n_eval
        row["items_per_evaluator"] = means["items"]
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- figure 5


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None or pd.isna(x):
        return "—"
    text = f"{x:.1f}" if pct else (f"{x:.0f}" if float(x).is_integer() else f"{x:.2f}")
    return text + ("%" if pct else "")


def _paper(method: str, key: str) -> float | None:
    return PAPER_FIGURE5.get(method, {}).get(key)


def _markdown(df: pd.DataFrame, scale: str) -> str:
    proposed = str(df["proposed"].iloc[0]) if len(df) else PROPOSED
    title = f"Fig. 5 (human evaluation): {proposed} vs. each method — ours vs. paper"
    lines = [f"**{title}{' (DEMO SCALE)' if scale == 'demo' else ''}**", ""]
    if scale == "demo":
        lines += [("> **DEMO-SCALE numbers: summaries of tiny models trained on generated sample "
                  "data; NOT comparable to the paper's numbers.**"), ""]
    lines += [
        ("| Compared method | Wins (ours) | Ties (ours) | Losses (ours) | Win rate (ours) "
        "| Wins (paper) | Ties (paper) | Losses (paper) | Win rate (paper) | evaluators "
        "| items / evaluator |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r in df.iterrows():
        m = r["method"]
        cells = [m, _fmt(r["wins"]), _fmt(r["ties"]), _fmt(r["losses"]),
                 _fmt(r["wins_pct"], pct=True),
                 _fmt(_paper(m, "wins")), _fmt(_paper(m, "ties")), _fmt(_paper(m, "losses")),
                 _fmt(_paper(m, "wins_pct"), pct=True),
                 str(int(r["evaluators"])), _fmt(r["items_per_evaluator"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        (f"Counts are {proposed}'s wins / ties / losses against the compared method, counted per "
        "evaluator and averaged over evaluators (paper: three evaluators, 60 pairs per method). "
        "Win rate = wins / items."),
        "",
        ("Paper values: only those stated in the text; the paper's other Fig. 5 values are not "
        "given in the text (—). AdaFedAvg's 4 ties are derived (60 − 52 − 4). Sources:"),
        "",
        *[f"* {q}" for q in PAPER_FIGURE5_QUOTES],
        "",
    ]
    return "\n".join(lines)


def write_figure5(df: pd.DataFrame, out_prefix: str | os.PathLike, scale: str) -> None:
    """Write Fig. 5 as ``<out_prefix>.csv``, ``.md`` and ``.png`` (each atomically).

    Parameters
    ----------
    df : pandas.DataFrame
        The frame of :func:`aggregate`.
    out_prefix : path-like
        Output path without extension; parent folders are created.
    scale : {"demo", "paper"}
        Scale of the runs whose summaries were judged; ``"demo"`` marks the md and the figure.

    Notes
    -----
    The CSV holds ``df`` at full precision plus ``paper_wins``, ``paper_ties``, ``paper_losses``,
    ``paper_wins_pct`` (empty where the text gives none, see :data:`PAPER_FIGURE5`) and
    ``scale``. The PNG has one stacked horizontal bar per compared method (wins, ties, losses of
    the proposed method), like the paper's Fig. 5.

    Raises
    ------
    ValueError
        If ``scale`` is not ``"demo"`` or ``"paper"``.
    InputError
        If ``df`` lacks a column of :func:`aggregate`'s frame or has no rows.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    need = ("proposed", "method", "wins", "ties", "losses", "wins_pct", "evaluators",
            "items_per_evaluator")
    lacking = [c for c in need if c not in df.columns]
    if lacking or df.empty:
        raise InputError(f"write_figure5: expected aggregate()'s frame; missing columns "
                         f"{lacking}" if lacking else "write_figure5: the frame has no rows")
    out_prefix = Path(out_prefix)

    def out(ext: str) -> Path:
        return out_prefix.with_name(out_prefix.name + ext)

    csv_df = df.copy()
    for k in ("wins", "ties", "losses", "wins_pct"):
        csv_df[f"paper_{k}"] = [_paper(m, k) for m in csv_df["method"]]
    csv_df["scale"] = scale
    with atomic_path(out(".csv"), suffix=".csv") as tmp:
        csv_df.to_csv(tmp, index=False)
    write_text_atomic(out(".md"), _markdown(df, scale))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    proposed = str(df["proposed"].iloc[0])
    methods = list(df["method"])
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(methods) + 1.6))
    left = [0.0] * len(methods)
    colours = {"wins": "#4C72B0", "ties": "#BBBBBB", "losses": "#DD8452"}
    labels = {"wins": f"{proposed} wins", "ties": "Tie", "losses": f"{proposed} loses"}
    y = list(range(len(methods)))[::-1]
    for k in ("wins", "ties", "losses"):
        vals = [float(v) for v in df[k]]
        bars = ax.barh(y, vals, left=left, color=colours[k], label=labels[k], height=0.6)
        for bar, v in zip(bars, vals):
            if v > 0:
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2,
                        _fmt(v), ha="center", va="center", fontsize=8)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y, [f"vs. {m}" for m in methods])
    ax.set_xlim(0, max(left) if max(left) > 0 else 1)
    ax.set_xlabel("items (mean over evaluators)")
    title = f"Human evaluation: {proposed} vs. other methods"
    ax.set_title(title + (" (DEMO SCALE)" if scale == "demo" else ""), fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.05 * (3 - min(len(methods), 3))),
              ncol=3, fontsize=8, frameon=False)
    with atomic_path(out(".png"), suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


# ----------------------------------------------------------------------------- CLI


def _pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values or []:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--{what}: expected NAME=PATH, got {v!r}")
        if name in out:
            raise InputError(f"--{what}: {name!r} given twice")
        out[name] = path
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``kit`` builds a kit (:func:`build_kit`); ``aggregate`` counts filled sheets and writes
    Fig. 5 (:func:`aggregate`, :func:`write_figure5`)."""
    ap = argparse.ArgumentParser(prog="python -m fedrepro.papers.adafedseleckd.human_eval",
                                 description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kit", help="build the blinded evaluation kit")
    k.add_argument("--pred", action="append", required=True, metavar="METHOD=PATH",
                   help="a method's predictions.jsonl (repeat for every method)")
    k.add_argument("--meetings", action="append", required=True, metavar="CLIENT=PATH",
                   help="a client's test.jsonl (repeat for every domain)")
    k.add_argument("--out", required=True, help="kit folder")
    k.add_argument("--per-domain", type=int, default=20)
    k.add_argument("--seed", type=int, default=1)
    k.add_argument("--compared", nargs="+", default=list(COMPARED))
    k.add_argument("--proposed", default=PROPOSED)
    a = sub.add_parser("aggregate", help="count filled sheets and write Fig. 5")
    a.add_argument("sheets", nargs="+", help="filled sheets, one per evaluator")
    a.add_argument("--key", required=True, help="the kit's key/key.json")
    a.add_argument("--out-prefix", required=True)
    a.add_argument("--scale", choices=SCALES, required=True)
    a.add_argument("--allow-partial", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.cmd == "kit":
            paths = build_kit(_pairs(args.pred, "pred"), _pairs(args.meetings, "meetings"),
                              args.out, per_domain=args.per_domain, seed=args.seed,
                              compared=args.compared, proposed=args.proposed)
            for name, p in paths.items():
                print(f"{name}: {p}")
        else:
            df = aggregate(args.sheets, args.key, allow_partial=args.allow_partial)
            write_figure5(df, args.out_prefix, args.scale)
            print(df.to_string(index=False))
    except InputError as exc:
        print(f"error: {exc}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
