"""Deterministic QMSum-schema sample meetings for the three AdaFedSelecKD domains.

The committed samples (``resources/samples/qmsum/<Domain>/<split>.jsonl``) let the whole pipeline run
and be tested without the real QMSum release. They use the *raw* QMSum schema (one meeting per line
with ``meeting_transcripts``, ``topic_list``, ``general_query_list`` and ``specific_query_list``;
spans are ``[start, end]`` decimal strings, inclusive), so :mod:`fedrepro.data.sources.qmsum`
parses them with the same code as the real data.

The three domains are deliberately non-IID, mirroring the relative pattern of AdaFedSelecKD's
Table II (§II-A) and the character of the QMSum sources:

* **Academic** (ICSI-like): speech-recognition research meetings; speakers "Professor B", "PhD A",
  "Grad F", ...; pre-tokenized text with disfluency markers; ~10 turns of medium length per
  topic; short summaries in the "PhD A reported that ..." style.
* **Committee** (parliament/council): "Chair", "Prime Minister", "Mr. Smith", ...; a few long, formal
  turns per topic; the longest summaries (budget figures, concerns, promises, decision).
* **Product** (AMI-like remote-control design): "Project Manager", "Marketing", "Industrial
  Designer", "User Interface"; many short turns with ``{vocalsound}`` noise; medium summaries
  (proposal, price, objection, decision).

Every answer is generated from facts that are stated in the turns its ``relevant_text_span`` points
to (who proposed what, the entities and numbers, the objection and the decision), with a
domain-specific template chosen by the query type, so a summarizer can learn it and beat trivial
baselines such as copying the first sentence of the input.

Regenerate the committed files with
``python -m fedrepro.data.samples.qmsum resources/samples/qmsum``; output is byte-identical for the
same arguments.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fedrepro.data.samples import check_scale
from fedrepro.io import write_jsonl_atomic

__all__ = [
    "DEFAULT_N_MEETINGS",
    "QUERIES_PER_MEETING",
    "generate_meeting",
    "main",
    "write_qmsum_samples",
]

DOMAINS: tuple[str, ...] = ("Academic", "Committee", "Product")
SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_N_MEETINGS: dict[str, int] = {"train": 8, "val": 2, "test": 2}
QUERIES_PER_MEETING = 5

Turn = tuple[str, str]


# -- text style helpers ----------------------------------------------------------------------
def _spaced(text: str, split_contractions: bool) -> str:
    """ICSI/AMI transcript style: punctuation as separate tokens (``OK , so .``)."""
    text = re.sub(r"([?!]|[.,;:](?=\s|$))", r" \1", text)
    if split_contractions:
        text = re.sub(r"(\w)'(s|m|re|ll|ve|d)\b", r"\1 '\2", text)
    return " ".join(text.split())


def _title(text: str) -> str:
    return text[:1].upper() + text[1:]


def _pick(rng: random.Random, items: Sequence, k: int) -> list:
    return rng.sample(list(items), k)


def _fill(rng: random.Random, pool: Sequence[str], n: int) -> list[str]:
    return [rng.choice(pool) for _ in range(n)]


# == Academic ================================================================================
ACADEMIC_SPEAKERS = ("PhD A", "PhD C", "PhD D", "Grad F", "Grad E", "Postdoc A")
ACADEMIC_PROFESSORS = ("Professor B", "Professor C")
ACADEMIC_METHODS = (
    "spectral subtraction",
    "the tandem features",
    "online mean normalization",
    "the voice activity detector",
    "the LDA filters",
    "the multi-band features",
    "the delta features",
    "Wiener filtering",
    "the neural net posteriors",
    "vocal tract length normalization",
    "the echo canceller",
    "the pitch tracker",
    "the new phone set",
    "the noise estimation",
)
ACADEMIC_CORPORA = (
    "the Aurora digits",
    "the Italian test set",
    "the SpeechDat-Car data",
    "the Meeting Recorder digits",
    "the TI-digits",
    "the far-field channels",
    "the Finnish data",
    "the Switchboard subset",
)
ACADEMIC_CONCERNS = (
    "the latency of the front end",
    "the mismatch between training and test conditions",
    "overfitting on the small training set",
    "the silence frames",
    "the clipping on the far-field mikes",
    "the disk space on the servers",
    "the noise in the reference transcripts",
    "the variance of the results",
)
ACADEMIC_ACTIONS = (
    "run the full test set",
    "retrain the net with more data",
    "write it up for the Eurospeech paper",
    "compare it against the baseline",
    "add more noise conditions",
    "check the scripts with Dave",
    "try it on the wideband data",
    "send the numbers to the OGI people",
)
ACADEMIC_FILLERS = (
    "Yeah .",
    "OK .",
    "Mm-hmm .",
    "Right .",
    "Uh-huh .",
    "Yeah , yeah .",
    "Hmm .",
    "OK , right .",
)
ACADEMIC_ASIDES = (
    "We 're still using the same training set as last time , {disfmarker} the clean one .",
    "The features are computed every ten milliseconds , so that part is the same .",
    "Um , I also had to fix a bug in the scripts , but that did n't change much .",
    "It takes about a day to train on the machines we have now .",
    "I did n't touch the back end , it 's still the HTK setup .",
    "Uh , the numbers are averaged over the three noise conditions .",
    "So , uh , that 's with the standard twelve cepstral coefficients plus energy .",
    "I think the well-matched case is where most of the gain comes from .",
)


def _academic_segment(rng: random.Random, speakers: list[str], prof: str, method: str) -> dict:
    proposer, responder = _pick(rng, [s for s in speakers if s != prof], 2)
    corpus, concern, action = (
        rng.choice(ACADEMIC_CORPORA),
        rng.choice(ACADEMIC_CONCERNS),
        rng.choice(ACADEMIC_ACTIONS),
    )
    base = round(rng.uniform(8.0, 30.0), 1)
    new = round(base - rng.uniform(0.8, base * 0.3), 1)
    delay = rng.choice((10, 20, 30, 40, 60, 80, 100))
    others = [s for s in speakers if s not in (proposer, responder, prof)]
    bystander = others[0] if others else responder
    turns: list[Turn] = [
        (prof, f"OK , so {proposer} , you were going to tell us about {method} ?"),
        (
            proposer,
            (
                f"Yeah . So , uh , this week I tried {method} on {corpus} . "
                f"And the word error rate went from {base} percent down to {new} percent . "
                f"{' '.join(_pick(rng, ACADEMIC_ASIDES, 2))}"
            ),
        ),
        (bystander, rng.choice(ACADEMIC_FILLERS)),
        (prof, "Uh-huh . And what 's the delay on that ?"),
        (
            proposer,
            (
                f"It adds about {delay} milliseconds of delay , {{disfmarker}} which is still under the limit . "
                f"{rng.choice(ACADEMIC_ASIDES)}"
            ),
        ),
        (responder, f"I 'm a bit worried about {concern} , though . {rng.choice(ACADEMIC_ASIDES)}"),
        (proposer, rng.choice(ACADEMIC_FILLERS) + " " + rng.choice(ACADEMIC_ASIDES)),
        (
            prof,
            f"OK . I think you should {action} before we decide anything . {rng.choice(ACADEMIC_ASIDES)}",
        ),
        (proposer, "Yeah , I can do that for next week ."),
    ]
    for _ in range(rng.randint(0, 2)):  # some extra back-channel
        pos = rng.randint(2, len(turns) - 1)
        turns.insert(pos, (rng.choice(speakers), rng.choice(ACADEMIC_FILLERS)))
    topic = method.removeprefix("the ")
    facts = {
        "P": proposer,
        "R": responder,
        "Prof": prof,
        "method": method,
        "corpus": corpus,
        "base": base,
        "new": new,
        "delay": delay,
        "concern": concern,
        "action": action,
        "topic": topic,
    }
    return {"topic": _title(topic), "turns": turns, "facts": facts}


def _academic_queries(f: dict) -> list[tuple[str, str]]:
    result = (
        f"{f['P']} reported that {f['method']} reduced the word error rate on {f['corpus']} from "
        f"{f['base']} to {f['new']} percent"
    )
    report = f"{result}, with {f['delay']} milliseconds of delay."
    short = f"{result}."
    # short answers: the Academic client has the shortest summaries (Table II)
    worry = f"{f['R']} was worried about {f['concern']}"
    advice = f"{f['Prof']} suggested that {f['P']} should {f['action']}"
    return [
        (f"Summarize the discussion about {f['method']}.", f"{short} {worry}, and {advice}."),
        (f"What did {f['P']} report about {f['method']}?", f"{report} {worry}, so {advice}."),
        (
            f"What did {f['Prof']} suggest about {f['method']}?",
            f"{advice}, because {f['R']} was worried about {f['concern']}. {short}",
        ),
    ]


def _academic_meeting(rng: random.Random, n_topics: int) -> dict:
    prof = rng.choice(ACADEMIC_PROFESSORS)
    methods = iter(_pick(rng, ACADEMIC_METHODS, n_topics))
    speakers = [prof] + _pick(rng, ACADEMIC_SPEAKERS, rng.randint(3, 4))
    opening = [
        (speakers[1], "OK , we 're on ."),
        (prof, "So , uh , let 's do the digits at the end . {disfmarker} Agenda items , anyone ?"),
        (speakers[2], "Um , I have some results on the noise stuff ."),
    ]
    closing = [(prof, "OK , I think that 's it . Let 's do the digits ."), (speakers[1], "OK .")]
    return {
        "speakers": speakers,
        "opening": opening,
        "closing": closing,
        "segment": lambda r: _academic_segment(r, speakers, prof, next(methods)),
        "queries": _academic_queries,
        "recap": lambda f: (
            prof,
            f"So , just to recap , {f['P']} is going to {f['action']} for {f['method']} .",
        ),
        "style": lambda t: _spaced(t, split_contractions=True),
    }


# == Committee ===============================================================================
COMMITTEE_MEMBERS = (
    "Mr. Smith",
    "Ms. Jones",
    "Mrs. Patel",
    "Mr. Davies",
    "Dr. Evans",
    "Ms. Murphy",
)
COMMITTEE_WITNESSES = (
    "Prime Minister",
    "Minister for Education",
    "Minister for Health",
    "Cabinet Secretary",
)
COMMITTEE_POLICIES = (
    "the school funding formula",
    "the rural broadband programme",
    "the mental health strategy",
    "the housing support grant",
    "the apprenticeship scheme",
    "the local bus services",
    "the flood defence plan",
    "the childcare offer",
    "the business support fund",
    "the teacher recruitment plan",
    "the hospital waiting times initiative",
    "the social care workforce plan",
)
COMMITTEE_CONCERNS = (
    "the delays in rural areas",
    "the lack of transparency in spending",
    "the shortage of qualified staff",
    "the pressure on local authorities",
    "the long waiting lists",
    "the impact on small businesses",
    "the gap between urban and rural schools",
    "the rising cost of agency staff",
)
COMMITTEE_CLAIMS = (
    "the money had reached every local authority",
    "an independent review was already under way",
    "the number of front-line staff had risen",
    "the scheme would be extended to more areas next year",
    "the guidance to local authorities had been rewritten",
    "a new monitoring framework was in place",
)
COMMITTEE_DELIVERABLES = (
    "a written update",
    "the full evaluation report",
    "a breakdown of the spending by region",
    "the timetable for the review",
    "the latest performance figures",
    "a note on the staffing numbers",
)
COMMITTEE_DECISIONS = (
    "the committee would write to the Minister",
    "the committee would hold a further evidence session",
    "the committee would publish its report before the summer recess",
    "the committee would invite the regulator",
    "the committee would return to the issue in the autumn",
    "the clerks would draft recommendations",
)
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "September",
    "October",
    "November",
)
COMMITTEE_MEMBER_FORMAL = (
    "This is a matter of real concern to many of my constituents.",
    "Members will recall that we discussed a related issue at our meeting in the spring.",
    "The previous report from this committee made a number of recommendations on exactly this point.",
    "I have read the written evidence carefully, and I am not sure it answers the question.",
)
COMMITTEE_WITNESS_FORMAL = (
    "I am grateful to the Member for raising this matter.",
    "We have worked closely with our partners in local government and in the health boards throughout.",
    "The evidence we have received from stakeholders has been very helpful in shaping the work.",
    "It is important that this committee is able to scrutinise the figures in detail, and I welcome that scrutiny.",
    "Of course, there is always more to do, and we are not complacent about the challenges that remain.",
    "I want to put on record my thanks to the officials who have supported this work.",
)


def _committee_segment(
    rng: random.Random, chair: str, members: list[str], witness: str, policy: str
) -> dict:
    member = rng.choice(members)
    concern, claim, deliverable, decision = (
        rng.choice(COMMITTEE_CONCERNS),
        rng.choice(COMMITTEE_CLAIMS),
        rng.choice(COMMITTEE_DELIVERABLES),
        rng.choice(COMMITTEE_DECISIONS),
    )
    amount = rng.choice((4, 6, 12, 15, 20, 25, 32, 40, 48, 60, 75, 90, 120, 150))
    year = rng.randint(2016, 2022)
    month = rng.choice(MONTHS)
    formal = [rng.choice(COMMITTEE_MEMBER_FORMAL), rng.choice(COMMITTEE_WITNESS_FORMAL)]
    turns: list[Turn] = [
        (chair, f"Thank you. We now move on to {policy}. {member}, would you like to start?"),
        (
            member,
            (
                f"Thank you, Chair. {witness}, {policy} received {amount} million pounds in {year}, and yet we are still "
                f"hearing from people across the country about {concern}. {formal[0]} Can you explain to the committee "
                f"why the money has not made more of a difference, and what you intend to do about {concern}?"
            ),
        ),
        (
            witness,
            (
                f"Thank you for the question. {formal[1]} On {policy}, I can tell the committee that {claim}. "
                f"We recognise the concern about {concern}, and I will provide {deliverable} "
                f"to the committee by {month}."
            ),
        ),
        (
            chair,
            (
                f"Thank you, {witness}. I think we are agreed that {decision}. We will look carefully at "
                f"{deliverable} when it arrives in {month}."
            ),
        ),
    ]
    if rng.random() < 0.3:  # a short follow-up from another member
        other = rng.choice([m for m in members if m != member])
        turns.insert(
            3,
            (
                other,
                (
                    f"Could I just add, Chair, that {concern} is also raised with me regularly? "
                    f"I hope the {witness} will look at it closely."
                ),
            ),
        )
    facts = {
        "C": chair,
        "M": member,
        "W": witness,
        "policy": policy,
        "amount": amount,
        "year": year,
        "concern": concern,
        "claim": claim,
        "deliverable": deliverable,
        "month": month,
        "decision": decision,
    }
    topic = policy.removeprefix("the ")
    return {"topic": _title(topic), "turns": turns, "facts": facts}


def _committee_queries(f: dict) -> list[tuple[str, str]]:
    raised = (
        f"{f['M']} pointed out that {f['policy']} had received {f['amount']} million pounds in {f['year']}, "
        f"but raised concerns about {f['concern']}."
    )
    answered = (
        f"The {f['W']} answered that {f['claim']} and promised to provide {f['deliverable']} "
        f"to the committee by {f['month']}."
    )
    concluded = f"In the end, the {f['C']} concluded that {f['decision']}."
    return [
        (
            f"Summarize the discussion about {f['policy']}.",
            f"The committee discussed {f['policy']}. {raised} {answered} {concluded}",
        ),
        (
            f"What did the {f['W']} say about {f['policy']}?",
            (
                f"When {f['M']} asked about {f['concern']}, the {f['W']} said that {f['claim']}. The {f['W']} also "
                f"promised to provide {f['deliverable']} to the committee by {f['month']}, after {f['policy']} had "
                f"received {f['amount']} million pounds in {f['year']}. {concluded}"
            ),
        ),
        (
            f"What did the committee decide about {f['policy']}?",
            f"The {f['C']} concluded that {f['decision']}. {raised} {answered}",
        ),
    ]


def _committee_meeting(rng: random.Random, n_topics: int) -> dict:
    chair = "Chair"
    policies = iter(_pick(rng, COMMITTEE_POLICIES, n_topics))
    witness = rng.choice(COMMITTEE_WITNESSES)
    members = _pick(rng, COMMITTEE_MEMBERS, rng.randint(2, 3))
    speakers = [chair, witness] + members
    opening = [
        (
            chair,
            (
                f"Good morning, and welcome to this meeting of the committee. We have received no apologies this "
                f"morning. I am very pleased to welcome the {witness}, who is here to answer our questions today."
            ),
        ),
        (
            witness,
            "Thank you, Chair. I am pleased to be here and happy to take the committee's questions.",
        ),
    ]
    closing = [(chair, "Thank you very much for your attendance today. The meeting is now closed.")]
    return {
        "speakers": speakers,
        "opening": opening,
        "closing": closing,
        "segment": lambda r: _committee_segment(r, chair, members, witness, next(policies)),
        "queries": _committee_queries,
        "recap": lambda f: (
            chair,
            (
                f"Before we close, I remind Members that on {f['policy']} {f['decision']}, "
                f"and that we expect {f['deliverable']} by {f['month']}."
            ),
        ),
        "style": lambda t: t,
    }


# == Product =================================================================================
PRODUCT_ROLES = ("Project Manager", "Marketing", "Industrial Designer", "User Interface")
PRODUCT_FEATURES = (
    "an LCD screen",
    "voice recognition",
    "a kinetic battery",
    "rubber push-buttons",
    "a scroll wheel",
    "a solar panel",
    "a titanium case",
    "a banana-shaped case",
    "a glow-in-the-dark case",
    "a locator beeper",
    "a double-curved case",
    "interchangeable fronts",
    "a docking station",
    "a touch pad",
)
PRODUCT_ALTERNATIVES = (
    "a standard battery",
    "plastic buttons",
    "a simple flat case",
    "a joystick",
    "a basic infrared chip",
    "a single-curved case",
    "hard plastic",
    "a simple chip",
)
PRODUCT_TARGETS = (
    "young people",
    "elderly users",
    "teenagers",
    "families with children",
    "people aged fifteen to thirty-five",
    "first-time buyers",
    "people who lose their remote",
)
PRODUCT_REASONS = (
    "it was too expensive",
    "it would exceed the budget",
    "users found it confusing",
    "it was not trendy enough",
    "it would be hard to manufacture",
    "it would break too easily",
)
PRODUCT_FINDINGS = (
    "found current remotes ugly",
    "lost their remote control regularly",
    "wanted fewer buttons",
    "would pay more for a fancy design",
    "only used a few buttons",
    "found remotes hard to learn",
)
PRODUCT_FILLERS = (
    "Yeah .",
    "Mm-hmm .",
    "Okay .",
    "{vocalsound}",
    "Right .",
    "Uh-huh .",
    "That's true .",
    "Yeah . {vocalsound}",
    "Sure .",
    "Okay . {gap}",
)
PRODUCT_ASIDES = (
    "The buttons should be easy to find .",
    "We have to keep the company colours in it .",
    "It should fit in your hand .",
    "I can do a sketch of it later .",
    "It has to be robust .",
    "People want something fancy .",
    "That would make it look different .",
    "We only have one chip to play with .",
)


def _product_segment(rng: random.Random, feature: str) -> dict:
    pm = "Project Manager"
    proposer, opponent = _pick(rng, PRODUCT_ROLES[1:], 2)
    alternative, target, reason, finding = (
        rng.choice(PRODUCT_ALTERNATIVES),
        rng.choice(PRODUCT_TARGETS),
        rng.choice(PRODUCT_REASONS),
        rng.choice(PRODUCT_FINDINGS),
    )
    price = rng.choice((2, 3, 4, 5, 6, 7, 8, 9))
    pct = rng.choice((40, 50, 60, 65, 70, 75, 80, 85))
    chosen_feature = rng.random() < 0.5
    chosen = feature if chosen_feature else alternative
    turns: list[Turn] = [
        (pm, f"Okay . Next thing is , um , what we put on it . {rng.choice(PRODUCT_ASIDES)}"),
        (proposer, f"So I was thinking we could use {feature} . {rng.choice(PRODUCT_ASIDES)}"),
        (rng.choice(PRODUCT_ROLES), rng.choice(PRODUCT_FILLERS)),
        (proposer, f"It would really appeal to {target} . {rng.choice(PRODUCT_ASIDES)}"),
        (pm, "Mm-hmm . And what does it cost ?"),
        (proposer, f"About {price} Euros per unit , I think . {rng.choice(PRODUCT_ASIDES)}"),
        (rng.choice(PRODUCT_ROLES), rng.choice(PRODUCT_FILLERS)),
        ("Marketing", f"Well , in our survey {pct} percent of the users {finding} ."),
        (rng.choice(PRODUCT_ROLES), rng.choice(PRODUCT_FILLERS)),
        (opponent, f"{{vocalsound}} But I'd rather go for {alternative} ."),
        (pm, "Why ?"),
        (opponent, f"Because {reason} . {' '.join(_pick(rng, PRODUCT_ASIDES, 2))}"),
        (rng.choice(PRODUCT_ROLES), rng.choice(PRODUCT_FILLERS)),
        (proposer, f"Hmm . {rng.choice(PRODUCT_ASIDES)}"),
        (pm, f"Okay , so we decide to go with {chosen} ."),
        (rng.choice(PRODUCT_ROLES[1:]), rng.choice(PRODUCT_FILLERS)),
    ]
    for _ in range(rng.randint(3, 6)):  # more back-channel: many short turns
        pos = rng.randint(2, len(turns) - 2)
        turns.insert(pos, (rng.choice(PRODUCT_ROLES), rng.choice(PRODUCT_FILLERS)))
    facts = {
        "PM": pm,
        "P": proposer,
        "O": opponent,
        "feature": feature,
        "alternative": alternative,
        "target": target,
        "reason": reason,
        "finding": finding,
        "price": price,
        "pct": pct,
        "chosen": chosen,
    }
    topic = re.sub(r"^(an?|the) ", "", feature)
    facts["topic"] = topic
    return {"topic": _title(topic), "turns": turns, "facts": facts}


def _product_queries(f: dict) -> list[tuple[str, str]]:
    proposal = (
        f"{f['P']} proposed {f['feature']} for the remote control because it would appeal to "
        f"{f['target']}, at about {f['price']} Euros per unit."
    )
    survey = f"Marketing added that in their survey {f['pct']} percent of the users {f['finding']}."
    objection = f"{f['O']} preferred {f['alternative']} because {f['reason']}."
    decision = f"Project Manager decided that the team would go with {f['chosen']}."
    return [
        (
            f"Summarize the discussion about the {f['topic']}.",
            f"{proposal} {survey} {objection} In the end, {decision}",
        ),
        (
            f"What did {f['O']} think about the {f['topic']}?",
            (
                f"{objection[:-1]}, while {f['P']} had proposed {f['feature']} at about {f['price']} Euros per unit "
                f"to appeal to {f['target']}. {survey} {decision}"
            ),
        ),
        (
            f"What did the group decide about the {f['topic']}?",
            f"{decision} {proposal} {objection}",
        ),
    ]


def _product_meeting(rng: random.Random, n_topics: int) -> dict:
    speakers = list(PRODUCT_ROLES)
    features = iter(_pick(rng, PRODUCT_FEATURES, n_topics))
    opening = [
        ("Project Manager", "Okay . Good morning everybody . {vocalsound}"),
        ("Marketing", "Morning ."),
        (
            "Project Manager",
            "So this is our meeting about the remote control design . I'll go through the agenda .",
        ),
        ("Industrial Designer", "Okay ."),
    ]
    closing = [
        ("Project Manager", "Okay , that's it for today . Thanks everybody ."),
        ("User Interface", "Thanks ."),
    ]
    return {
        "speakers": speakers,
        "opening": opening,
        "closing": closing,
        "segment": lambda r: _product_segment(r, next(features)),
        "queries": _product_queries,
        "recap": lambda f: (
            "Project Manager",
            f"So for the {f['topic']} we go with {f['chosen']} , that's decided .",
        ),
        "style": lambda t: _spaced(t, split_contractions=False),
    }


_MEETING_BUILDERS: dict[str, Callable[[random.Random, int], dict]] = {
    "Academic": _academic_meeting,
    "Committee": _committee_meeting,
    "Product": _product_meeting,
}


# -- meetings ----------------------------------------------------------------------------------
def _overview_sentence(summary: str) -> str:
    """The first informative sentence of a topic summary (skips "The group discussed X.")."""
    sentences = [s.strip() for s in re.split(r"(?<=\.) (?=[A-Z])", summary) if s.strip()]
    for sent in sentences:
        if not re.match(r"The (group|committee) discussed ", sent):
            return sent
    return sentences[0]


def generate_meeting(domain: str, rng: random.Random, n_queries: int = QUERIES_PER_MEETING) -> dict:
    """One raw QMSum-schema meeting of ``domain`` with ``n_queries`` specific queries.

    The transcript is an opening, ``n_queries`` topic segments and a closing; topic ``i`` is the
    span of specific query ``i``. In about half of the meetings the chair/manager recaps the last
    topic's outcome before closing, and that query then has two spans (segment, recap).
    """
    if domain not in _MEETING_BUILDERS:
        raise ValueError(f"unknown domain {domain!r}; expected one of {', '.join(DOMAINS)}")
    spec = _MEETING_BUILDERS[domain](rng, n_queries)
    style = spec["style"]
    transcript: list[Turn] = list(spec["opening"])
    topics: list[dict] = []
    specific: list[dict] = []
    summaries: list[str] = []
    segments = []
    for _ in range(n_queries):
        seg = spec["segment"](rng)
        start = len(transcript)
        transcript.extend(seg["turns"])
        seg["span"] = (start, len(transcript) - 1)
        segments.append(seg)
    recap_span = None
    if rng.random() < 0.5:
        transcript.append(spec["recap"](segments[-1]["facts"]))
        recap_span = (len(transcript) - 1, len(transcript) - 1)
    transcript.extend(spec["closing"])
    for i, seg in enumerate(segments):
        span = [[str(seg["span"][0]), str(seg["span"][1])]]
        topics.append({"topic": seg["topic"], "relevant_text_span": span})
        query, answer = rng.choice(spec["queries"](seg["facts"]))
        spans = list(span)
        if i == len(segments) - 1 and recap_span is not None:
            spans.append([str(recap_span[0]), str(recap_span[1])])
        specific.append({"query": query, "answer": answer, "relevant_text_span": spans})
        summaries.append(_overview_sentence(spec["queries"](seg["facts"])[0][1]))
    return {
        "topic_list": topics,
        "general_query_list": [
            {"query": "Summarize the whole meeting.", "answer": " ".join(summaries)}
        ],
        "specific_query_list": specific,
        "meeting_transcripts": [{"speaker": s, "content": style(c)} for s, c in transcript],
    }


def write_qmsum_samples(
    out_dir: str | os.PathLike,
    n_meetings: dict[str, int] | None = None,
    seed: int = 0,
    scale: int = 1,
) -> dict[str, dict[str, int]]:
    """Write sample meetings to ``out_dir/<Domain>/<split>.jsonl`` in the raw QMSum schema.

    Parameters
    ----------
    out_dir:
        Output root (created if needed). Each file is written atomically.
    n_meetings:
        Meetings per split, e.g. ``{"train": 8, "val": 2, "test": 2}`` (the default); each meeting has
        :data:`QUERIES_PER_MEETING` specific queries, so the default gives 40/10/10 pairs per domain.
    seed:
        Seed of the per-file ``random.Random`` streams (derived from seed, domain and split, so one
        file does not change when another split's size does).
    scale:
        Integer ``>= 1``: each file gets ``scale`` × its meetings (and so ``scale`` × its
        query–summary pairs, whose ids number the meetings of a file). Copies
        ``k = 1 … scale-1`` follow the ``scale=1`` meetings, each drawn from the file's stream
        name plus ``/scale/{k}``.

    Returns
    -------
    dict
        ``{domain: {split: n_meetings_written}}``.
    """
    scale = check_scale(scale)
    counts = dict(DEFAULT_N_MEETINGS)
    if n_meetings:
        unknown = set(n_meetings) - set(SPLITS)
        if unknown:
            raise ValueError(
                f"n_meetings has unknown splits {sorted(unknown)}; expected {', '.join(SPLITS)}"
            )
        counts.update(n_meetings)
    out = Path(out_dir)
    written: dict[str, dict[str, int]] = {}
    for domain in DOMAINS:
        written[domain] = {}
        for split in SPLITS:
            name = f"fedrepro-qmsum-samples/{seed}/{domain}/{split}"
            meetings = []
            for k in range(scale):
                rng = random.Random(name if k == 0 else f"{name}/scale/{k}")
                meetings += [generate_meeting(domain, rng) for _ in range(int(counts[split]))]
            written[domain][split] = write_jsonl_atomic(out / domain / f"{split}.jsonl", meetings)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI ``python -m fedrepro.data.samples.qmsum``:
    ``OUT_DIR [--seed N] [--train N --val N --test N] [--scale N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m fedrepro.data.samples.qmsum",
        description="Regenerate the QMSum-schema sample meetings.",
    )
    parser.add_argument("out_dir", help="output root, e.g. resources/samples/qmsum")
    parser.add_argument("--seed", type=int, default=0)
    for split in SPLITS:
        parser.add_argument(
            f"--{split}",
            type=int,
            default=DEFAULT_N_MEETINGS[split],
            help=f"meetings per domain in {split} (default {DEFAULT_N_MEETINGS[split]})",
        )
    parser.add_argument(
        "--scale", type=int, default=1, help="write N times the meetings of every file (default 1)"
    )
    args = parser.parse_args(argv)
    written = write_qmsum_samples(
        args.out_dir, {s: getattr(args, s) for s in SPLITS}, seed=args.seed, scale=args.scale
    )
    for domain, per_split in written.items():
        print(f"{domain}: " + ", ".join(f"{s}={n} meetings" for s, n in per_split.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
