"""Generated SAMSum samples in the raw schema.

:func:`write_samples` writes the committed ``resources/samples/samsum/``, read by the same
parser as the real data, :mod:`fedrepro.data.sources.samsum`, whose docstring describes the
schema; the source registry calls it as
``fedrepro.data.sources.get("samsum").write_samples(out_dir)``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from fedrepro.data.samples import _english as en

SAMPLE_SIZES: dict[str, int] = {"train": 40, "val": 20, "test": 20}


_NAMES = (
    "Amanda", "Jerry", "Hannah", "Larry", "Tom", "Betty", "Kate", "Mike", "Olivia", "Ethan",
    "Sophie", "Daniel", "Emma", "Lucas", "Mia", "Noah", "Chloe", "Jack", "Grace", "Ryan",
    "Ella", "Adam", "Lily", "Max", "Zoe", "Sam", "Ava", "Ben", "Nina", "Paul",
)  # fmt: skip
_PLACES = (
    "the cinema",
    "Starbucks",
    "the gym",
    "the park",
    "Luigi's",
    "the library",
    "the station",
    "the mall",
)
_DAYS = ("today", "tomorrow", "on Friday", "on Saturday", "on Sunday", "on Monday", "tonight")
_TIMES = ("5 pm", "6 pm", "7 pm", "7:30", "8 pm", "noon", "10 am", "4:30")
_ITEMS = (
    "charger",
    "umbrella",
    "drill",
    "camera",
    "tent",
    "blue dress",
    "ladder",
    "textbook",
    "car",
)
_GROCERIES = ("milk", "eggs", "bread", "bananas", "coffee", "cheese", "tomatoes", "rice", "apples")
_SHOPS = ("Tesco", "Lidl", "the supermarket", "the corner shop", "Aldi")
_EVENTS = (
    "the Coldplay concert",
    "the football match",
    "the jazz night",
    "the theatre play",
    "the stand-up show",
)
_EXCUSES = (  # (third person, first person)
    ("has to work late", "have to work late"),
    ("is sick", "am sick"),
    ("has an exam", "have an exam"),
    ("is visiting family", "am visiting family"),
    ("has a dentist appointment", "have a dentist appointment"),
)
_FILLER = ("haha", ":)", "ok", "<file_gif>", "cool", "😂", "sure thing", "lol", "great", "👍")


def _dialogue_meet(rng: random.Random, a: str, b: str, c: str) -> tuple[list[tuple[str, str]], str]:
    place, day, time = en.pick(rng, _PLACES), en.pick(rng, _DAYS), en.pick(rng, _TIMES)
    turns = [
        (a, f"Hey {b}, are you free {day}?"),
        (b, "I think so, why?"),
        (a, f"Let's meet at {place}, I need to talk to you"),
        (b, "Sure. What time?"),
        (a, f"{time}?"),
        (b, f"{time} at {place} works for me"),
    ]
    summary = f"{a} and {b} will meet at {place} at {time} {day}."
    if rng.random() < 0.5:
        turns += [(b, f"Can {c} come too?"), (a, f"Of course, tell {c}")]
        summary = f"{a}, {b} and {c} will meet at {place} at {time} {day}."
    return turns, summary


def _dialogue_borrow(
    rng: random.Random, a: str, b: str, c: str
) -> tuple[list[tuple[str, str]], str]:
    item, day = en.pick(rng, _ITEMS), en.pick(rng, _DAYS)
    turns = [
        (a, f"{b}, do you still have that {item}?"),
        (b, "Yeah, why?"),
        (a, "Could you lend it to me? Mine is broken"),
        (b, f"No problem, I'll bring the {item} {day}"),
        (a, "You're a lifesaver!"),
    ]
    summary = f"{b} will lend {a} the {item} {day}, because {a}'s is broken."
    return turns, summary


def _dialogue_pickup(
    rng: random.Random, a: str, b: str, c: str
) -> tuple[list[tuple[str, str]], str]:
    place, time = (
        en.pick(rng, ("school", "the kindergarten", "football practice", "the swimming pool")),
        en.pick(rng, _TIMES),
    )
    who = en.pick(rng, ("the kids", "Mum", "Grandpa", "Leo"))
    reason = en.pick(rng, ("stuck in traffic", "still at work", "stuck in a meeting"))
    turns = [
        (a, f"I'm {reason} 😩"),
        (a, f"Can you pick up {who} from {place}?"),
        (b, "When?"),
        (a, f"At {time}"),
        (b, f"OK, I'll pick up {who} from {place} at {time}"),
        (a, "Thank you!!"),
    ]
    summary = f"{a} is {reason}. {b} will pick up {who} from {place} at {time}."
    return turns, summary


def _dialogue_shopping(
    rng: random.Random, a: str, b: str, c: str
) -> tuple[list[tuple[str, str]], str]:
    shop = en.pick(rng, _SHOPS)
    x, y = rng.sample(_GROCERIES, 2)
    turns = [
        (a, f"I'm at {shop}, should I buy anything for you?"),
        (b, f"We're out of {x}"),
        (b, f"And {y} please"),
        (a, f"{x.capitalize()} and {y}, got it"),
        (b, "Thanks"),
    ]
    summary = f"{a} is at {shop} and will buy {x} and {y} for {b}."
    return turns, summary


def _dialogue_event(
    rng: random.Random, a: str, b: str, c: str
) -> tuple[list[tuple[str, str]], str]:
    event, day, excuse = en.pick(rng, _EVENTS), en.pick(rng, _DAYS), en.pick(rng, _EXCUSES)
    turns = [
        (a, f"I have two tickets for {event} {day}! Want to come?"),
        (b, f"Oh no, I can't, I {excuse[1]} 😕"),
        (a, "Pity"),
        (c, "I'll go with you!"),
        (a, f"Great, {c}! See you there"),
    ]
    summary = f"{a} has tickets for {event} {day}. {b} {excuse[0]}, so {c} will go with {a}."
    return turns, summary


def _dialogue_late(rng: random.Random, a: str, b: str, c: str) -> tuple[list[tuple[str, str]], str]:
    minutes = en.pick(rng, ("10", "15", "20", "30", "40"))
    meeting = en.pick(
        rng, ("the team meeting", "the presentation", "the client call", "our lecture")
    )
    turns = [
        (a, f"I'll be {minutes} minutes late for {meeting}"),
        (a, "My bus broke down"),
        (b, f"OK, I'll tell {c}"),
        (a, "Thanks, sorry!"),
    ]
    summary = f"{a} will be {minutes} minutes late for {meeting} because the bus broke down. {b} will tell {c}."
    return turns, summary


_SCENARIOS = (
    _dialogue_meet,
    _dialogue_borrow,
    _dialogue_pickup,
    _dialogue_shopping,
    _dialogue_event,
    _dialogue_late,
)


def generate_dialogue(rng: random.Random, raw_id: str) -> dict:
    """One SAMSum-style raw record ``{id, summary, dialogue}``; every fact of the summary (names,
    places, times, items) is stated in the dialogue."""
    a, b, c = rng.sample(_NAMES, 3)
    turns, summary = en.pick(rng, _SCENARIOS)(rng, a, b, c)
    out: list[tuple[str, str]] = []
    for speaker, text in turns:
        out.append((speaker, text))
        if rng.random() < 0.25:
            other = b if speaker == a else a
            out.append((other, en.pick(rng, _FILLER)))
    if rng.random() < 0.6:
        out += [(a, "Bye"), (b, en.pick(rng, ("Bye!", "See ya", "Bye bye", "xoxo")))]
    sep = "\r\n" if rng.random() < 0.3 else "\n"
    return {"id": raw_id, "summary": summary, "dialogue": sep.join(f"{s}: {t}" for s, t in out)}


def write_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``train.json``/``val.json``/``test.json`` (JSON lists, the official layout) under
    ``out_dir`` with ``scale`` × :data:`SAMPLE_SIZES` dialogues; byte-identical for the same ``seed``
    and ``scale``.

    ``scale > 1`` appends copies ``k = 1 … scale-1`` of each split, drawn from
    ``random.Random(f"samsum-{seed}-{split}/scale/{k}")``, with ids not used before in the split."""
    scale = en.check_scale(scale)
    out_dir = Path(out_dir)
    counts: dict[str, int] = {}
    for split in en.SPLITS:
        rng = random.Random(f"samsum-{seed}-{split}")
        ids = sorted(rng.sample(range(13_600_000, 13_900_000), SAMPLE_SIZES[split]))
        objs = [generate_dialogue(rng, f"{i:08d}") for i in ids]
        used = set(ids)
        for k in range(1, scale):
            rng = en.scale_rng(f"samsum-{seed}-{split}", k)
            extra = en.draw_new_ids(rng, 13_600_000, 13_900_000, SAMPLE_SIZES[split], used)
            objs += [generate_dialogue(rng, f"{i:08d}") for i in extra]
        counts[split] = en.write_json_list_atomic(out_dir / f"{split}.json", objs)
    return counts
