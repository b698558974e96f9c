"""WikiHow (Koupaee & Wang, 2018): how-to articles summarized by their bold step lines (FedSum appendix).

FedSum (§5, "Datasets and Distributions") lists WikiHow among its test beds: the article text is the
input and the concatenated bold "headline" lines of its steps are the summary. Extractive labels need
sentences; WikiHow has no sentence annotation, so ``meta["sentences"]`` comes from the simple
splitter (:func:`fedrepro.data.sources._english.split_sentences`).

Raw schema: the "all" form, one article per row with the columns of the authors' ``wikihowAll.csv``
(``headline, title, text``; the hub loader's "all" config has the same three fields)::

    headline,title,text
    "\\nKeep your hands clean.,\\nWear gloves.,",How to Repot a Cactus," Wash your hands before ...\\n,Put on ..."

``wikihowAll.csv`` itself holds all ~215k articles with no split; the authors publish the split as
lists of titles (``all_train.txt``, ``all_val.txt``, ``all_test.txt``; titles with spaces removed).
:func:`download` turns the two into ``train.csv``, ``val.csv`` and ``test.csv`` exactly as the hub
loader (``wangwilliamyang/wikihow``, config ``all``) does — rows whose summary is at least 0.75 times
as long as the article are dropped, the extra commas ``.,`` in summaries and ``.\\n,`` in articles are
removed, and a row goes to a split when ``title.replace(" ", "")`` is in that split's list —
giving 157,252 / 5,599 / 5,577 articles. :func:`parse` reads such split files (CSV, JSON lines or
Parquet with the same fields); it also applies the comma clean-up, which is idempotent.

Normalized record: ``input`` = the article (whitespace collapsed); ``target`` = the headline lines
joined by spaces; ``meta`` = ``title``, ``sentences``, ``headline_sentences``, ``input_words``,
``summary_words``. Records have no upstream id: ids are ``wikihow-<split>-<row index>``.

Upstream for :func:`download`: the hub copy is a loading script that needs a *manual* download
(``wikihowAll.csv`` is only on a UCSB Box share, :data:`MANUAL_URL`, which has no direct file URL),
so the hub has no Parquet conversion to pin. :func:`download` therefore fetches the authors' split
lists from github.com/mahnazkoupaee/WikiHow-Dataset at the pinned commit :data:`COMMIT` (a commit that
holds the lists; SHA taken from a public code index, not re-verified offline) and splits a
manually downloaded ``wikihowAll.csv`` given as ``manual_csv``. Without it, it stops with a message
that says where to get the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fedrepro.data.sources import _english as en
from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.sources import Records, sample_writer
from fedrepro.io import InputError, atomic_dir

NAME = "wikihow"
CONFIG_KEY = "data.wikihow.local_dir"
REPO = "mahnazkoupaee/WikiHow-Dataset"
COMMIT = "4e9f8ce85efc57d7627e44906ba7e02a5729779c"
LIST_URL_TEMPLATE = (
    "https://raw.githubusercontent.com/mahnazkoupaee/WikiHow-Dataset/{commit}/all_{split}.txt"
)
MANUAL_URL = "https://ucsb.app.box.com/s/ap23l8gafpezf4tq3wapr6u8241zz358"
HEADER: tuple[str, ...] = ("headline", "title", "text")
_ARTICLE_COMMAS = re.compile(r"[.]+[\n]+[,]")


# -- parsing -----------------------------------------------------------------------------------------
def clean_pair(headline: str, text: str) -> tuple[str, str]:
    """The hub loader's comma clean-up (``.,`` in summaries, ``.\\n,`` in articles)."""
    return headline.replace(".,", "."), _ARTICLE_COMMAS.sub(".\n", text)


def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw WikiHow row ``{headline, title, text}`` → one normalized record."""
    title = en.get_str(obj, "title")
    headline, text = clean_pair(en.get_str(obj, "headline"), en.get_str(obj, "text"))
    lines = [en.clean(h) for h in headline.split("\n")]
    lines = [h for h in lines if h]
    sentences = en.split_sentences(text)
    if not lines:
        raise en.FieldError("headline", "empty")
    if not sentences:
        raise en.FieldError("text", "empty")
    article = en.clean(text)
    target = " ".join(lines)
    return en.record(
        ctx,
        ctx.index_id,
        article,
        target,
        {
            "title": en.clean(title),
            "sentences": sentences,
            "headline_sentences": lines,
            "input_words": len(article.split()),
            "summary_words": len(target.split()),
        },
    )


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one WikiHow split file (``train.csv``/``val.csv``/``test.csv`` as written
    by :func:`download`, or the hub loader's splits as JSON lines/Parquet).

    Raises
    ------
    fedrepro.io.InputError
        For the unsplit ``wikihowAll.csv`` (split it with :func:`download`), or a malformed row
        (missing/empty ``headline``, ``title`` or ``text``, wrong number of CSV fields), naming the
        file, the line and the field — unless ``skip_malformed``.
    """
    p = Path(path)
    if p.is_file() and p.name.lower().startswith(("wikihowall", "wikihowsep")) and split is None:
        raise InputError(
            f"{p}: the unsplit WikiHow release has no train/val/test split; run "
            f"fedrepro.data.sources.wikihow.download(dest_dir, manual_csv='{p}') to split it with "
            f"the authors' title lists, and point `{CONFIG_KEY}` at dest_dir"
        )
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(root: str | os.PathLike, split: str, skip_malformed: bool = False) -> Records:
    """All records of ``split`` in a local (already split) copy."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def list_url(split: str, commit: str = COMMIT) -> str:
    """URL of the authors' title list of ``split`` (``val`` → ``all_val.txt``) at ``commit``."""
    return LIST_URL_TEMPLATE.format(commit=commit, split=split)


