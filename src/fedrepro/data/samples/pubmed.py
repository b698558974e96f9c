"""Generated PubMed samples in the raw schema.

:func:`write_samples` writes the committed ``resources/samples/pubmed/``, read by the same
parser as the real data, :mod:`fedrepro.data.sources.pubmed`, whose docstring describes the
schema; the source registry calls it as
``fedrepro.data.sources.get("pubmed").write_samples(out_dir)``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from fedrepro.data.samples import _english as en

SAMPLE_SIZES: dict[str, int] = {"train": 20, "val": 10, "test": 10}


_CONDITIONS = (
    ("type 2 diabetes", "metformin", "glycated hemoglobin ( hba1c )", "%"),
    ("chronic periodontitis", "scaling and root planing", "probing depth", "mm"),
    ("essential hypertension", "amlodipine", "systolic blood pressure", "mmhg"),
    ("knee osteoarthritis", "intra - articular hyaluronic acid", "pain score", "points"),
    ("iron deficiency anemia", "oral ferrous sulfate", "serum hemoglobin", "g / dl"),
    (
        "chronic obstructive pulmonary disease",
        "pulmonary rehabilitation",
        "six - minute walk distance",
        "m",
    ),
    ("migraine", "topiramate", "monthly headache frequency", "days"),
)
_COUNTRIES = ("india", "iran", "china", "turkey", "brazil", "nigeria", "korea", "italy")
_DESIGNS = (
    "randomized controlled trial",
    "prospective cohort study",
    "cross - sectional study",
    "retrospective study",
)


def generate_article(rng: random.Random, article_id: str) -> dict:
    """One Cohan-format raw record; the abstract restates the article's aim, design, sample size,
    main result (numbers and p value) and conclusion, so it is learnable from the article."""
    cond, treat, outcome, unit = en.pick(rng, _CONDITIONS)
    country, design = en.pick(rng, _COUNTRIES), en.pick(rng, _DESIGNS)
    n = rng.randint(3, 40) * 10
    age_lo, age_hi = rng.randint(18, 35), rng.randint(55, 80)
    mean_age = round(rng.uniform(age_lo + 10, age_hi - 8), 1)
    before = round(rng.uniform(5, 150), 1)
    after = round(before * rng.uniform(0.55, 0.9), 1)
    pct = rng.randint(45, 85)
    p = en.pick(rng, ("0.001", "0.01", "0.02", "0.03", "0.04"))
    weeks = rng.choice((4, 8, 12, 24))
    prevalence = rng.randint(5, 30)
    intro = [
        f"in {country} , the prevalence of {cond} has been estimated at {prevalence} % of the adult population .",
        f"{treat} is widely used in the management of {cond} , but evidence on its effect on {outcome} remains limited .",
        f"the aim of this study was to evaluate the effect of {treat} on {outcome} in patients with {cond} .",
    ]
    methods = [
        f"this {design} was conducted at a tertiary care hospital in {country} .",
        f"a total of {n} patients aged {age_lo} - {age_hi} years with {cond} were included .",
        f"patients received {treat} for {weeks} weeks and {outcome} was measured at baseline and at the end of follow - up .",
        "data were analyzed using spss version 20 and a p value < 0.05 was considered significant .",
    ]
    results = [
        f"the mean age of the patients was {mean_age} years .",
        f"{outcome} decreased from {before} {unit} at baseline to {after} {unit} after {weeks} weeks ( p = {p} ) .",
        f"overall , {pct} % of the patients showed a clinically relevant improvement .",
        "no serious adverse events were recorded during the study period .",
    ]
    discussion = [
        "the main limitations of the study are the single - center design and the short follow - up .",
        f"in conclusion , {treat} significantly improved {outcome} in patients with {cond} and can be recommended in routine practice .",
    ]
    sections = [intro, methods, results, discussion]
    names = ["introduction", "materials and methods", "results", "discussion"]
    if rng.random() < 0.5:
        names = [s.upper() for s in names]
    abstract = [
        f"<S> background : the aim of this study was to evaluate the effect of {treat} on {outcome} in patients with {cond} . </S>",
        f"<S> materials and methods : this {design} included {n} patients aged {age_lo} - {age_hi} years who received {treat} for {weeks} weeks . </S>",
        f"<S> results : {outcome} decreased from {before} {unit} to {after} {unit} ( p = {p} ) and {pct} % of the patients improved . </S>",
        f"<S> conclusion : {treat} significantly improved {outcome} in patients with {cond} . </S>",
    ]
    return {
        "article_id": article_id,
        "article_text": [s for sec in sections for s in sec],
        "abstract_text": abstract,
        "labels": None,
        "section_names": names,
        "sections": sections,
    }


def write_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``train.txt``/``val.txt``/``test.txt`` (JSON lines, the release's names and layout) with
    ``scale`` × :data:`SAMPLE_SIZES` articles; byte-identical for the same ``seed`` and ``scale``.

    ``scale > 1`` appends copies ``k = 1 … scale-1`` of each split, drawn from
    ``random.Random(f"pubmed-{seed}-{split}/scale/{k}")``, with ``PMC`` ids not used before in the
    split."""
    scale = en.check_scale(scale)
    out_dir = Path(out_dir)
    counts: dict[str, int] = {}
    for split in en.SPLITS:
        rng = random.Random(f"pubmed-{seed}-{split}")
        ids = sorted(rng.sample(range(2_000_000, 5_400_000), SAMPLE_SIZES[split]))
        objs = [generate_article(rng, f"PMC{i}") for i in ids]
        used = set(ids)
        for k in range(1, scale):
            rng = en.scale_rng(f"pubmed-{seed}-{split}", k)
            extra = en.draw_new_ids(rng, 2_000_000, 5_400_000, SAMPLE_SIZES[split], used)
            objs += [generate_article(rng, f"PMC{i}") for i in extra]
        counts[split] = en.write_jsonl_ordered(out_dir / f"{split}.txt", objs)
    return counts
