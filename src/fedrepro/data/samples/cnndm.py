"""Generated CNN/DailyMail samples in the raw schema.

:func:`write_samples` writes the committed ``resources/samples/cnndm/``, read by the same
parser as the real data, :mod:`fedrepro.data.sources.cnndm`, whose docstring describes the
schema; the source registry calls it as
``fedrepro.data.sources.get("cnndm").write_samples(out_dir)``.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from fedrepro.data.samples import _english as en

SAMPLE_SIZES: dict[str, int] = {"train": 30, "val": 20, "test": 20}
_SAMPLE_FILES: dict[str, str] = {
    "train": "train.jsonl",
    "val": "validation.jsonl",
    "test": "test.jsonl",
}


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


def write_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``train.jsonl``/``validation.jsonl``/``test.jsonl`` (hub field names and order, JSON lines
    instead of Parquet so the committed bytes do not depend on the Parquet writer's version) with
    ``scale`` × :data:`SAMPLE_SIZES` articles; byte-identical for the same ``seed`` and ``scale``.

    ``scale > 1`` appends copies ``k = 1 … scale-1`` of each split, drawn from
    ``random.Random(f"cnndm-{seed}-{split}/scale/{k}")``; article ``i`` (counted over all copies)
    keeps the id ``sha1(f"cnndm-{seed}-{split}-{i}")``, so ids never repeat."""
    scale = en.check_scale(scale)
    out_dir = Path(out_dir)
    counts: dict[str, int] = {}
    for split in en.SPLITS:
        n = SAMPLE_SIZES[split]
        objs = []
        for k in range(scale):
            name = f"cnndm-{seed}-{split}"
            rng = random.Random(name) if k == 0 else en.scale_rng(name, k)
            for i in range(k * n, (k + 1) * n):
                raw_id = hashlib.sha1(f"cnndm-{seed}-{split}-{i}".encode()).hexdigest()
                objs.append(generate_article(rng, raw_id))
        counts[split] = en.write_jsonl_ordered(out_dir / _SAMPLE_FILES[split], objs)
    return counts