def split_all_csv(
    csv_path: str | os.PathLike, titles: dict[str, set[str]], out_dir: str | os.PathLike
) -> dict[str, int]:
    """Write ``out_dir/{train,val,test}.csv`` from ``wikihowAll.csv`` as the hub loader splits it.

    A row is kept when it has the three fields, passes the length filter (summary shorter than 0.75
    times the article) and is non-empty after :func:`clean_pair`; it goes to the split whose title
    list holds ``title.strip().replace(" ", "")``. Returns rows written per split.
    """
    csv_path, out_dir = Path(csv_path), Path(out_dir)
    rows: dict[str, list[list[str]]] = {s: [] for s in titles}
    reader = en.csv_reader(csv_path, strict=False)  # as the hub loader reads it
    header = next(reader, None)
    if header != list(HEADER):
        raise InputError(
            f"{csv_path}:1: expected the header {list(HEADER)} of wikihowAll.csv, got {header}"
        )
    for row in reader:
        if len(row) != len(HEADER):
            continue
        headline, title, text = (c.strip() for c in row)
        if len(headline) >= 0.75 * len(text):
            continue
        headline, text = clean_pair(headline, text)
        if not headline or not text:
            continue
        key = title.replace(" ", "")
        for split, names in titles.items():
            if key in names:
                rows[split].append([headline, title, text])
    return {s: en.write_csv_atomic(out_dir / f"{s}.csv", HEADER, rs) for s, rs in rows.items()}


def download(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    manual_csv: str | os.PathLike | None = None,
    commit: str = COMMIT,
) -> Path:
    """Fetch the authors' split lists at ``commit`` and split ``manual_csv`` into ``dest_dir``.

    Parameters
    ----------
    dest_dir:
        Output folder; receives ``train.csv``, ``val.csv`` and ``test.csv`` (via a staging folder that
        is renamed into place only when all three are written).
    timeout:
        Seconds for connecting and each read; offline, the first list fails within about this time.
    manual_csv:
        Your download of ``wikihowAll.csv`` (:data:`MANUAL_URL`).
    commit:
        Commit of ``mahnazkoupaee/WikiHow-Dataset`` whose ``all_{train,val,test}.txt`` are used.

    Raises
    ------
    fedrepro.data.download.DownloadError
        A list cannot be fetched (offline: within ``timeout``), or ``manual_csv`` is missing; the
        message names WikiHow, the URL and the config key ``data.wikihow.local_dir``.
    """
    dest_dir = Path(dest_dir)
    dataset = f"WikiHow ({REPO}@{commit[:12]})"
    first = list_url("train", commit)
    try:
        en.probe(first, timeout)
    except (OSError, TimeoutError) as exc:
        raise DownloadError(
            f"{dataset}: could not download {first} ({type(exc).__name__}: {exc}). If this machine has "
            f"no internet access, prepare train.csv, val.csv and test.csv elsewhere and set the config "
            f"key `{CONFIG_KEY}` to the folder holding them."
        ) from exc
    if manual_csv is None or not Path(manual_csv).is_file():
        raise DownloadError(
            f"{dataset}: wikihowAll.csv must be downloaded by hand from {MANUAL_URL} (the release has no "
            f"direct file URL); pass it as manual_csv (got {manual_csv!r}), or set the config key "
            f"`{CONFIG_KEY}` to a folder with already split train.csv, val.csv and test.csv."
        )
    with atomic_dir(dest_dir) as staging:
        titles: dict[str, set[str]] = {}
        for split in en.SPLITS:
            lst = fetch_url(
                list_url(split, commit),
                staging / ".titles" / f"all_{split}.lst",
                timeout,
                CONFIG_KEY,
                dataset,
            )
            titles[split] = {
                line.strip()
                for line in lst.read_text(encoding="utf-8").splitlines()
                if line.strip()
            }
        split_all_csv(manual_csv, titles, staging)
        for p in (staging / ".titles").iterdir():
            p.unlink()
        (staging / ".titles").rmdir()
    return dest_dir


en.register_source(
    NAME, parse, download, sample_writer(NAME), CONFIG_KEY,
    upstream=f"https://github.com/{REPO} @ {COMMIT} (split lists) + wikihowAll.csv from {MANUAL_URL}",
    splits=en.SPLITS,
)
