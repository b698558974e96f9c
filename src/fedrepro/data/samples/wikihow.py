"""Generated WikiHow samples in the raw schema.

:func:`write_samples` writes the committed ``resources/samples/wikihow/``, read by the same
parser as the real data, :mod:`fedrepro.data.sources.wikihow`, whose docstring describes the
schema; the source registry calls it as
``fedrepro.data.sources.get("wikihow").write_samples(out_dir)``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from fedrepro.data.samples import _english as en
from fedrepro.data.sources.wikihow import HEADER

SAMPLE_SIZES: dict[str, int] = {"train": 30, "val": 15, "test": 15}


_TOPICS = (
    (
        "Repot a Cactus",
        [
            (
                "Water the cactus a few days before repotting.",
                "Moist roots slide out of the old pot more easily. Do not water on the day itself.",
            ),
            (
                "Put on thick gloves.",
                "Cactus spines can hurt your hands. Folded newspaper also works as a grip.",
            ),
            (
                "Choose a pot one size larger.",
                "The new pot should have a drainage hole. Terracotta lets the soil dry evenly.",
            ),
            (
                "Fill the pot with cactus soil.",
                "Cactus soil drains quickly and prevents root rot. You can mix in some sand.",
            ),
            (
                "Wait a week before watering.",
                "Damaged roots need time to heal. Keep the plant out of direct sun.",
            ),
        ],
    ),
    (
        "Clean a Cast Iron Pan",
        [
            (
                "Wash the pan while it is still warm.",
                "Food comes off more easily before it cools. Use hot water and a brush.",
            ),
            (
                "Scrub stuck food with coarse salt.",
                "Salt works as a gentle abrasive. Rinse it away afterwards.",
            ),
            (
                "Dry the pan completely.",
                "Water left on the pan causes rust. Heat it on the stove for a minute.",
            ),
            (
                "Rub a thin layer of oil into the pan.",
                "The oil keeps the seasoning intact. Wipe off any excess with a paper towel.",
            ),
        ],
    ),
    (
        "Train a Puppy to Sit",
        [
            (
                "Hold a treat close to the puppy's nose.",
                "Let the puppy sniff it so it stays focused. Use small, soft treats.",
            ),
            (
                "Move your hand up slowly.",
                "The puppy's head will follow the treat and its bottom will lower. Keep your hand close.",
            ),
            (
                "Say sit when the puppy sits down.",
                "Say the word clearly and only once. Timing matters more than volume.",
            ),
            (
                "Give the treat and praise right away.",
                "Immediate rewards help the puppy link the word to the action.",
            ),
            (
                "Practice a few minutes every day.",
                "Short sessions keep the puppy interested. Stop before it gets bored.",
            ),
        ],
    ),
    (
        "Speed Up a Slow Laptop",
        [
            (
                "Restart the laptop.",
                "A restart clears temporary files and stuck programs. Many problems go away this way.",
            ),
            (
                "Remove programs you do not use.",
                "Open the list of installed apps and uninstall old ones. Unused programs often run in the background.",
            ),
            (
                "Disable startup programs.",
                "Fewer startup programs means a faster boot. Use the task manager to switch them off.",
            ),
            (
                "Free up disk space.",
                "Delete old downloads and empty the recycle bin. Keep at least ten percent of the disk free.",
            ),
        ],
    ),
    (
        "Grow Basil Indoors",
        [
            (
                "Pick a sunny windowsill.",
                "Basil needs six to eight hours of light a day. A south-facing window is best.",
            ),
            (
                "Plant the seeds in moist soil.",
                "Press them gently into the surface. Cover the pot with plastic wrap until they sprout.",
            ),
            (
                "Water when the top of the soil is dry.",
                "Basil does not like soggy roots. Water at the base, not on the leaves.",
            ),
            (
                "Pinch off the flower buds.",
                "Flowers make the leaves bitter. Pinching also makes the plant bushier.",
            ),
        ],
    ),
    (
        "Write a Cover Letter",
        [
            (
                "Address the hiring manager by name.",
                "A name shows you did your research. Check the company website or LinkedIn.",
            ),
            (
                "Open with the job you are applying for.",
                "State the position in the first sentence. Mention where you saw the advert.",
            ),
            (
                "Explain why you are a good fit.",
                "Link two or three of your skills to the job description. Give a short example for each.",
            ),
            (
                "Close with a call to action.",
                "Say that you look forward to an interview. Thank the reader for their time.",
            ),
        ],
    ),
)


def generate_article(rng: random.Random) -> tuple[str, str, str]:
    """One raw row ``(headline, title, text)`` in the split-file form: the headline is the bold first
    line of each step, and each step's paragraph in the text starts with that line."""
    title, steps = en.pick(rng, _TOPICS)
    k = rng.randint(3, len(steps))
    chosen = sorted(rng.sample(range(len(steps)), k))
    headline = "".join(f"\n{steps[i][0]}" for i in chosen)
    paragraphs = []
    for i in chosen:
        bold, detail = steps[i]
        extra = en.pick(
            rng, ("", " This step is easy to skip, but it makes a difference.", " Take your time.")
        )
        paragraphs.append(f" {bold} {detail}{extra}")
    return headline, f"How to {title}", "\n".join(paragraphs)


def write_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``train.csv``/``val.csv``/``test.csv`` (header ``headline,title,text``, the form
    :func:`download` produces) with ``scale`` × :data:`SAMPLE_SIZES` articles; byte-identical for the
    same ``seed`` and ``scale``.

    ``scale > 1`` appends copies ``k = 1 … scale-1`` of each split, drawn from
    ``random.Random(f"wikihow-{seed}-{split}/scale/{k}")`` (WikiHow ids are row indices)."""
    scale = en.check_scale(scale)
    out_dir = Path(out_dir)
    counts: dict[str, int] = {}
    for split in en.SPLITS:
        rows = []
        for k in range(scale):
            name = f"wikihow-{seed}-{split}"
            rng = random.Random(name) if k == 0 else en.scale_rng(name, k)
            rows += [generate_article(rng) for _ in range(SAMPLE_SIZES[split])]
        counts[split] = en.write_csv_atomic(out_dir / f"{split}.csv", HEADER, rows)
    return counts
