"""Reddit TIFU (Kim, Kim & Kim, NAACL 2019), "long" version: r/tifu posts with their TL;DR (FedSum appendix).

FedSum (§5, "Datasets and Distributions") lists Reddit (Kim et al. 2019, "Abstractive Summarization
of Reddit Posts with Multi-level Memory Networks") among its test beds. The "long" version pairs a
post's text (TL;DR line removed) with its TL;DR; the "short" version would use the title. Extractive
labels need sentences, which the dataset does not annotate: ``meta["sentences"]`` comes from a simple
splitter that also splits before lower-case words (Reddit posts are often written in lower case).

Raw schema (the hub loader's "long" config, Parquet)::

    {"ups": 115.0, "num_comments": 23.0, "upvote_ratio": 0.88, "score": 115.0,
     "documents": "so this happened yesterday ...", "tldr": "tried to ..., ...", "title": "forgetting ..."}

The original ``tifu_all_tokenized_and_filtered.json`` (JSON lines) is accepted too: there the text is
``selftext_without_tldr``, the title ``trimmed_title`` and each post has an ``id``. The release has a
single split, ``train`` (42,139 posts in "long"); FedSum-style experiments sample and split it
themselves.

Normalized record: ``input`` = the post text (whitespace collapsed); ``target`` = the TL;DR;
``meta`` = ``title``, ``ups``, ``num_comments``, ``score``, ``upvote_ratio``, ``sentences``,
``input_words``, ``summary_words``. Ids are ``reddit_tifu-train-<post id>`` where the raw record has
an ``id``, else ``reddit_tifu-train-<shard>-<row index>``.

Upstream for :func:`download`: the hub dataset ``ctr4si/reddit_tifu`` is a loading script (it reads
a Google-Drive file), so the data files come from the hub's automatic Parquet conversion of it, the
branch ``refs/convert/parquet`` (``long/train/0000.parquet``). That branch is rewritten by the hub's
converter, so it is a name rather than a commit; no commit SHA could be verified from this offline
machine, and the revision is a parameter.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from fedrepro.data import _english as en
from fedrepro.data.sources import Records

NAME = "reddit_tifu"
CONFIG_KEY = "data.reddit_tifu.local_dir"
HUB_ID = "ctr4si/reddit_tifu"
REVISION = "refs/convert/parquet"
CONFIG = "long"
SPLITS: tuple[str, ...] = ("train",)
SAMPLE_SIZES: dict[str, int] = {"train": 40}
_LOOSE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


# -- parsing -----------------------------------------------------------------------------------------
def split_post(text: str) -> list[str]:
    """Sentences of a Reddit post: newlines and ``.``/``!``/``?`` + whitespace end a sentence,
    whatever the case of the next word."""
    out: list[str] = []
    for para in re.split(r"\s*\n\s*", text):
        out.extend(s for s in (en.clean(x) for x in _LOOSE_END.split(para)) if s)
    return out


def convert(obj: dict, ctx: en.RowContext) -> dict:
    """One raw post (hub "long" row or original JSON line) → one normalized record."""
    if "documents" in obj or "selftext_without_tldr" not in obj:
        documents = en.get_str(obj, "documents")
        title_key = "title"
    else:
        documents = en.get_str(obj, "selftext_without_tldr")
        title_key = "trimmed_title"
    tldr = en.get_str(obj, "tldr")
    title = obj.get(title_key)
    if title is not None and not isinstance(title, str):
        raise en.FieldError(title_key, f"expected a string, got {type(title).__name__}")
    raw_id = obj.get("id")
    if raw_id is not None and (not isinstance(raw_id, str) or not raw_id.strip()):
        raise en.FieldError("id", "expected a non-empty string")
    text = en.clean(documents)
    target = en.clean(tldr)
    meta: dict = {"title": en.clean(title or "")}
    for key in ("ups", "num_comments", "score", "upvote_ratio"):
        meta[key] = en.get_number(obj, key)
    meta.update(
        sentences=split_post(documents),
        input_words=len(text.split()),
        summary_words=len(target.split()),
    )
    return en.record(ctx, raw_id.strip() if raw_id else ctx.index_id, text, target, meta)


def parse(
    path: str | os.PathLike, skip_malformed: bool = False, split: str | None = None
) -> Records:
    """Normalized records of one Reddit TIFU file (``long/train/0000.parquet`` of the hub conversion,
    ``train.jsonl`` of the samples, or the original JSON lines named ``*train*``; pass ``split`` for a
    file whose name does not say it).

    Raises
    ------
    fedrepro.io.InputError
        Malformed record (missing/empty ``documents`` or ``tldr``, non-numeric ``ups``/``score``, bad
        JSON line), naming file, line/row and field — unless ``skip_malformed``.
    """
    return en.parse_path(path, NAME, convert, skip_malformed=skip_malformed, split=split)


def load_split(
    root: str | os.PathLike, split: str = "train", skip_malformed: bool = False
) -> Records:
    """All records of ``split`` (only ``train`` exists upstream) in a local copy."""
    return en.load_split(root, split, parse, skip_malformed)


# -- download -----------------------------------------------------------------------------------------
def download(
    dest_dir: str | os.PathLike,
    timeout: float = 10.0,
    revision: str = REVISION,
    config: str = CONFIG,
) -> Path:
    """Download the Parquet conversion of ``ctr4si/reddit_tifu`` (config ``long``) into ``dest_dir``.

    Files keep the hub layout (``long/train/0000.parquet``); they are written into a staging folder
    renamed onto ``dest_dir`` once the train split is there.

    Raises
    ------
    fedrepro.data.download.DownloadError
        Offline within ``timeout`` seconds (nothing left behind); the message names Reddit TIFU, the
        hub id and revision and the config key ``data.reddit_tifu.local_dir``.
    """
    return en.hub_download(
        dest_dir,
        dataset="Reddit TIFU",
        repo_id=HUB_ID,
        revision=revision,
        allow_patterns=(f"{config}/*.parquet",),
        config_key=CONFIG_KEY,
        timeout=timeout,
        expect_splits=SPLITS,
    )


# -- samples ------------------------------------------------------------------------------------------
_STORIES = (
    {
        "title": "tifu by microwaving {food} at work",
        "setup": "so this happened today at the office. i brought leftover {food} for lunch and put it in the shared microwave.",
        "event": "i set it for {minutes} minutes instead of {seconds} seconds and went back to my desk.",
        "result": "the fire alarm went off and the whole building of {people} people had to evacuate.",
        "after": "my boss just looked at me and said nothing. i am now known as the {food} guy.",
        "tldr": "microwaved {food} for {minutes} minutes instead of {seconds} seconds, set off the fire alarm and {people} people had to evacuate.",
    },
    {
        "title": "tifu by replying all",
        "setup": "this was {days} days ago but i am still cringing. our manager sent an email about the {event} to the whole company.",
        "event": "i meant to send a joke about it to my friend {friend} but hit reply all.",
        "result": "about {people} people got my joke, including the ceo.",
        "after": "hr wants to talk to me on monday. wish me luck.",
        "tldr": "hit reply all on an email about the {event} and sent a joke meant for {friend} to {people} people, including the ceo.",
    },
    {
        "title": "tifu by locking myself out on the balcony",
        "setup": "obligatory this didn't happen today. it was {temp} degrees outside and i went onto the balcony to water my plants.",
        "event": "the door clicked shut behind me and it only opens from the inside.",
        "result": "i was stuck out there for {hours} hours in my underwear until my neighbour {friend} saw me and called the landlord.",
        "after": "the landlord laughed so hard he almost dropped the keys.",
        "tldr": "locked myself out on the balcony in my underwear for {hours} hours until {friend} called the landlord.",
    },
    {
        "title": "tifu by using salt instead of sugar",
        "setup": "my girlfriend's parents came over for the first time and i wanted to impress them with a {dessert}.",
        "event": "the jars look the same and i put {cups} cups of salt in instead of sugar.",
        "result": "her dad took a big bite, went pale and politely finished the whole slice.",
        "after": "we ordered pizza. they still talk about it.",
        "tldr": "baked a {dessert} with {cups} cups of salt instead of sugar for my girlfriend's parents, her dad ate it anyway.",
    },
    {
        "title": "tifu by washing my phone",
        "setup": "i was doing laundry after a long shift at the {job}.",
        "event": "i did not check my pockets and my phone went through a full {minutes} minute wash cycle.",
        "result": "it is completely dead and i lost {photos} photos that were never backed up.",
        "after": "lesson learned, turn on the cloud backup people.",
        "tldr": "washed my phone for {minutes} minutes and lost {photos} photos that were not backed up.",
    },
)
_FOODS = ("fish", "broccoli", "popcorn", "curry", "eggs")
_EVENTS = ("christmas party", "new parking rules", "office move", "team building day")
_FRIENDS = ("dave", "jess", "mike", "sarah", "tom", "kate")
_DESSERTS = ("cheesecake", "chocolate cake", "apple pie", "banana bread")
_JOBS = ("restaurant", "hospital", "warehouse", "bar")
_FILLERS = (
    "throwaway because my friends know my main.",
    "english is not my first language so sorry for mistakes.",
    "edit: formatting.",
    "this is my first post here, long time lurker.",
    "i honestly don't know what i was thinking.",
    "the worst part is that everyone saw it.",
)


def generate_post(rng: random.Random) -> dict:
    """One hub-schema "long" row; the TL;DR restates the post's key event and outcome, whose details
    (numbers, names, objects) all occur in ``documents``."""
    story = en.pick(rng, _STORIES)
    slots = {
        "food": en.pick(rng, _FOODS),
        "minutes": str(rng.randint(5, 40)),
        "seconds": str(rng.choice((30, 45, 60, 90))),
        "people": str(rng.randint(3, 60) * 10),
        "days": str(rng.randint(2, 9)),
        "event": en.pick(rng, _EVENTS),
        "friend": en.pick(rng, _FRIENDS),
        "temp": str(rng.randint(-5, 12)),
        "hours": str(rng.randint(2, 6)),
        "dessert": en.pick(rng, _DESSERTS),
        "cups": str(rng.randint(2, 4)),
        "job": en.pick(rng, _JOBS),
        "photos": str(rng.randint(4, 90) * 100),
    }
    parts = [story[k].format(**slots) for k in ("setup", "event", "result", "after")]
    fillers = rng.sample(_FILLERS, rng.randint(0, 2))
    paragraphs = fillers[:1] + parts[:2] + [" ".join(parts[2:])] + fillers[1:]
    ups = float(rng.randint(5, 4000))
    return {
        "ups": ups,
        "num_comments": float(rng.randint(0, 300)),
        "upvote_ratio": round(rng.uniform(0.55, 0.99), 2),
        "score": ups,
        "documents": "\n\n".join(paragraphs),
        "tldr": story["tldr"].format(**slots),
        "title": story["title"].format(**slots),
    }


def write_samples(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Write ``train.jsonl`` (hub "long" field names and order, JSON lines instead of Parquet so the
    committed bytes do not depend on the Parquet writer) with :data:`SAMPLE_SIZES` posts;
    byte-identical for the same ``seed``."""
    out_dir = Path(out_dir)
    rng = random.Random(f"reddit_tifu-{seed}-train")
    objs = [generate_post(rng) for _ in range(SAMPLE_SIZES["train"])]
    return {"train": en.write_jsonl_ordered(out_dir / "train.jsonl", objs)}


en.register_source(
    NAME, parse, download, write_samples, CONFIG_KEY,
    upstream=f"https://huggingface.co/datasets/{HUB_ID} (config {CONFIG}) @ {REVISION}",
    splits=SPLITS,
)
