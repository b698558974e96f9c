"""Generated AMI, ICSI, ELITR and MeetingBank samples in their raw layouts.

Each ``write_<name>_samples`` writes the committed ``resources/samples/<name>/``: deterministic
(byte-identical for the same seed), in the layout that the source's own parser reads
(:mod:`fedrepro.data.sources.ami`, :mod:`~fedrepro.data.sources.icsi`,
:mod:`~fedrepro.data.sources.elitr`, :mod:`~fedrepro.data.sources.meetingbank`); the source
registry calls it as ``fedrepro.data.sources.get(name).write_samples(out_dir)``.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path

from fedrepro.data.samples import check_scale
from fedrepro.data.sources.ami import (
    _AMI_SCENARIO_MEETINGS,
    AMI_FILE,
    AMI_SCENARIO_PARTITION,
    _sentences,
    ami_split,
)
from fedrepro.data.sources.elitr import ELITR_LANG_DIR
from fedrepro.data.sources.icsi import ICSI_TEST_MEETINGS
from fedrepro.io import InputError, atomic_path, write_text_atomic

__all__ = [
    "AMI_SAMPLE_COUNTS",
    "ELITR_SAMPLE_COUNTS",
    "ICSI_SAMPLE_COUNTS",
    "MEETINGBANK_SAMPLE_COUNTS",
    "write_ami_samples",
    "write_elitr_samples",
    "write_icsi_samples",
    "write_meetingbank_samples",
]


def _say(rng: random.Random, text: str, fillers: Sequence[str], p: float = 0.35) -> str:
    """Sprinkle spoken fillers (``um``, ``uh``, ...) in front of clauses."""
    out = []
    for clause in re.split(r"(?<=[,.?!]) ", text):
        if rng.random() < p:
            first = clause.split(" ", 1)[0]
            if first.lower().strip(",.") in _LOWER_OK:
                clause = f"{clause[0].lower()}{clause[1:]}"
            filler = rng.choice(fillers)
            if out and out[-1].endswith(","):  # mid-sentence: "..., uh I like ..."
                filler = filler.lower()
            clause = f"{filler} {clause}"
        out.append(clause)
    return " ".join(out)


# fmt: off
_LOWER_OK = frozenset([
    "the", "this", "that", "these", "our", "my", "as", "here", "we", "it", "on", "not", "yes",
    "can", "please", "thank", "maybe", "hi", "what", "there", "so", "and", "for", "okay", "ok",
    "then", "let's", "let", "'s", "people", "it's", "is", "are",
])
# fmt: on
"""First words that a filler in front of them may lower-case (not "I", names or acronyms)."""


def _number_words(n: int) -> str:
    ones = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    ones += "fifteen sixteen seventeen eighteen nineteen"
    small = ones.split()
    tens = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    if n < 20:
        return small[n]
    return tens[n // 10] + ("" if n % 10 == 0 else f" {small[n % 10]}")


# -- AMI ------------------------------------------------------------------------------------------
_AMI_ROLES = {
    "PM": "project manager",
    "ME": "marketing expert",
    "UI": "user interface designer",
    "ID": "industrial designer",
}
# fmt: off
_AMI_NAMES = [
    "Laura", "Craig", "Andrew", "David", "Sarah", "Rose", "Iain", "Mark", "Agnes", "Tom", "Nathan",
    "Corinne",
]
_AMI_ANIMALS = [
    "monkey", "beagle", "whale", "cat", "dolphin", "owl", "horse", "penguin", "tiger", "rabbit",
]
# fmt: on
_AMI_FEATURES = [
    "a locator beep",
    "a scroll wheel",
    "an LCD screen",
    "voice recognition",
    "a backlight for the buttons",
    "a child lock",
    "teletext buttons",
    "a sleep timer",
]
_AMI_MATERIALS = ["rubber", "plastic", "wood", "titanium", "latex"]
_AMI_ENERGY = ["a kinetic battery", "solar cells", "standard batteries", "a docking station"]
_AMI_SHAPES = ["banana", "curved", "double-curved", "flat", "egg"]
_AMI_COLOURS = ["yellow", "lime green", "dark blue", "silver", "bright red"]
_AMI_FILLERS = ["Um", "Uh", "So", "Well", "Yeah,"]
_AMI_BACKCHANNEL = ["Mm-hmm.", "Okay.", "Yeah.", "Right.", "Uh-huh.", "Mm.", "Sure."]


def _ami_meeting(rng: random.Random, meeting: str) -> dict:
    series_rng = random.Random(f"ami-series-{meeting[:6]}")
    letters = list("ABCD")
    roles = list(_AMI_ROLES)
    series_rng.shuffle(roles)
    names = series_rng.sample(_AMI_NAMES, 4)
    who = dict(zip(roles, zip(letters, names)))
    stage = meeting[6:] or "x"
    said: dict[str, list[str]] = {r: [] for r in roles}
    summary: list[str] = []

    def talk(role: str, text: str) -> None:
        said[role].append(_say(rng, text, _AMI_FILLERS))
        for other in roles:
            if other != role and rng.random() < 0.5:
                said[other].append(rng.choice(_AMI_BACKCHANNEL))

    price = rng.choice([25, 20, 30, 35])
    cost = rng.choice([12, 15, 10])
    if stage == "a" or stage == "x":
        animals = {r: rng.choice(_AMI_ANIMALS) for r in roles}
        f1, f2 = rng.sample(_AMI_FEATURES, 2)
        for r in roles:
            talk(r, f"Hi, I'm {who[r][1]} and I'm the {_AMI_ROLES[r]}.")
        talk(
            "PM",
            "Okay, this is the kick-off meeting for our project, we're designing a new remote "
            "control.",
        )
        for r in roles:
            talk(
                r, f"My favourite animal is a {animals[r]}, I like that it is friendly and clever."
            )
        talk(
            "PM",
            f"For the finances, we're selling it for {_number_words(price)} Euro and it "
            f"should not cost more than {_number_words(cost)} Euro to produce.",
        )
        talk("ME", f"I think people would like {f1} on it.")
        talk("ID", f"And maybe {f2} as well, if the budget allows it.")
        summary += [
            (
                "The project manager introduced the upcoming project to the team members and "
                "the team members introduced themselves and drew their favourite animals."
            ),
            (
                f"The project manager discussed the project finances: a selling price of "
                f"{_number_words(price)} Euro and a production cost of at most "
                f"{_number_words(cost)} Euro."
            ),
            f"The team discussed features to include, such as {f1} and {f2}.",
        ]
    elif stage == "b":
        f1, f2 = rng.sample(_AMI_FEATURES, 2)
        pct = rng.choice([50, 60, 75, 80])
        low, high = rng.choice([(15, 35), (20, 40), (25, 45)])
        talk(
            "PM",
            "This is the functional design meeting, there are new requirements from "
            "management: the remote is only for the television.",
        )
        talk(
            "UI", f"As user interface designer I looked at existing products, and I'd suggest {f1}."
        )
        talk(
            "ME",
            f"Our survey shows that {_number_words(pct)} percent of users find their remote "
            f"ugly, and they want {f2}.",
        )
        talk(
            "ID", "As industrial designer I looked at the inside, the chip and the infrared sender."
        )
        talk(
            "PM",
            f"So we decide to target people from {_number_words(low)} to "
            f"{_number_words(high)}, and to include {f1}.",
        )
        summary += [
            (
                "The project manager presented the new requirements: the remote is only for the "
                "television."
            ),
            f"The user interface designer presented existing products and suggested {f1}.",
            (
                f"The marketing expert reported that {_number_words(pct)} percent of users find "
                f"their remote ugly and want {f2}."
            ),
            (
                f"The team decided to target people from {_number_words(low)} to "
                f"{_number_words(high)} and to include {f1}."
            ),
        ]
    elif stage == "c":
        material = rng.choice(_AMI_MATERIALS)
        energy = rng.choice(_AMI_ENERGY)
        colour = rng.choice(_AMI_COLOURS)
        f1 = rng.choice(_AMI_FEATURES)
        talk("PM", "This is the conceptual design meeting, we'll hear the three presentations.")
        talk("ID", f"As industrial designer I'd use {energy} and a {material} case.")
        talk("UI", f"For the interface I'd go with {f1} and few buttons.")
        talk("ME", f"The trend watching says fancy colours, so maybe {colour}.")
        talk("PM", f"Okay, so we go for {energy}, a {material} case in {colour}, with {f1}.")
        summary += [
            f"The industrial designer proposed {energy} and a {material} case.",
            f"The user interface designer presented an interface with {f1}.",
            f"The marketing expert reported the current trends and suggested the colour {colour}.",
            f"The team decided on {energy}, a {material} case in {colour} and {f1}.",
        ]
    else:  # d: detailed design
        shape = rng.choice(_AMI_SHAPES)
        material = rng.choice(_AMI_MATERIALS)
        total = rng.choice([11, 12, 13, 14, 16])
        verdict = "within" if total <= cost else "over"
        score = rng.choice([5, 6, 7])
        talk("PM", "This is the detailed design meeting, we evaluate the prototype and the costs.")
        talk("ID", f"Here is the prototype, it has a {shape} shape and a {material} case.")
        talk("UI", "The buttons are on the front and the menu is on the screen.")
        talk("ME", f"On our criteria the prototype scores {_number_words(score)} out of seven.")
        talk(
            "PM",
            f"The cost comes to {_number_words(total)} Euro, which is {verdict} our budget of "
            f"{_number_words(cost)} Euro.",
        )
        summary += [
            (
                f"The industrial designer and user interface designer presented the prototype "
                f"with a {shape} shape and a {material} case."
            ),
            (
                f"The marketing expert led the evaluation and the prototype scored "
                f"{_number_words(score)} out of seven."
            ),
            (
                f"The project manager calculated a cost of {_number_words(total)} Euro, "
                f"{verdict} the budget of {_number_words(cost)} Euro."
            ),
        ]
    paragraphs = [" ".join(said[r]) for r in sorted(roles, key=lambda r: who[r][0])]
    abstract = " ".join(summary)
    return {
        "meeting_id": meeting,
        "transcript": "\n".join(paragraphs),
        "abstract": abstract,
        "abstract_sentences": _sentences(abstract),
    }


AMI_SAMPLE_COUNTS: dict[str, int] = {"train": 24, "val": 8, "test": 8}


_AMI_EXTRA_LETTERS = ("", *"efghijklmnopqrstuvwxyz")
"""Endings of the made-up meeting ids of a scaled AMI sample (``ES2003e``, ``ES2003``): AMI's own
meetings end in a-d, and the parser accepts any id ``[A-Z]{2}\\d{4}[a-z]?``."""


def _ami_extra_ids(split: str, used: set[str]) -> list[str]:
    """Meeting ids for extra ``split`` meetings of a scaled sample, in the order they are taken:
    the split's unused real scenario meetings, then made-up ids of the split's series (the split
    of an AMI id is its series', :func:`ami_split`), so at most 27 ids per series."""
    real = sorted(m for m in _AMI_SCENARIO_MEETINGS if ami_split(m) == split and m not in used)
    made_up = [
        f"{series}{letter}"
        for letter in _AMI_EXTRA_LETTERS
        for series in sorted(AMI_SCENARIO_PARTITION[split])
        if f"{series}{letter}" not in used and ami_split(f"{series}{letter}") == split
    ]
    return real + [m for m in made_up if m not in real]


def write_ami_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``<out_dir>/ami_abstractive.jsonl``: ``scale`` × :data:`AMI_SAMPLE_COUNTS` meetings per
    split.

    Meeting ids are drawn from the real partition (so :func:`ami_split` gives each its split), the
    four channel paragraphs follow the AMI scenario stages (a kick-off, b functional, c conceptual,
    d detailed design) and every abstract sentence restates facts (prices, features, materials, the
    decision) that one speaker says in the transcript. Byte-identical for the same ``seed`` and
    ``scale``.

    ``scale > 1`` appends the extra meetings after the ``scale=1`` lines: first the split's real
    meetings not yet used (in an order drawn from ``random.Random(f"ami-samples-{seed}/scale")``),
    then made-up ids of the split's series (``ES2003e`` …, see :func:`_ami_extra_ids`) whose
    content follows a stage a-d in turn. The split of an AMI id is fixed by its series, and the val
    and test partitions have five series each, so ``scale`` can be at most 16 (135 ids per split).
    """
    scale = check_scale(scale)
    rng = random.Random(f"ami-samples-{seed}")
    meetings = []
    for split, n in AMI_SAMPLE_COUNTS.items():
        pool = sorted(m for m in _AMI_SCENARIO_MEETINGS if ami_split(m) == split)
        meetings += rng.sample(pool, n)
    extra: list[tuple[str, str]] = []  # (meeting id, the id whose stage its content follows)
    if scale > 1:
        used = set(meetings)
        extra_rng = random.Random(f"ami-samples-{seed}/scale")
        for split, n in AMI_SAMPLE_COUNTS.items():
            candidates = _ami_extra_ids(split, used)
            need = n * (scale - 1)
            if len(candidates) < need:
                raise InputError(
                    f"ami: scale={scale} needs {n * scale} {split} meetings, but the AMI ids of "
                    f"that split (its scenario series, one letter) allow {n + len(candidates)}; "
                    f"use scale <= {(n + len(candidates)) // n}"
                )
            n_real = sum(1 for m in candidates if m in _AMI_SCENARIO_MEETINGS)
            real = candidates[:n_real]
            extra_rng.shuffle(real)
            for j, m in enumerate((real + candidates[n_real:])[:need]):
                template = m if m in _AMI_SCENARIO_MEETINGS else m[:6] + "abcd"[j % 4]
                extra.append((m, template))
    lines = [
        json.dumps(_ami_meeting(random.Random(f"ami-{seed}-{m}"), m), ensure_ascii=False)
        for m in sorted(meetings)
    ]
    for m, template in sorted(extra):
        meeting = _ami_meeting(random.Random(f"ami-{seed}-{m}"), template)
        meeting["meeting_id"] = m
        lines.append(json.dumps(meeting, ensure_ascii=False))
    write_text_atomic(Path(out_dir) / AMI_FILE, "\n".join(lines) + "\n")
    return {split: n * scale for split, n in AMI_SAMPLE_COUNTS.items()}


# -- ICSI -----------------------------------------------------------------------------------------
_ICSI_TOPICS = {
    "Bro": [
        ("spectral subtraction", "word error rate", "percent"),
        ("the new voice activity detector", "word error rate", "percent"),
        ("on-line normalization", "error rate on the Italian data", "percent"),
        ("the neural net features", "error rate on Aurora", "percent"),
    ],
    "Bmr": [
        ("the digits recordings", "number of speakers recorded", "speakers"),
        ("the transcription pipeline", "hours transcribed", "hours"),
        ("forced alignment", "alignment errors per meeting", "errors"),
        ("the disk backup", "gigabytes used", "gigabytes"),
    ],
    "Bed": [
        ("the belief-net for the tourist domain", "number of nodes", "nodes"),
        ("construction grammar parsing", "number of constructions", "constructions"),
        ("the SmartKom dialogue data", "number of dialogues", "dialogues"),
        ("the intention recognizer", "accuracy", "percent"),
    ],
}
_ICSI_GROUPS = {
    "Bro": "the robust speech recognition group",
    "Bmr": "the Meeting Recorder group",
    "Bed": "the EDU group",
}
_ICSI_ROLES = ["Professor", "PhD", "PhD", "Grad", "Postdoc", "Grad"]
_ICSI_ROLE_NOUNS = {
    "Professor": "The professor",
    "PhD": "One of the PhD students",
    "Grad": "A grad student",
    "Postdoc": "The postdoc",
}
_ICSI_FILLERS = ["uh ,", "um ,", "so", "well ,", "I mean"]
_ICSI_BACKCHANNEL = ["Yeah .", "Uh - huh .", "OK .", "Right .", "Mm - hmm ."]
_ICSI_MEETINGS = {
    "Bro": [f"Bro{n:03d}" for n in range(3, 29) if n not in (9, 20, 22, 27)],
    "Bmr": [f"Bmr{n:03d}" for n in range(1, 32) if n not in (4, 17, 23)],
    "Bed": [f"Bed{n:03d}" for n in range(2, 18) if n not in (7,)],
}


def _icsi_tok(text: str) -> str:
    """ICSI transcript style: punctuation split off (``OK , so .``)."""
    return re.sub(r"\s+", " ", re.sub(r"([,?!]|\.(?!\d))", r" \1 ", text)).strip()


def _icsi_meeting(rng: random.Random, mid: str) -> dict:
    series = mid[:3]
    n_speakers = rng.randint(4, 6)
    letters = rng.sample(list("ABCDEFGH"), n_speakers)
    roles = ["Professor", *rng.sample(_ICSI_ROLES[1:], n_speakers - 1)]
    people = {
        letter: (role, f"{rng.choice('mf')}e{rng.randint(10, 60):03d}", f"c{rng.randint(0, 9)}")
        for letter, role in zip(letters, roles)
    }
    prof, reporter, other = letters[0], letters[1], letters[2]
    topic, measure, unit = rng.choice(_ICSI_TOPICS[series])
    before = rng.randint(10, 40) + rng.choice([0, 0.5])
    after = round(before * rng.choice([0.7, 0.8, 0.85]), 1)
    if unit not in ("percent",):
        before, after = int(before * 3), int(before * 3 + rng.randint(5, 30))
    next_step = rng.choice(
        [
            "run it on the full test set",
            "write it up for the report",
            "try it on the far mike",
            "check it with the transcribers",
            "compare it with last year's system",
        ]
    )
    problem = rng.choice(
        [
            "the far-field microphones are still noisy",
            "the scripts are slow",
            "some channels are missing",
            "the labels are inconsistent",
        ]
    )
    acts: list[tuple[str, str, str]] = []  # (speaker, text, label)

    def act(speaker: str, text: str, label: str = "s") -> None:
        text = _say(rng, text, _ICSI_FILLERS, 0.3)
        if rng.random() < 0.3:
            text = text.replace(" the ", " the <disfmarker> the ", 1)
        acts.append((speaker, _icsi_tok(text), label))
        if rng.random() < 0.4:
            acts.append((rng.choice(letters), rng.choice(_ICSI_BACKCHANNEL), "b"))

    act(prof, f"OK , so today we should talk about {topic} .")
    act(reporter, f"I 've been working on {topic} this week .")
    act(reporter, f"the {measure} was {before} {unit} before and now it 's {after} {unit} .")
    act(prof, "<vocalsound> that 's good , is that on the whole set ?", "qy")
    act(reporter, f"not yet , the problem is that {problem} .")
    act(other, f"we could {next_step} .")
    act(prof, f"OK , let 's {next_step} then , and talk about it next week .")
    act(letters[-1], "I 'll send around the numbers after the meeting .")
    dialogue, t = [], rng.uniform(0, 20)
    for i, (spk, text, label) in enumerate(acts):
        dur = 0.3 * len(text.split()) + rng.uniform(0, 1)
        role, participant, channel = people[spk]
        dialogue.append(
            {
                "id": f"{mid}.{spk}.dialogueact{i * 3 + 1}",
                "speaker": spk,
                "starttime": f"{t:.3f}",
                "startwordid": f"{mid}.w.{i * 20 + 1}",
                "endtime": f"{t + dur:.3f}",
                "endwordid": f"{mid}.w.{i * 20 + 15}",
                "text": text,
                "label": label,
                "original_label": label,
                "attributes": {"role": role, "participant": participant, "channel": channel},
            }
        )
        t += dur + rng.uniform(0.1, 2.0)
    r_role = _ICSI_ROLE_NOUNS[people[reporter][0]]
    abstract = [
        f"{_ICSI_GROUPS[series][0].upper()}{_ICSI_GROUPS[series][1:]} discussed {topic}.",
        f"{r_role} reported that the {measure} changed from {before} to {after} {unit}.",
        f"It was noted that {problem}.",
    ]
    summary = [
        {"id": f"{mid}.s.{k + 1}", "text": s, "type": "abstract"} for k, s in enumerate(abstract)
    ]
    summary.append(
        {
            "id": f"{mid}.s.{len(summary) + 1}",
            "text": f"The group will {next_step}.",
            "type": "decisions",
        }
    )
    summary.append(
        {
            "id": f"{mid}.s.{len(summary) + 1}",
            "text": f"{problem[0].upper()}{problem[1:]}.",
            "type": "problems",
        }
    )
    return {"sample_id": mid, "dialogue": dialogue, "summary": summary}


ICSI_SAMPLE_COUNTS: dict[str, int] = {"train": 20, "dev": 6, "test": 6}


def _icsi_extra_id(mid: str, copy: int) -> str:
    """The made-up id of ``mid``'s ``copy``-th extra copy (``Bro012`` → ``Bro112``, ``Bro212`` …);
    real ICSI meeting numbers are below 100, so copies never collide."""
    return f"{mid[:3]}{100 * copy + int(mid[3:]):03d}"


def write_icsi_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``<out_dir>/data/{train,dev,test}.json`` in the ``YuanPJ/icsi_summ`` form.

    The test file holds the six traditional test meetings (:data:`ICSI_TEST_MEETINGS`); train/dev
    draw from the other ICSI meeting ids. Each meeting is a research-group discussion (robust ASR,
    Meeting Recorder or EDU series) whose abstract restates the topic, the reported numbers and the
    problem raised in the dialogue acts. Byte-identical for the same ``seed`` and ``scale``.

    ``scale > 1`` appends, to each file, extra copies ``k = 1 … scale-1`` of its meetings under
    made-up ids (:func:`_icsi_extra_id`: ``Bro012`` → ``Bro112``), each generated afresh from its
    own id, so every file holds ``scale`` × :data:`ICSI_SAMPLE_COUNTS` meetings.
    """
    scale = check_scale(scale)
    rng = random.Random(f"icsi-samples-{seed}")
    pool = sorted(m for ms in _ICSI_MEETINGS.values() for m in ms if m not in ICSI_TEST_MEETINGS)
    picked = rng.sample(pool, ICSI_SAMPLE_COUNTS["train"] + ICSI_SAMPLE_COUNTS["dev"])
    by_split = {
        "train": sorted(picked[: ICSI_SAMPLE_COUNTS["train"]]),
        "dev": sorted(picked[ICSI_SAMPLE_COUNTS["train"] :]),
        "test": list(ICSI_TEST_MEETINGS),
    }
    for split, base in by_split.items():
        mids = base + [_icsi_extra_id(m, k) for k in range(1, scale) for m in base]
        by_split[split] = mids
        meetings = [_icsi_meeting(random.Random(f"icsi-{seed}-{m}"), m) for m in mids]
        text = "[\n" + ",\n".join(json.dumps(m, ensure_ascii=False) for m in meetings) + "\n]\n"
        write_text_atomic(Path(out_dir) / "data" / f"{split}.json", text)
    return {s: len(m) for s, m in by_split.items()}


# -- ELITR ----------------------------------------------------------------------------------------
_ELITR_ITEMS = [
    ("the ASR evaluation", "WER", "%"),
    ("the MT system for [LANGUAGE1]", "BLEU", "points"),
    ("the subtitling demo", "latency", "seconds"),
    ("the deliverable for [PROJECT2]", "page count", "pages"),
    ("the data collection at [ORGANIZATION4]", "amount of recordings", "hours"),
    ("the paper for [OTHER3]", "page count", "pages"),
]
_ELITR_ACTIONS = [
    "send the results by email",
    "prepare the slides for the review",
    "update the document on the shared drive",
    "contact [ORGANIZATION2] about the data",
    "rerun the experiments on the new test set",
]
_ELITR_FILLERS = ["Uh,", "So", "Yeah,", "Okay,", "Well,"]
_ELITR_TAGS = ["<laugh/>", "<unintelligible/>", "<typing/>", "<other_noise/>"]


def _elitr_meeting(rng: random.Random) -> tuple[str, list[str], list[tuple[str, str]]]:
    """``(transcript text, speakers, [(annotator, minutes text)])`` of one meeting."""
    people = [f"PERSON{n}" for n in rng.sample(range(1, 20), rng.randint(3, 5))]
    chair = people[0]
    items = rng.sample(_ELITR_ITEMS, 3)
    facts = []
    lines = [f"({chair}) Hello, hello.", "Can you hear me?"]
    for p in people[1:]:
        lines.append(f"({p}) Yes, hi.")
    lines.append(f"({chair}) Okay, so let's go on agenda. We have three points today.")
    for (item, metric, unit), owner in zip(items, rng.sample(people[1:] * 2, 3)):
        value = rng.randint(3, 40) + (0.5 if unit == "%" else 0)
        action = rng.choice(_ELITR_ACTIONS)
        facts.append((item, metric, unit, owner, value, action))
        question = _say(rng, f"[{owner}], what is the status of {item}?", _ELITR_FILLERS)
        lines.append(f"({chair}) {question}")
        status = _say(rng, f"So for {item}, the {metric} is now {value} {unit}.", _ELITR_FILLERS)
        lines.append(f"({owner}) {status}")
        if rng.random() < 0.5:
            tag = rng.choice(_ELITR_TAGS)
            lines.append(
                f"It's <parallel_talk>better than last time</parallel_talk>, I think. {tag}"
            )
        lines.append(f"({rng.choice(people)}) {_say(rng, 'Okay, good.', _ELITR_FILLERS)}")
        lines.append(f"({chair}) {_say(rng, f'So [{owner}] will {action}.', _ELITR_FILLERS)}")
        lines.append(f"({owner}) Yes, I will {action}.")
    day, month = rng.randint(1, 28), rng.randint(1, 12)
    lines.append(f"({chair}) Okay, the next call is on {day}. {month}. Thank you, bye.")
    lines.append(f"({people[-1]}) Bye.")
    minutes = []
    annotators = [f"annot{n:02d}" for n in rng.sample(range(1, 25), rng.choice([1, 2, 2]))]
    for k, annot in enumerate(annotators):
        out = [
            f"Date: 2020-{month:02d}-{day:02d}",
            f"Attendees: {', '.join(f'[{p}]' for p in sorted(people))}",
            "Purpose of meeting: project status",
            "",
        ]
        for item, metric, unit, owner, value, action in facts:
            if k == 0:
                out.append(f"- {item}: {metric} is {value} {unit} ([{owner}])")
                out.append(f"  - [{owner}] will {action}")
            else:
                out.append(f"- [{owner}] reported on {item}, the {metric} is now {value} {unit}.")
                out.append(f"- Action: [{owner}] to {action}.")
        out += [f"- next call on {day}. {month}.", "", f"Minuted by: [ANNOTATOR{k + 1}]"]
        minutes.append((annot, "\n".join(out) + "\n"))
    return "\n".join(lines) + "\n", people, minutes


ELITR_SAMPLE_COUNTS: dict[str, int] = {"train": 16, "dev": 5, "test": 5}


def _elitr_extra_meeting(
    seed: int, meeting: str, n_minutes: int
) -> tuple[str, list[tuple[str, str]]]:
    """``(transcript, minutes)`` of an extra meeting of a scaled sample with exactly ``n_minutes``
    annotators' minutes: drawn from ``random.Random(f"elitr-{seed}-{meeting}")`` (then
    ``…/retry/<r>`` while it has fewer), surplus minutes dropped."""
    for attempt in range(1000):
        name = f"elitr-{seed}-{meeting}" + (f"/retry/{attempt}" if attempt else "")
        transcript, _people, minutes = _elitr_meeting(random.Random(name))
        if len(minutes) >= n_minutes:
            return transcript, minutes[:n_minutes]
    raise RuntimeError(f"no ELITR sample meeting with {n_minutes} minutes for {meeting}")


def write_elitr_samples(
    out_dir: str | os.PathLike, seed: int = 0, scale: int = 1
) -> dict[str, int]:
    """Write ``<out_dir>/elitr-minuting-corpus-en/{train,dev,test}/meeting_en_<split>_NNN/`` with a
    ``transcript_MAN_annotYY.txt`` and one or two ``minutes_GENER_annotYY.txt`` per meeting (plus a
    ``minutes_ORIG.txt`` agenda for some), the English ELITR release layout.

    Meetings are project calls with de-identified speakers (``(PERSON3) ...``); the minutes list
    each agenda item's owner, metric value and action, all said in the transcript. Returns the
    number of *meetings* per split. Byte-identical for the same ``seed`` and ``scale``.

    ``scale > 1`` adds, for each ``scale=1`` meeting ``meeting_en_<split>_NNN`` and each extra copy
    ``k = 1 … scale-1``, a meeting folder ``meeting_en_<split>_<NNN + 100k>`` (upstream numbers
    stay below 100) with as many minutes files as the original meeting
    (:func:`_elitr_extra_meeting`), so each split has ``scale`` × the meetings *and* the records
    (one per minutes file) of the ``scale=1`` sample.
    """
    scale = check_scale(scale)
    rng = random.Random(f"elitr-samples-{seed}")
    root = Path(out_dir) / ELITR_LANG_DIR

    def write_meeting(split: str, idx: int, transcript: str, minutes) -> None:
        folder = root / split / f"meeting_en_{split}_{idx:03d}"
        write_text_atomic(folder / f"transcript_MAN_{minutes[0][0]}.txt", transcript)
        for annot, text in minutes:
            write_text_atomic(folder / f"minutes_GENER_{annot}.txt", text)
        if idx % 3 == 0:
            write_text_atomic(folder / "minutes_ORIG.txt", "Agenda\n1. status\n2. next call\n")

    for split, n in ELITR_SAMPLE_COUNTS.items():
        n_real = {"train": 84, "dev": 10, "test": 18}[split]  # upstream README's meeting ids
        for idx in sorted(rng.sample(range(1, n_real + 1), n)):
            meeting = f"meeting_en_{split}_{idx:03d}"
            transcript, _people, minutes = _elitr_meeting(random.Random(f"elitr-{seed}-{meeting}"))
            write_meeting(split, idx, transcript, minutes)
            for k in range(1, scale):
                extra_idx = idx + 100 * k
                extra = f"meeting_en_{split}_{extra_idx:03d}"
                write_meeting(split, extra_idx, *_elitr_extra_meeting(seed, extra, len(minutes)))
    return {split: n * scale for split, n in ELITR_SAMPLE_COUNTS.items()}


# -- MeetingBank ----------------------------------------------------------------------------------
_MB_CITIES = {
    "SeattleCityCouncil": "seattle",
    "DenverCityCouncil": "denver",
    "BostonCC": "boston",
    "LongBeachCC": "longbeach",
    "AlamedaCC": "alameda",
    "KingCountyCC": "kingcounty",
}
_MB_SUBJECTS = [
    ("the Seattle Department of Transportation", "street improvements on {street}"),
    ("the Office of Housing", "affordable housing at {street}"),
    ("Parks and Recreation", "the renovation of {park}"),
    ("the Police Department", "the purchase of body-worn cameras"),
    ("Public Utilities", "a water main replacement on {street}"),
    ("the Department of Finance", "the 2017 budget for {park}"),
]
_MB_STREETS = ["Rainier Avenue", "Colfax Avenue", "Main Street", "Pine Street", "Federal Boulevard"]
_MB_PARKS = ["Green Lake Park", "City Park", "Franklin Park", "Lincoln Park"]


def _meetingbank_row(rng: random.Random, idx: int) -> dict:
    city = rng.choice(sorted(_MB_CITIES))
    dept, what = rng.choice(_MB_SUBJECTS)
    what = what.format(street=rng.choice(_MB_STREETS), park=rng.choice(_MB_PARKS))
    amount = f"${rng.randint(1, 90) * 25_000:,}"
    date = f"{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{rng.randint(2014, 2022)}"
    if city == "SeattleCityCouncil":
        item = f"CB {rng.randint(118000, 119999)}"
        kind = "AN ORDINANCE"
    elif city == "DenverCityCouncil":
        item = f"{rng.randint(14, 22)}-{rng.randint(100, 1500):04d}"
        kind = "A bill for an ordinance"
    else:
        item = f"Res {rng.randint(31000, 32999)}"
        kind = "A RESOLUTION"
    vote = rng.randint(5, 9)
    summary = f"{kind} relating to {dept}; authorizing {amount} for {what}."
    turns = [
        ("Speaker 0", f"Agenda item {rng.randint(1, 30)}, {item}, {summary}"),
        ("Speaker 1", f"Thank you. I move to adopt {item}."),
        ("Speaker 2", "Second."),
        (
            "Speaker 1",
            (
                f"This item provides {amount} to {dept} for {what}. "
                "It was discussed in committee last week."
            ),
        ),
    ]
    if rng.random() < 0.6:
        turns.append(("Speaker 3", f"I just want to thank staff for the work on {what}."))
    turns += [
        ("Speaker 0", "Please call the roll."),
        ("Speaker 4", f"Aye. Aye. Aye. {_number_words(vote).capitalize()} in favor, none opposed."),
        ("Speaker 0", f"The motion carries and {item} is adopted."),
    ]
    return {
        "id": idx,
        "uid": f"{city}_{date}_{item}",
        "summary": summary,
        "transcript": " ".join(f"{s}: {t}" for s, t in turns),
    }


MEETINGBANK_SAMPLE_COUNTS: dict[str, int] = {"train": 30, "validation": 10, "test": 10}


def write_meetingbank_samples(
    out_dir: str | os.PathLike, seed: int = 0, scale: int = 1
) -> dict[str, int]:
    """Write ``<out_dir>/data/<split>-00000-of-00001.parquet`` (split = train/validation/test) with
    the ``huuuyeah/meetingbank`` columns ``id`` (int64), ``uid``, ``summary``, ``transcript``.

    Each row is a council agenda item: the clerk reads the item (whose text the reference summary
    restates), a motion, a short discussion and the roll call. Byte-identical for the same ``seed``,
    ``scale`` and pyarrow version (no timestamps are stored).

    ``scale > 1`` appends to each split extra copies ``k = 1 … scale-1`` of
    :data:`MEETINGBANK_SAMPLE_COUNTS` rows, drawn from
    ``random.Random(f"meetingbank-samples-{seed}/{split}/scale/{k}")``, with ``uid``s not used
    before in the split and ``id``s running on after the ``scale=1`` rows.
    """
    scale = check_scale(scale)
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(f"meetingbank-samples-{seed}")
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("uid", pa.string()),
            ("summary", pa.string()),
            ("transcript", pa.string()),
        ]
    )
    next_id = 0

    def draw(rng: random.Random, n: int, rows: list[dict], uids: set[str]) -> None:
        nonlocal next_id
        stop = len(rows) + n
        while len(rows) < stop:
            row = _meetingbank_row(rng, next_id)
            next_id += 1
            if row["uid"] not in uids:
                uids.add(row["uid"])
                rows.append(row)

    by_split: dict[str, tuple[list[dict], set[str]]] = {}
    for split, n in MEETINGBANK_SAMPLE_COUNTS.items():  # the scale=1 rows first: ids unchanged
        by_split[split] = ([], set())
        draw(rng, n, *by_split[split])
    for split, n in MEETINGBANK_SAMPLE_COUNTS.items():
        for k in range(1, scale):
            extra_rng = random.Random(f"meetingbank-samples-{seed}/{split}/scale/{k}")
            draw(extra_rng, n, *by_split[split])
    for split, (rows, _uids) in by_split.items():
        table = pa.Table.from_pylist(rows, schema=schema)
        dest = Path(out_dir) / "data" / f"{split}-00000-of-00001.parquet"
        with atomic_path(dest, suffix=".parquet") as tmp:
            pq.write_table(table, tmp, compression="zstd", write_statistics=False)
    return {split: n * scale for split, n in MEETINGBANK_SAMPLE_COUNTS.items()}
