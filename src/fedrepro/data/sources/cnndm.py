"""CNN/DailyMail (version 3.0.0, non-anonymized): news articles with bullet-point highlights (FedSum).

FedSum (§5, "Datasets and Distributions", Tables 1, 3, 4 and Fig. 4-5) trains an extractive
BERTSUM-style summarizer federatedly on CNN/DailyMail (Nallapati et al., 2017), with 2K training
samples spread over the clients by a Dirichlet quantity skew; its extractive labels need the
article's sentence list, which every record keeps in ``meta["sentences"]``.

Raw schemas accepted (one record per article):

* the hub release ``abisee/cnn_dailymail``, config ``3.0.0`` (Parquet, ``3.0.0/{train-0000k-of-00003,
  validation-00000-of-00001,test-00000-of-00001}.parquet``; 287,113 / 13,368 / 11,490 articles)::

      {"article": "(CNN) -- ...", "highlights": "First bullet .\\nSecond bullet .", "id": "<40 hex>"}

* the FRANK copy of the test set (``frank_cnndm_test.jsonl``), which adds the sentence-split article
  and puts the highlights on one line::

      {"id": "dm-test-<hash>", "hash": ..., "url": ..., "article": ..., "article_lines": [...],
       "highlights": "First bullet . Second bullet .", "highlights_lower_tok": ...}

Normalized record: ``input`` = the article (whitespace collapsed); ``target`` = the highlights
joined by spaces; ``meta`` = ``original_id``, ``sentences`` (``article_lines`` where present, else the
simple splitter of :func:`fedrepro.data._english.split_sentences`), ``highlights`` (list), ``url``
(where present), ``input_words``, ``summary_words``.

Upstream for :func:`download`: ``abisee/cnn_dailymail`` at commit
``3adf6249f0cc8409a97a4d38471529ef5f7dc496`` (a revision of the Parquet-only repository whose
``3.0.0/test-00000-of-00001.parquet`` has 11,490 rows, as recorded by another project that pinned
it; not re-verified from this offline machine, hence the ``revision`` parameter).
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from fedrepro.data import _english as en
from fedrepro.data.sources import Records

NAME = "cnndm"
CONFIG_KEY = "data.cnndm.local_dir"
HUB_ID = "abisee/cnn_dailymail"
REVISION = "3adf6249f0cc8409a97a4d38471529ef5f7dc496"
CONFIG = "3.0.0"
SAMPLE_SIZES: dict[str, int] = {"train": 30, "val": 20, "test": 20}
_SAMPLE_FILES: dict[str, str] = {
    "train": "train.jsonl",
    "val": "validation.jsonl",
    "test": "test.jsonl",
}


# -- parsing -----------------------------------------------------------------------------------------
def _highlight_list(highlights: str) -> list[str]:
    if "\n" in highlights.strip():
        lines = [en.clean(h) for h in highlights.split("\n")]
    else:
        lines = en.split_sentences(highlights)
    return [h for h in lines if h]


def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw CNN/DM article (hub or FRANK schema) → one normalized record."""
    raw_id = en.get_str(obj, "id").strip()
    article = en.get_str(obj, "article")
    highlights = en.get_str(obj, "highlights")
    if "article_lines" in obj and obj["article_lines"] is not None:
        sentences = [en.clean(s) for s in en.get_str_list(obj, "article_lines")]
        sentences = [s for s in sentences if s]
    else:
        sentences = en.split_sentences(article)
    hl = _highlight_list(highlights)
    text = en.clean(article)
    target = " ".join(hl)
    meta: dict = {
        "original_id": raw_id,
        "sentences": sentences,
        "highlights": hl,
        "input_words": len(text.split()),
        "summary_words": len(target.split()),
    }
    if isinstance(obj.get("url"), str):
        meta["url"] = obj["url"]
    return en.record(ctx, raw_id, text, target, meta)


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one CNN/DM split file (or a folder of one split's shards).

    The split comes from the file name (``test-00000-of-00001.parquet``, ``frank_cnndm_test.jsonl``,
    ``validation.jsonl``).

    Raises
    ------
    fedrepro.io.InputError
        Malformed record (missing/empty ``id``, ``article`` or ``highlights``, non-string
        ``article_lines`` items, bad JSON line), naming file, line/row, id and field — unless
        ``skip_malformed``.
    """
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(root: str | os.PathLike, split: str, skip_malformed: bool = False) -> Records:
    """All records of ``split`` in a local copy (e.g. the three train shards of the hub release)."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def download(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    revision: str = REVISION,
    config: str = CONFIG,
) -> Path:
    """Download the Parquet files of ``abisee/cnn_dailymail`` config ``3.0.0`` at ``revision``.

    Files land in ``dest_dir/3.0.0/`` with their hub names, via a staging folder renamed onto
    ``dest_dir`` once all three splits are there; nothing partial is left behind.

    Raises
    ------
    fedrepro.data.download.DownloadError
        Offline within ``timeout`` seconds; the message names CNN/DailyMail, the hub id and revision
        and the config key ``data.cnndm.local_dir``.
    """
    return en.hub_download(
        dest_dir,
        dataset="CNN/DailyMail",
        repo_id=HUB_ID,
        revision=revision,
        allow_patterns=(f"{config}/*.parquet",),
        config_key=CONFIG_KEY,
        timeout=timeout,
    )


