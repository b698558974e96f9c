"""THUCNews (THUCTC; Sina news body -> title): one of FedSUMM's Chinese clients (§IV-A).

Raw layout read by :func:`parse_thucnews` (the folder tree at once): ``THUCNews/<类别>/<n>.txt``,
line 1 the title (used as the summary), then the body. :func:`download_thucnews` fetches the THUCTC
release archive :data:`THUCNEWS_URL`. THUCNews has no official split: a document's split is a fixed
hash of ``<category>/<file stem>`` (90 % train, 5 % val, 5 % test, see :func:`thucnews_split`), so
it does not depend on which files are parsed together. 
Record layout, split names and the code shared with the other Chinese corpora are in
:mod:`fedrepro.data.sources._chinese`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path

from fedrepro.data.download import DownloadError, fetch_url
from fedrepro.data.sources import Records, sample_writer
from fedrepro.data.sources._chinese import (
    _config_key,
    _Malformed,
    _record,
    _url_download_error,
    register_source,
)
from fedrepro.io import InputError, atomic_dir

__all__ = [
    "THUCNEWS_CATEGORIES",
    "THUCNEWS_URL",
    "download_thucnews",
    "parse_thucnews",
    "thucnews_split",
]

THUCNEWS_URL = "http://thuctc.thunlp.org/source/THUCNews.zip"
"""The THUCTC release archive (~1.5 GB zip, 836,075 Sina news documents in 14 category folders).
It is an unversioned, unchanged-since-release file; the URL is its only identifier."""
THUCNEWS_CATEGORIES: dict[str, str] = {
    "体育": "sports",
    "娱乐": "entertainment",
    "家居": "home",
    "彩票": "lottery",
    "房产": "realestate",
    "教育": "education",
    "时尚": "fashion",
    "时政": "politics",
    "星座": "horoscope",
    "游戏": "games",
    "社会": "society",
    "科技": "technology",
    "股票": "stocks",
    "财经": "finance",
}
"""The 14 THUCNews category folders and the ASCII slugs used in record ids."""


def _zip_member_name(info: zipfile.ZipInfo) -> str:
    """Member name, re-decoded as GBK when the archive did not flag it as UTF-8 (Windows zips)."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("gbk")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return info.filename


def _extract_thucnews(archive: Path, out_dir: Path) -> int:
    """Extract ``THUCNews/<category>/<n>.txt`` members of ``archive`` below ``out_dir``."""
    n = 0
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            parts = [p for p in _zip_member_name(info).replace("\\", "/").split("/") if p]
            if not parts or "__MACOSX" in parts or any(p in (".", "..") for p in parts):
                continue
            if not parts[-1].endswith(".txt") or len(parts) < 2:
                continue
            target = out_dir / "THUCNews" / parts[-2] / parts[-1]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            n += 1
    return n


def download_thucnews(
    dest_dir: str | os.PathLike, timeout: float = 10.0, url: str = THUCNEWS_URL
) -> Path:
    """Download and unpack THUCNews (Sun et al., THUCTC) into ``dest_dir/THUCNews/<类别>/<n>.txt``.

    THUCNews has no summaries; FedSUMM's THUCNEWS client ("0.74 million news documents", §IV-A)
    is read here as title generation: the body is the input and the news title (line 1 of every
    document) the summary, the usual way this corpus is used for Chinese summarization. The archive
    is unversioned (``url`` is the release's only identifier); it is fetched into a staging folder,
    unpacked there (GBK member names decoded) and deleted, and the folder is renamed into place.

    Raises
    ------
    DownloadError
        Naming the dataset, the URL and the config key ``data.thucnews.local_dir``.
    """
    dest_dir = Path(dest_dir)
    layout = "THUCNews/<category>/<n>.txt (the unpacked THUCNews.zip)"
    with atomic_dir(dest_dir) as staging:
        archive = staging / "THUCNews.zip"
        try:
            fetch_url(
                url,
                archive,
                timeout=timeout,
                config_key=_config_key("thucnews"),
                dataset="THUCNews (THUCTC release)",
            )
        except DownloadError as exc:
            raise _url_download_error(exc, layout) from exc.__cause__
        try:
            n = _extract_thucnews(archive, staging)
        except (zipfile.BadZipFile, OSError) as exc:
            raise DownloadError(
                f"THUCNews: the archive from {url} could not be unpacked ({exc}); set the config key "
                f"`{_config_key('thucnews')}` to an unpacked local copy ({layout})"
            ) from exc
        archive.unlink()
        if n == 0:
            raise DownloadError(
                f"THUCNews: the archive from {url} holds no <category>/<n>.txt documents; set the "
                f"config key `{_config_key('thucnews')}` to a local copy ({layout})"
            )
    return dest_dir


