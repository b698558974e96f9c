"""Generated Reddit TIFU samples in the raw schema.

:func:`write_samples` writes the committed ``resources/samples/reddit_tifu/``, read by the same
parser as the real data, :mod:`fedrepro.data.sources.reddit_tifu`, whose docstring describes the
schema; the source registry calls it as
``fedrepro.data.sources.get("reddit_tifu").write_samples(out_dir)``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from fedrepro.data.samples import _english as en

SAMPLE_SIZES: dict[str, int] = {"train": 40}


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


def write_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``train.jsonl`` (hub "long" field names and order, JSON lines instead of Parquet so the
    committed bytes do not depend on the Parquet writer) with ``scale`` × :data:`SAMPLE_SIZES`
    posts; byte-identical for the same ``seed`` and ``scale``.

    ``scale > 1`` appends copies ``k = 1 … scale-1``, drawn from
    ``random.Random(f"reddit_tifu-{seed}-train/scale/{k}")`` (the posts have no id: ids are row
    indices)."""
    scale = en.check_scale(scale)
    out_dir = Path(out_dir)
    objs = []
    for k in range(scale):
        name = f"reddit_tifu-{seed}-train"
        rng = random.Random(name) if k == 0 else en.scale_rng(name, k)
        objs += [generate_post(rng) for _ in range(SAMPLE_SIZES["train"])]
    return {"train": en.write_jsonl_ordered(out_dir / "train.jsonl", objs)}
