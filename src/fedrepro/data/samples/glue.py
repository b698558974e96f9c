"""Generated GLUE samples in the release layout: the committed ``resources/samples/glue/``.

Six tasks (MRPC, RTE, SST-2, QNLI, QQP, MNLI), each ``<TASK>/{train,dev,test}.tsv`` with the GLUE
header and columns; they are read by the same parser as the real data,
:mod:`fedrepro.data.sources.glue`, whose docstring describes the layout. The source registry calls
:func:`write_samples` as ``fedrepro.data.sources.get("glue").write_samples(out_dir)``.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from fedrepro.data.samples import check_scale
from fedrepro.data.sources.glue import _SPECS, TASKS
from fedrepro.io import write_text_atomic

__all__ = ["SAMPLE_ROWS", "write_samples"]

SAMPLE_ROWS: dict[str, int] = {"train": 30, "val": 20, "test": 12}
"""Rows per split of each task in the generated samples (:func:`write_samples`)."""


# Header rows of the GLUE release files (MRPC train/dev copy the MSR header, byte-order mark too).
_MNLI_COLS = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]
_HEADERS: dict[tuple[str, str], list[str]] = {
    ("MRPC", "train"): ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    ("MRPC", "test"): ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    ("RTE", "train"): ["index", "sentence1", "sentence2", "label"],
    ("RTE", "test"): ["index", "sentence1", "sentence2"],
    ("SST-2", "train"): ["sentence", "label"],
    ("SST-2", "test"): ["index", "sentence"],
    ("QNLI", "train"): ["index", "question", "sentence", "label"],
    ("QNLI", "test"): ["index", "question", "sentence"],
    ("QQP", "train"): ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    ("QQP", "test"): ["id", "question1", "question2"],
    ("MNLI", "train"): [*_MNLI_COLS, "label1", "gold_label"],
    ("MNLI", "val"): [*_MNLI_COLS, "label1", "label2", "label3", "label4", "label5", "gold_label"],
    ("MNLI", "test"): list(_MNLI_COLS),
}
_SAMPLE_FILES: dict[str, dict[str, str]] = {
    t: (
        {"train": "train.tsv", "val": "dev_matched.tsv", "test": "test_matched.tsv"}
        if t == "MNLI"
        else {"train": "train.tsv", "val": "dev.tsv", "test": "test.tsv"}
    )
    for t in TASKS
}

_FIRST = [
    "James",
    "Maria",
    "Robert",
    "Linda",
    "David",
    "Susan",
    "Thomas",
    "Karen",
    "Peter",
    "Nancy",
]
_LAST = ["Walker", "Hughes", "Moreno", "Fischer", "Okafor", "Lindqvist", "Brennan", "Castillo"]
_COMPANIES = [
    "Microsoft",
    "Oracle",
    "Boeing",
    "Kmart",
    "Intel",
    "Ford",
    "Merck",
    "Alcatel",
    "Sprint",
]
_CITIES = ["Denver", "Toledo", "Glasgow", "Lyon", "Osaka", "Tulsa", "Leeds", "Bilbao", "Quebec"]
_COUNTRIES = ["France", "Brazil", "Kenya", "Norway", "Chile", "Vietnam", "Poland", "Egypt", "Peru"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


# SST-2: lower-cased, PTB-tokenized movie-review phrases ending in a space; the label follows the
# polarity of the adjectives (there are no negations).
_SST_POS = [
    "charming",
    "affecting",
    "gorgeous",
    "funny",
    "moving",
    "witty",
    "engaging",
    "delightful",
]
_SST_NEG = ["dull", "tedious", "bleak", "lifeless", "clumsy", "boring", "pointless", "forgettable"]
_SST_NOUNS = [
    "film",
    "movie",
    "journey",
    "comedy",
    "drama",
    "thriller",
    "story",
    "performance",
    "script",
    "debut",
    "romance",
    "documentary",
]
_SST_ADV = ["often", "remarkably", "consistently", "surprisingly", "thoroughly", "utterly"]
_SST_TEMPLATES = [
    "it 's a {a1} and {adv} {a2} {noun} . ",
    "{adv} {a1} and {a2} ",
    "the {noun} is {adv} {a1} , and the cast is {a2} . ",
    "a {a1} , {a2} {noun} that {verb} . ",
    "{a1} ",
    "what a {a1} {noun} -- {adv} {a2} from start to finish . ",
    "the director 's {a1} {noun} ",
    "a truly {a1} piece of work , {a2} and {a3} . ",
]
_SST_VERB = {
    1: ["stays with you", "earns its laughs", "never lets go"],
    0: ["wears out its welcome", "goes nowhere", "drags on and on"],
}


def _sst2_row(rng: random.Random, label: int) -> tuple[str, str | None]:
    words = _SST_POS if label == 1 else _SST_NEG
    a1, a2, a3 = rng.sample(words, 3)
    text = rng.choice(_SST_TEMPLATES).format(
        a1=a1,
        a2=a2,
        a3=a3,
        adv=rng.choice(_SST_ADV),
        noun=rng.choice(_SST_NOUNS),
        verb=rng.choice(_SST_VERB[label]),
    )
    return text, None


# MRPC: news sentence pairs. Paraphrases restate the same facts (same company, figures, place) in
# other words; non-paraphrases share the topic but change a figure or add a different fact.
_MRPC_ACTIONS = [
    ("cut", "eliminate", "jobs", "positions"),
    ("add", "create", "jobs", "new posts"),
    ("close", "shut", "stores", "outlets"),
    ("open", "launch", "offices", "branches"),
]
_MRPC_FIRST = [
    "{co} said on {day} it would {verb} {n} {noun} in {city} by the end of the year.",
    (
        "{co} said {day} it plans to {verb} about {n} {noun} in the {city} area, calling the move "
        '"necessary".'
    ),
    "Shares of {co} rose to ${price} after the company said it would {verb} {n} {noun} in {city}.",
]
_MRPC_PARAPHRASE = [
    "The company will {syn} {n} {noun_syn} in {city} before the end of the year, {co} said {day}.",
    'In {city}, {co} intends to {syn} roughly {n} {noun_syn}, a step it described as "necessary".',
    (
        "{co} announced on {day} that {n} {noun_syn} in {city} would be affected as it moves to "
        "{syn} them."
    ),
]
_MRPC_OTHER = [
    "{co} had already cut {m} {noun} last year and expects quarterly revenue of ${price} billion.",
    "Analysts said {co} could {verb} as many as {m} {noun} in {other} if sales keep falling.",
    (
        '"We are not planning further changes," a {co} spokesman in {other} said, declining to '
        "comment on revenue."
    ),
]


def _mrpc_row(rng: random.Random, label: int) -> tuple[str, str]:
    verb, syn, noun, noun_syn = rng.choice(_MRPC_ACTIONS)
    n = rng.randrange(2, 60) * 50
    fill = {
        "co": rng.choice(_COMPANIES),
        "city": rng.choice(_CITIES),
        "day": rng.choice(_DAYS),
        "verb": verb,
        "syn": syn,
        "noun": noun,
        "noun_syn": noun_syn,
        "n": f"{n:,}",
        "price": f"{rng.randrange(10, 90)}.{rng.randrange(10, 99)}",
    }
    s1 = rng.choice(_MRPC_FIRST).format(**fill)
    if label == 1:
        return s1, rng.choice(_MRPC_PARAPHRASE).format(**fill)
    fill["m"] = f"{n + rng.randrange(1, 20) * 50:,}"
    fill["other"] = rng.choice([c for c in _CITIES if c != fill["city"]])
    return s1, rng.choice(_MRPC_OTHER).format(**fill)


# RTE: a short news/encyclopedia passage; the hypothesis restates one of its facts (entailment) or
# swaps in a fact the passage does not support (not_entailment).
_RTE_ITEMS = [
    (
        (
            "{person}, who founded {co}'s office in {city} in {year}, was named chairman of the "
            "board on {day}, the company said in a statement."
        ),
        ["{person} founded an office of {co} in {city}."],
        ["{person} was dismissed by {co}.", "{person} founded {co} in {other_year}."],
    ),
    (
        (
            "The river flooded large parts of {city}, a city in {country}, forcing thousands of "
            "residents to leave their homes. Officials said the water was the highest since {year}."
        ),
        ["{city} is located in {country}."],
        ["{city} is located in {other_country}.", "No residents left {city}."],
    ),
    (
        (
            "Born in {country} in {year}, {person} studied medicine before becoming the first "
            "director of the national health agency, a post held for nine years."
        ),
        ["{person} was born in {country}."],
        ["{person} was born in {other_country}.", "{person} never studied medicine."],
    ),
]


def _rte_row(rng: random.Random, label: int) -> tuple[str, str]:
    fill = {
        "person": _person(rng),
        "co": rng.choice(_COMPANIES),
        "city": rng.choice(_CITIES),
        "country": rng.choice(_COUNTRIES),
        "year": rng.randrange(1950, 2005),
        "day": rng.choice(_DAYS),
    }
    fill["other_country"] = rng.choice([c for c in _COUNTRIES if c != fill["country"]])
    fill["other_year"] = fill["year"] + rng.randrange(3, 15)
    premise, entailed, not_entailed = rng.choice(_RTE_ITEMS)
    hypothesis = rng.choice(entailed if label == 0 else not_entailed)
    return premise.format(**fill), hypothesis.format(**fill)


# QNLI: a question and a Wikipedia-style sentence about the same subject; the sentence contains the
# answer (a year for "when", a person for "who", a place for "where") or only other facts.
_QNLI_THINGS = ["cathedral", "bridge", "university", "observatory", "canal", "museum"]
_QNLI_ITEMS = [
    (
        "When was the {thing} in {city} completed?",
        "Construction of the {thing} in {city} began in {start} and was completed in {year}.",
    ),
    (
        "Who designed the {thing} in {city}?",
        "The {thing} in {city} was designed by the architect {person}.",
    ),
    (
        "Where did the architect of the {thing} in {city} study?",
        "Its architect, {person}, studied in {country} before settling in {city}.",
    ),
]
_QNLI_NO_ANSWER = [
    "The {thing} in {city} is one of the most visited sites in the region.",
    "Today the {thing} in {city} is maintained by a private foundation.",
    "Many residents of {city} consider the {thing} a symbol of the city.",
]


def _qnli_row(rng: random.Random, label: int) -> tuple[str, str]:
    year = rng.randrange(1700, 1990)
    fill = {
        "thing": rng.choice(_QNLI_THINGS),
        "city": rng.choice(_CITIES),
        "person": _person(rng),
        "country": rng.choice(_COUNTRIES),
        "year": year,
        "start": year - rng.randrange(3, 12),
    }
    question, answer = rng.choice(_QNLI_ITEMS)
    sentence = answer if label == 0 else rng.choice(_QNLI_NO_ANSWER)
    return question.format(**fill), sentence.format(**fill)


# QQP: Quora question pairs; duplicates ask the same thing about the same topic in other words,
# non-duplicates ask something else about the same topic.
_QQP_TOPICS = [
    "Python",
    "machine learning",
    "Spanish",
    "guitar",
    "photography",
    "chess",
    "cooking",
    "investing",
]
_QQP_INTENTS = [
    (
        "How do I learn {t} quickly?",
        "How can I learn {t} fast?",
        "What is the quickest way to learn {t}?",
    ),
    (
        "What are the best books for {t}?",
        "What are the best books to learn {t}?",
        "Which are the best books on {t}?",
    ),
    (
        "Is {t} hard to learn for a beginner?",
        "Is {t} difficult for a beginner?",
        "How hard is {t} for beginners?",
    ),
    (
        "How can I make money with {t}?",
        "How do I make money from {t}?",
        "What is the best way to make money with {t}?",
    ),
    (
        "Why do people like {t} so much?",
        "Why is {t} so popular?",
        "Why are so many people into {t}?",
    ),
]


def _qqp_row(rng: random.Random, label: int) -> tuple[str, str]:
    topic = rng.choice(_QQP_TOPICS)
    i = rng.randrange(len(_QQP_INTENTS))
    first, second = rng.sample(_QQP_INTENTS[i], 2)
    if label == 0:  # a related but different question: same topic, another intent
        other = rng.choice([k for k in range(len(_QQP_INTENTS)) if k != i])
        second = rng.choice(_QQP_INTENTS[other])
    return first.format(t=topic), second.format(t=topic)


# MNLI: premise from one of five genres; the hypothesis restates it (entailment), adds an unstated
# reason or detail (neutral) or negates it (contradiction). (premise, entailment, neutral,
# contradiction) per item.
_MNLI_ITEMS: dict[str, list[tuple[str, str, str, str]]] = {
    "fiction": [
        (
            "{p} walked slowly down to the harbor and watched the boats come in.",
            "{p} watched boats at the harbor.",
            "{p} watched the boats because {q} was on one of them.",
            "{p} never went near the harbor.",
        ),
        (
            "{q} closed the letter, folded it twice and hid it under the loose floorboard.",
            "{q} hid the letter.",
            "{q} hid the letter because {p} had asked her to.",
            "{q} left the letter open on the table.",
        ),
    ],
    "government": [
        (
            "The program provides legal services to low-income families in {c}.",
            "Low-income families in {c} can get legal help from the program.",
            "The program in {c} is funded mostly by private donors.",
            "The program refuses to help families in {c}.",
        ),
        (
            "Agencies in {c} must report their annual spending to the audit office by March.",
            "The audit office receives spending reports from agencies in {c}.",
            "Most agencies in {c} report their spending late.",
            "Agencies in {c} never have to report their spending.",
        ),
    ],
    "slate": [
        (
            "Critics in {c} praised the new novel for its honest portrait of small-town life.",
            "The novel was praised by critics in {c}.",
            "The novel is the author's best-selling book so far.",
            "No critic in {c} had anything good to say about the novel.",
        ),
        (
            "The senator from {c} spent most of the hearing defending a bill he once opposed.",
            "The senator defended a bill at the hearing.",
            "The senator changed his mind because of pressure from donors.",
            "The senator attacked the bill throughout the hearing.",
        ),
    ],
    "telephone": [
        (
            "yeah i i think we spent about two weeks in {c} last summer and it was great",
            "we spent some time in {c}",
            "we went to {c} to visit my sister",
            "we have never been to {c}",
        ),
        (
            "well my kids play soccer every weekend so we are at the field a lot",
            "my children play soccer",
            "my kids play soccer because their friends do",
            "my kids do not play any sports",
        ),
    ],
    "travel": [
        (
            (
                "The old quarter of {c} is best explored on foot, with its narrow lanes and tiny "
                "squares."
            ),
            "Walking is a good way to see the old quarter of {c}.",
            "The old quarter of {c} is the most crowded part of the city in August.",
            "The old quarter of {c} can only be seen by car.",
        ),
        (
            "Ferries leave {c} for the islands every hour in summer and twice a day in winter.",
            "There are ferries from {c} to the islands.",
            "The summer ferries from {c} are usually full.",
            "No ferries leave {c} in winter.",
        ),
    ],
}
_DET = {"the", "a", "an", "its", "their", "his", "her", "my", "no", "some"}
_PREP = {"in", "on", "at", "to", "for", "of", "by", "with", "from", "about", "down", "because"}


def _tokens(text: str) -> list[str]:
    return re.findall(r"[\w'-]+|[^\w\s]", text)


def _binary_parse(tokens: list[str]) -> str:
    """A right-branching binary bracketing in the MNLI ``*_binary_parse`` style."""
    out = tokens[-1]
    for tok in reversed(tokens[:-1]):
        out = f"( {tok} {out} )"
    return out


def _tag(tok: str) -> str:
    low = tok.lower()
    if not tok[0].isalnum():
        return "."
    if low in _DET:
        return "DT"
    if low in _PREP:
        return "IN"
    if tok.isdigit():
        return "CD"
    if low in {"i", "we", "it", "he", "she", "they", "you"}:
        return "PRP"
    if tok[0].isupper():
        return "NNP"
    return "VBD" if low.endswith("ed") else "NN"


def _parse_tree(tokens: list[str]) -> str:
    """A flat constituency parse in the MNLI ``*_parse`` (Stanford PCFG) bracket style."""
    return "(ROOT (S " + " ".join(f"({_tag(t)} {t})" for t in tokens) + "))"


def _mnli_row(rng: random.Random, label: int) -> tuple[str, str, str]:
    genre = rng.choice(sorted(_MNLI_ITEMS))
    premise, *hyps = rng.choice(_MNLI_ITEMS[genre])
    names = rng.sample(_FIRST, 2)
    fill = {"p": names[0], "q": names[1], "c": rng.choice(_CITIES)}
    return premise.format(**fill), hyps[label].format(**fill), genre


_GENERATORS = {
    "MRPC": _mrpc_row,
    "RTE": _rte_row,
    "SST-2": _sst2_row,
    "QNLI": _qnli_row,
    "QQP": _qqp_row,
}


def _sample_rows(
    task: str, split: str, n: int, seed: int, copy: int = 0, id_base: int | None = None
) -> tuple[list[list[str]], int]:
    """``n`` rows of ``task``/``split`` in the GLUE release columns (see :data:`_HEADERS`) and the
    base of their pair ids.

    ``copy`` 0 is the ``scale=1`` sample, from ``random.Random(f"glue-{seed}-{task}-{split}")``;
    copy ``k >= 1`` (an extra copy of a scaled sample) draws from the same name plus
    ``/scale/{k}``, numbers its rows ``k*n …`` on and, given copy 0's ``id_base``, continues its
    pair ids, so that indices and pair ids stay unique over all copies."""
    name = f"glue-{seed}-{task}-{split}"
    rng = random.Random(name if copy == 0 else f"{name}/scale/{copy}")
    spec = _SPECS[task]
    k = len(spec.labels)
    # balanced labels in shuffled order (MRPC leans positive like the real set: 2 of 3)
    weights = [1, 2] if task == "MRPC" else [1] * k
    labels = [i for i in range(k) for _ in range(weights[i])] * (n // sum(weights) + 1)
    labels = labels[:n]
    rng.shuffle(labels)
    rows: list[list[str]] = []
    own_base = rng.randrange(100_000, 3_000_000)
    if id_base is None:
        id_base = own_base
    for i, label in enumerate(labels, start=copy * n):
        if task == "MNLI":
            s1, s2, genre = _mnli_row(rng, label)
            prompt = rng.randrange(1000, 150_000)
            t1, t2 = _tokens(s1), _tokens(s2)
            row = [
                str(i),
                str(prompt),
                f"{prompt}{spec.labels[label][0]}",
                genre,
                _binary_parse(t1),
                _binary_parse(t2),
                _parse_tree(t1),
                _parse_tree(t2),
                s1,
                s2,
            ]
            if split == "train":
                row += [spec.labels[label], spec.labels[label]]
            elif split == "val":
                votes = [spec.labels[label]] * 5
                votes[rng.randrange(1, 5)] = rng.choice(spec.labels)  # one annotator may disagree
                row += votes + [spec.labels[label]]
            rows.append(row)
            continue
        a, b = _GENERATORS[task](rng, label)
        id1 = id_base + 37 * i + rng.randrange(0, 30)
        id2 = id1 + rng.randrange(1, 200)
        gold = spec.labels[label] if task in ("RTE", "QNLI") else str(label)
        if task == "MRPC":
            row = (
                [gold, str(id1), str(id2), a, b]
                if split != "test"
                else [str(i), str(id1), str(id2), a, b]
            )
        elif task == "SST-2":
            row = [a, gold] if split != "test" else [str(i), a.strip()]
        elif task == "QQP":
            pair = [str(id1), str(2 * id1), str(2 * id1 + 1)]
            row = pair + [a, b, gold] if split != "test" else [str(i), a, b]
        else:  # RTE, QNLI
            row = [str(i), a, b] + ([gold] if split != "test" else [])
        rows.append(row)
    return rows, id_base


def write_samples(
    out_dir: str | os.PathLike,
    seed: int = 0,
    rows: dict[str, int] | None = None,
    scale: int = 1,
) -> dict[str, dict[str, int]]:
    """Write deterministic GLUE-release-layout samples of the six FedMCP tasks into ``out_dir``.

    Files: ``<out_dir>/<TASK>/{train,dev,test}.tsv`` (MNLI: ``train``, ``dev_matched``,
    ``test_matched``) with each task's GLUE header and columns (MRPC's train/dev with the UTF-8
    byte-order mark; test files unlabelled). Labels are balanced (MRPC 2:1 positive, like the
    real set) and follow from the texts: SST-2 adjective polarity; MRPC same vs changed
    figures/facts; RTE and MNLI hypotheses that restate, extend or contradict the premise; QNLI
    sentences that do or do not contain the asked year/person/place; QQP same vs different intent
    on one topic. Output is byte-identical for the same arguments.

    Parameters
    ----------
    out_dir:
        Target folder (``resources/samples/glue`` for the committed samples).
    seed:
        Seed of the generator (each task/split draws from its own ``random.Random``).
    rows:
        Rows per split, ``{"train": n, "val": n, "test": n}``; default :data:`SAMPLE_ROWS`.
    scale:
        Integer ``>= 1``; every file gets ``scale`` × ``rows[split]`` rows. ``scale=1`` is the
        committed sample; copies ``k = 1 … scale-1`` follow it, each from its own stream
        ``random.Random(f"glue-{seed}-{task}-{split}/scale/{k}")`` (balanced labels per copy),
        with the ``index`` column (and QQP's pair ids) running on.

    Returns
    -------
    dict
        ``{task: {split: rows}}``.
    """
    scale = check_scale(scale)
    out_dir = Path(out_dir)
    rows = rows or SAMPLE_ROWS
    counts: dict[str, dict[str, int]] = {}
    for task in TASKS:
        counts[task] = {}
        for split, fname in _SAMPLE_FILES[task].items():
            header = _HEADERS.get((task, split)) or _HEADERS[(task, "train")]
            body, id_base = _sample_rows(task, split, rows[split], seed)
            for k in range(1, scale):
                body += _sample_rows(task, split, rows[split], seed, copy=k, id_base=id_base)[0]
            text = "".join("\t".join(r) + "\n" for r in [header, *body])
            write_text_atomic(out_dir / task / fname, text)
            counts[task][split] = len(body)
    return counts
