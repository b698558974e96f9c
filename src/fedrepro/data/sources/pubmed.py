"""PubMed long-document summarization in the Cohan et al. (2018) release format (FedSum).

FedSum (§5, Table 2, Fig. 4) evaluates its federated extractive summarizer on PubMed (Cohan et al.,
NAACL 2018, "A Discourse-Aware Attention Model for Abstractive Summarization of Long Documents"):
the article body is the input, the paper's abstract the summary. The extractive labels need the
article's sentences, which the release already provides (``article_text`` is a list of sentences)
and every record keeps in ``meta["sentences"]``.

Raw schema (``pubmed-dataset/{train,val,test}.txt`` of the release: JSON lines; 119,924 / 6,633 /
6,658 articles)::

    {"article_id": "PMC3872579",
     "article_text": ["forensic odontology has established itself as ... .", ...],
     "abstract_text": ["<S> objective : the aim of the study was ... . </S>", "<S> ... </S>"],
     "labels": null, "section_names": ["INTRODUCTION", ...], "sections": [["...", ...], ...]}

Text is lower-cased and tokenized (``( p < 0.05 )``). Each ``abstract_text`` item is one sentence
wrapped in ``<S>``/``</S>`` markers, which are stripped (as the release's own ``data.py`` and the hub
loader do).

Normalized record: ``input`` = the article sentences joined by spaces; ``target`` = the abstract
sentences joined by spaces; ``meta`` = ``original_id``, ``sentences`` (article sentences,
whitespace-cleaned, blanks dropped), ``abstract_sentences``, ``section_names``, ``input_words``,
``summary_words``.

Upstream for :func:`download`: ``pubmed-dataset.zip`` from the Internet Archive mirror that the
release's README (github.com/armancohan/long-summarization) links next to its Google-Drive copy:
:data:`URL`. An archive.org item has no commit; the file name is the release's own and the item is
named after the paper code, which is as close to a pinned version as the release offers (the Drive
id ``1lvsqvsFi3W-pE1SqNZI0s8NR9rC1tsja`` cannot be fetched without a confirmation page). The URL is a
parameter.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path

from fedrepro.data.sources import _english as en
from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.sources import Records, sample_writer
from fedrepro.io import atomic_dir

NAME = "pubmed"
CONFIG_KEY = "data.pubmed.local_dir"
URL = "https://archive.org/download/armancohan-long-summarization-paper-code/pubmed-dataset.zip"
_MARKERS = re.compile(r"</?S>")


# -- parsing -----------------------------------------------------------------------------------------
def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw Cohan-format article → one normalized record."""
    raw_id = en.get_str(obj, "article_id").strip()
    article = [en.clean(s) for s in en.get_str_list(obj, "article_text")]
    sentences = [s for s in article if s]
    abstract = [en.clean(_MARKERS.sub(" ", s)) for s in en.get_str_list(obj, "abstract_text")]
    abstract = [s for s in abstract if s]
    if not abstract:
        raise en.FieldError("abstract_text", "empty once the <S>/</S> markers are removed")
    names = obj.get("section_names")
    if names is None:
        names = []
    elif not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise en.FieldError("section_names", "expected a list of strings")
    text = " ".join(sentences)
    target = " ".join(abstract)
    return en.record(
        ctx,
        raw_id,
        text,
        target,
        {
            "original_id": raw_id,
            "sentences": sentences,
            "abstract_sentences": abstract,
            "section_names": list(names),
            "input_words": len(text.split()),
            "summary_words": len(target.split()),
        },
    )


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one PubMed split file (``train.txt``/``val.txt``/``test.txt`` of the
    release, or any ``*{train,val,validation,test}*.jsonl``).

    Raises
    ------
    fedrepro.io.InputError
        Malformed record (missing/empty ``article_id``, ``article_text`` or ``abstract_text``, a
        non-string sentence, bad JSON line), naming file, line, id and field — unless
        ``skip_malformed``.
    """
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(root: str | os.PathLike, split: str, skip_malformed: bool = False) -> Records:
    """All records of ``split`` in a local copy of the release."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def download(dest_dir: str | os.PathLike, timeout: float = 10.0, url: str = URL) -> Path:
    """Download ``pubmed-dataset.zip`` and extract ``train.txt``, ``val.txt``, ``test.txt`` into ``dest_dir``.

    The zip (about 880 MB) is fetched into a staging folder beside ``dest_dir`` with
    :func:`fedrepro.data.download.fetch_url`, the three split files are extracted (the ``vocab`` file
    and the ``__MACOSX`` entries are not), the zip is deleted and the folder renamed onto
    ``dest_dir``.

    Raises
    ------
    fedrepro.data.download.DownloadError
        Offline within about ``timeout`` seconds (nothing left behind), a failed transfer, or a zip
        without the split files; the message names PubMed, the URL and ``data.pubmed.local_dir``.
    """
    dest_dir = Path(dest_dir)
    dataset = "PubMed (Cohan et al. 2018 release)"
    try:
        en.probe(url, timeout)
    except (OSError, TimeoutError) as exc:
        raise DownloadError(
            f"{dataset}: could not download {url} ({type(exc).__name__}: {exc}). If this machine has "
            f"no internet access, fetch the file elsewhere and set the config key `{CONFIG_KEY}` to "
            f"the folder holding train.txt, val.txt and test.txt."
        ) from exc
    with atomic_dir(dest_dir) as staging:
        archive = fetch_url(url, staging / "pubmed-dataset.zip", timeout, CONFIG_KEY, dataset)
        wanted = {f"{s}.txt" for s in en.SPLITS}
        try:
            with zipfile.ZipFile(archive) as zf:
                members = {
                    Path(m).name: m
                    for m in zf.namelist()
                    if Path(m).name in wanted and "__MACOSX" not in m
                }
                missing = sorted(wanted - set(members))
                if missing:
                    raise DownloadError(
                        f"{dataset}: {url} has no {missing}; set `{CONFIG_KEY}` to a local copy instead"
                    )
                for fname, member in sorted(members.items()):
                    with zf.open(member) as src, open(staging / fname, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except zipfile.BadZipFile as exc:
            raise DownloadError(
                f"{dataset}: {url} is not a zip archive ({exc}); set `{CONFIG_KEY}` to a local copy"
            ) from exc
        archive.unlink()
    return dest_dir


en.register_source(
    NAME, parse, download, sample_writer(NAME), CONFIG_KEY,
    upstream=f"{URL} @ unversioned (archive.org mirror of the Cohan et al. 2018 release)",
    splits=en.SPLITS,
)