# -- samples ------------------------------------------------------------------------------------------
_FIRST = (
    "James",
    "Sarah",
    "David",
    "Emma",
    "Michael",
    "Laura",
    "Steven",
    "Rachel",
    "Mark",
    "Claire",
    "Peter",
    "Helen",
)
_LAST = (
    "Walker",
    "Hughes",
    "Bennett",
    "Collins",
    "Morgan",
    "Price",
    "Fletcher",
    "Reid",
    "Shaw",
    "Doyle",
    "Marsh",
    "Quinn",
)
_TOWNS = (
    "Leeds",
    "Bristol",
    "Glasgow",
    "Cardiff",
    "Norwich",
    "Atlanta",
    "Denver",
    "Portland",
    "Brighton",
    "Leicester",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_CLUBS = (
    "Kilmarnock",
    "Hearts",
    "Rotherham",
    "Blackpool",
    "Motherwell",
    "Yeovil",
    "Barnsley",
    "Bury",
)
_COMPANIES = (
    "Harlow Foods",
    "Brightline Energy",
    "Norcastle Bank",
    "Vantage Motors",
    "Greyfield Retail",
    "Orion Telecom",
)
_STORMS = (
    "Storm Abigail",
    "Storm Desmond",
    "Storm Frank",
    "Storm Gertrude",
    "Storm Imogen",
    "Storm Jake",
)
_REGIONS = (
    "the north of Scotland",
    "south Wales",
    "Cornwall",
    "the Lake District",
    "Northern Ireland",
    "the east coast",
)
_UNIS = (
    "the University of Exeter",
    "Harvard University",
    "King's College London",
    "Stanford University",
    "the University of Bath",
)
_JOURNALS = ("the Lancet", "Nature", "the BMJ", "Science", "PLOS ONE")
_FINDINGS = (
    ("drinking two cups of coffee a day", "lowers the risk of liver disease by {p} per cent"),
    ("walking for 20 minutes a day", "cuts the risk of heart disease by {p} per cent"),
    ("sleeping less than six hours a night", "raises the risk of obesity by {p} per cent"),
    ("eating a handful of nuts a day", "reduces the risk of diabetes by {p} per cent"),
)
_ANIMALS = ("dog", "cat", "horse", "seal", "swan", "sheep")
_PLACES = (
    "a drain",
    "a frozen pond",
    "a cliff ledge",
    "a disused mine shaft",
    "a chimney",
    "a canal",
)
_FILLER = (
    "The announcement was made in a short statement on {day} morning.",
    "Officials said further details would be released in the coming weeks.",
    "It is not the first time the issue has made headlines in {town}.",
    "Local residents told reporters they had been expecting the news for some time.",
    "A spokesman declined to comment further when contacted on {day}.",
    "Critics have questioned whether the move goes far enough.",
    "Photographs shared on social media showed crowds gathering outside.",
    "The figures were described as 'encouraging' by independent analysts.",
    "Scroll down for video.",
    "A full review is expected to be published later this year.",
    "The decision follows months of speculation in {town}.",
    "Opposition figures called for an urgent inquiry into what had happened.",
    "Figures released on {day} suggest the trend is likely to continue.",
    "Neighbours described the scene as 'absolute chaos'.",
    "The story was first reported by the local newspaper.",
    "Experts say similar cases are becoming more common across the country.",
)


def _person(rng: random.Random) -> str:
    return f"{en.pick(rng, _FIRST)} {en.pick(rng, _LAST)}"


def _story_manager(rng: random.Random) -> tuple[list[str], list[str]]:
    name, club, old = _person(rng), en.pick(rng, _CLUBS), _person(rng)
    day, weeks, age, years = (
        en.pick(rng, _DAYS),
        rng.randint(3, 12),
        rng.randint(34, 58),
        rng.randint(2, 4),
    )
    unbeaten = rng.randint(4, 9)
    key = [
        f"{name} will be confirmed as {club}'s permanent manager on {day}, {weeks} weeks after being asked to take charge until the end of the season.",
        f"The {age}-year-old is expected to be handed a {years}-year deal by the club's board.",
        f"{club} have gone unbeaten in {unbeaten} games since {name} replaced {old} on a caretaker basis.",
    ]
    quotes = [
        f"'I'd be over the moon to get it, it's something I've worked hard towards,' said {name.split()[0]}.",
        "'The players have been magnificent,' the new manager added.",
    ]
    hl = [
        f"{name} will be confirmed as {club} manager on {day} .",
        f"{club} are unbeaten in {unbeaten} games under the {age}-year-old .",
        f"He is set to be handed a {years}-year deal .",
    ]
    return key + quotes, hl


def _story_company(rng: random.Random) -> tuple[list[str], list[str]]:
    company, boss = en.pick(rng, _COMPANIES), _person(rng)
    profit, pct, jobs = rng.randint(12, 480), rng.randint(3, 41), rng.randint(2, 30) * 50
    half = en.pick(rng, ("first half", "second half", "final quarter"))
    town = en.pick(rng, _TOWNS)
    key = [
        f"{company} has reported a profit of £{profit} million for the {half} of the year, up {pct} per cent on last year.",
        f"The group said it would create {jobs} new jobs at its headquarters in {town}.",
        f"Chief executive {boss} said the results showed the strategy was working.",
    ]
    quotes = [
        f"'We have had a strong {half} and we are confident about the year ahead,' said {boss.split()[1]}."
    ]
    hl = [
        f"{company} profit up {pct} per cent to £{profit} million .",
        f"{jobs} new jobs to be created in {town} .",
        f"Boss {boss} says strategy is working .",
    ]
    return key + quotes, hl


def _story_storm(rng: random.Random) -> tuple[list[str], list[str]]:
    storm, region, day = en.pick(rng, _STORMS), en.pick(rng, _REGIONS), en.pick(rng, _DAYS)
    mph, homes, flights = rng.randint(60, 110), rng.randint(2, 60) * 1000, rng.randint(20, 180)
    key = [
        f"{storm} brought winds of up to {mph}mph to {region} on {day}, leaving {homes:,} homes without power.",
        f"More than {flights} flights were cancelled and several roads were closed by fallen trees.",
        "Forecasters have warned that the severe weather will continue into the weekend.",
    ]
    quotes = [
        f"'Please stay indoors unless your journey is absolutely necessary,' police in {region} said."
    ]
    hl = [
        f"{storm} hit {region} with winds of {mph}mph .",
        f"{homes:,} homes were left without power on {day} .",
        f"More than {flights} flights were cancelled .",
    ]
    return key + quotes, hl


def _story_court(rng: random.Random) -> tuple[list[str], list[str]]:
    name, town, age = _person(rng), en.pick(rng, _TOWNS), rng.randint(19, 67)
    job = en.pick(rng, ("builder", "accountant", "taxi driver", "nurse", "shopkeeper", "teacher"))
    years, amount = rng.randint(2, 11), rng.randint(20, 900) * 1000
    key = [
        f"A {age}-year-old {job} from {town} has been jailed for {years} years after stealing £{amount:,} from elderly customers.",
        f"{name} admitted fraud at {town} Crown Court after police found records of more than 40 payments.",
        f"The judge said {name.split()[1]} had shown 'a shocking lack of remorse'.",
    ]
    quotes = ["Detectives said the victims had been 'deeply affected' by the crimes."]
    hl = [
        f"{name} , {age} , jailed for {years} years for fraud .",
        f"The {job} stole £{amount:,} from elderly customers in {town} .",
    ]
    return key + quotes, hl


def _story_study(rng: random.Random) -> tuple[list[str], list[str]]:
    uni, journal = en.pick(rng, _UNIS), en.pick(rng, _JOURNALS)
    habit, effect = en.pick(rng, _FINDINGS)
    pct, people, years = rng.randint(8, 45), rng.randint(2, 90) * 1000, rng.randint(5, 20)
    lead = _person(rng)
    effect = effect.format(p=pct)
    key = [
        f"Researchers at {uni} found that {habit} {effect}, according to a study published in {journal}.",
        f"The team followed {people:,} adults for {years} years.",
        f"Lead author Dr {lead} said the effect held even after accounting for age and diet.",
    ]
    quotes = [f"'This is a simple change that almost anyone can make,' said Dr {lead.split()[1]}."]
    hl = [
        f"Study by {uni} found {habit} {effect} .",
        f"{people:,} adults were followed for {years} years .",
    ]
    return key + quotes, hl


def _story_rescue(rng: random.Random) -> tuple[list[str], list[str]]:
    animal, place, town = en.pick(rng, _ANIMALS), en.pick(rng, _PLACES), en.pick(rng, _TOWNS)
    hours, owner = rng.randint(2, 30), _person(rng)
    key = [
        f"A {animal} has been rescued from {place} in {town} after being trapped for {hours} hours.",
        f"Firefighters used ropes and a specialist camera to reach the animal on {en.pick(rng, _DAYS)} night.",
        f"Its owner, {owner}, said the {animal} was tired but unhurt.",
    ]
    quotes = [f"'We can't thank the crews enough,' said {owner.split()[0]}."]
    hl = [
        f"{animal.capitalize()} trapped in {place} in {town} for {hours} hours .",
        "Firefighters used ropes and a camera to free it .",
        f"Owner {owner} says the {animal} is unhurt .",
    ]
    return key + quotes, hl


_STORIES = (_story_manager, _story_company, _story_storm, _story_court, _story_study, _story_rescue)


def generate_article(rng: random.Random, raw_id: str) -> dict:
    """One hub-schema raw record ``{article, highlights, id}``; the highlights restate the facts of
    the article's lead sentences (CNN/DM's lead bias), so they are learnable from the article."""
    body, hl = en.pick(rng, _STORIES)(rng)
    town, day = en.pick(rng, _TOWNS), en.pick(rng, _DAYS)
    fillers = [f.format(town=town, day=day) for f in rng.sample(_FILLER, rng.randint(6, 10))]
    cut = rng.randint(1, 3)
    sentences = body[:2] + fillers[:cut] + body[2:] + fillers[cut:]
    prefix = "(CNN) -- " if rng.random() < 0.35 else ""
    article = prefix + " ".join(sentences)
    return {"article": article, "highlights": "\n".join(hl), "id": raw_id}


def write_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``train.jsonl``/``validation.jsonl``/``test.jsonl`` (hub field names and order, JSON lines
    instead of Parquet so the committed bytes do not depend on the Parquet writer's version) with
    :data:`SAMPLE_SIZES` articles; byte-identical for the same ``seed``."""
    out_dir = Path(out_dir)
    counts: dict[str, int] = {}
    for split in en.SPLITS:
        rng = random.Random(f"cnndm-{seed}-{split}")
        objs = []
        for i in range(SAMPLE_SIZES[split]):
            raw_id = hashlib.sha1(f"cnndm-{seed}-{split}-{i}".encode()).hexdigest()
            objs.append(generate_article(rng, raw_id))
        counts[split] = en.write_jsonl_ordered(out_dir / _SAMPLE_FILES[split], objs)
    return counts


en.register_source(
    NAME, parse, download, write_samples, CONFIG_KEY,
    upstream=f"https://huggingface.co/datasets/{HUB_ID} (config {CONFIG}) @ {REVISION}",
    splits=en.SPLITS,
)