def thucnews_split(category: str, stem: str) -> str:
    """The fixed split of THUCNews document ``<category>/<stem>.txt``: 90 % train, 5 % val, 5 % test.

    THUCNews has no official split. The bucket is ``int(sha1("<category>/<stem>")[:8], 16) % 100``
    (train < 90 <= val < 95 <= test), so it is the same whichever files are parsed, on any machine.
    """
    bucket = int(hashlib.sha1(f"{category}/{stem}".encode()).hexdigest()[:8], 16) % 100
    return "train" if bucket < 90 else "val" if bucket < 95 else "test"


def _thucnews_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{path}: not found; expected a THUCNews folder or one <n>.txt document")
    if (path / "THUCNews").is_dir():
        path = path / "THUCNews"
    direct = [p for p in path.glob("*.txt") if p.is_file()]
    files = direct or [p for p in path.glob("*/*.txt") if p.is_file()]
    if not files:
        raise InputError(
            f"{path}: no THUCNews documents; expected THUCNews/<category>/<n>.txt (the unpacked "
            f"THUCNews.zip) — check the config key `{_config_key('thucnews')}`"
        )

    def order(p: Path) -> tuple[str, int, str]:
        return (p.parent.name, int(p.stem) if p.stem.isdigit() else -1, p.stem)

    return sorted(files, key=order)


def _thucnews_document(path: Path, bad: _Malformed) -> dict | None:
    category = path.parent.name
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        lineno = raw.count(b"\n", 0, exc.start) + 1
        n_high = sum(b >= 0x80 for b in raw)
        n_bad = raw.decode("utf-8", errors="replace").count("\ufffd")
        if n_bad * 10 < n_high:
            # mostly valid UTF-8: a damaged UTF-8 file, not a GB18030 one (in GB18030 text nearly
            # every character is an invalid UTF-8 sequence; decoding damaged UTF-8 as GB18030
            # would turn every Chinese character into silent mojibake)
            bad(lineno, "<encoding>", f"not valid UTF-8 text ({exc.reason} at byte {exc.start}) in "
                "an otherwise UTF-8 file; fix or convert the file")
            return None
        try:
            text = raw.decode("gb18030")
        except UnicodeDecodeError:
            bad(lineno, "<encoding>", "neither UTF-8 nor GB18030 text")
            return None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    title = lines[0].strip() if lines else ""
    if not title:
        bad(1, "title", "empty (line 1 of a THUCNews document is its title)")
        return None
    paragraphs = [line.strip() for line in lines[1:] if line.strip()]
    if not paragraphs:
        bad(2, "content", "empty (no text after the title line)")
        return None
    body = "\n".join(paragraphs)
    slug = THUCNEWS_CATEGORIES.get(category, category)
    split = thucnews_split(category, path.stem)
    return _record(
        "thucnews",
        split,
        f"{slug}-{path.stem}",
        body,
        title,
        category=category,
        file=f"{category}/{path.name}",
        paragraphs=len(paragraphs),
    )


def parse_thucnews(path: str | os.PathLike, skip_malformed: bool = False) -> Records:
    """Records of THUCNews: input = news body, target = news title.

    ``path`` is the unpacked release (a folder holding ``THUCNews/`` or the ``THUCNews`` folder
    itself, with one sub-folder per category), one category folder, or one ``<n>.txt`` document.
    A document is line 1 = title, then the body (paragraphs indented with U+3000, kept as
    newline-separated stripped paragraphs). The split comes from :func:`thucnews_split`; ids are
    ``thucnews-<split>-<category slug>-<n>``; ``meta.category`` is the Chinese category name.
    """
    records: list[dict] = []
    skipped: list[tuple[str, str]] = []
    for doc in _thucnews_files(Path(path)):
        bad = _Malformed(doc, skip_malformed)
        rec = _thucnews_document(doc, bad)
        if rec is not None:
            records.append(rec)
        skipped.extend((f"{doc.parent.name}/{doc.name}:{loc}", why) for loc, why in bad.skipped)
    return Records(records, skipped)


register_source(
    "thucnews",
    parse_thucnews,
    download_thucnews,
    sample_writer("chinese", "write_thucnews_samples"),
    upstream=f"{THUCNEWS_URL} @ unversioned release",
    splits=("train", "val", "test"),
    whole_folder=True,
)
