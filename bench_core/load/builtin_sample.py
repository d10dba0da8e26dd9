"""`builtin:sample`: a small ShareGPT-format conversation set that the project generates itself.

No dataset is copied: English-looking text is assembled from word lists and templates by a
seeded generator, so every call returns the same records. The lengths are spread like a real
chat log, so that every one of LMDeploy's sampling filters has something to do: a few greetings
and one-word replies too short to keep, mostly questions of tens of tokens answered in a few
hundred, some pasted notes and essays long enough to be dropped, and a few single-turn records.
"""

from __future__ import annotations

import random
from typing import Any

SAMPLE_SIZE = 300
_SEED = 20240607

_TOPICS = (
    "a hash map",
    "compound interest",
    "photosynthesis",
    "the water cycle",
    "a sourdough starter",
    "public key encryption",
    "a vegetable garden",
    "the French Revolution",
    "a job interview",
    "garbage collection",
    "a marathon training plan",
    "climate models",
    "a small bakery business",
    "the immune system",
    "database indexes",
    "learning a second language",
    "a home budget",
    "the solar system",
    "unit testing",
    "a neighbourhood book club",
    "electric cars",
    "a wedding speech",
    "supply and demand",
    "remote team meetings",
    "a caching layer",
)
_FORMS = ("poem", "story", "product description", "cover letter", "blog post", "limerick", "speech")
_ACTIVITIES = (
    "staying focused while working from home",
    "writing clean code",
    "saving money on groceries",
    "sleeping better",
    "preparing for an exam",
    "running a workshop",
    "learning to draw",
)
_SITUATIONS = (
    "a student in my final year",
    "starting a new job next week",
    "moving to a new city",
    "running a team of five engineers",
    "planning a trip with my parents",
    "writing my first novel",
)
_SUBJECTS = (
    "The first step",
    "A careful reader",
    "A beginner",
    "The main idea",
    "A good example",
    "This approach",
    "The whole team",
    "Every reliable system",
    "Your plan",
    "The final result",
    "A simple checklist",
    "The hardest part",
)
_VERBS = (
    "depends on",
    "improves",
    "requires",
    "explains",
    "changes",
    "reduces the need for",
    "builds on",
    "makes room for",
    "highlights",
    "protects",
    "rewards",
    "comes down to",
)
_ADJECTIVES = (
    "clear",
    "steady",
    "simple",
    "careful",
    "regular",
    "useful",
    "small",
    "honest",
    "practical",
    "shared",
    "early",
    "consistent",
)
_NOUNS = (
    "habits",
    "feedback",
    "structure",
    "practice",
    "planning",
    "trade-offs",
    "evidence",
    "routines",
    "details",
    "goals",
    "measurements",
    "conversations",
)
_TAILS = (
    "over time",
    "in most cases",
    "when the stakes are high",
    "for everyone involved",
    "without much extra effort",
    "as the project grows",
    "in practice",
    "from the very beginning",
    "more than people expect",
    "even on a busy day",
    "",
)
_GREETINGS = ("hi", "Thanks!", "ok", "continue", "Hello there", "great, thank you")
_SHORT_REPLIES = ("Sure.", "Yes.", "You're welcome!", "Okay.")
_FOLLOW_UPS = (
    "Can you expand on the second point?",
    "Make it shorter, please.",
    "Can you give me a concrete example?",
    "What would you do differently?",
    "Rewrite that in a friendlier tone.",
    "Summarize your answer in three bullet points.",
)


def generate_sample_records(num_conversations: int = SAMPLE_SIZE) -> list[dict[str, Any]]:
    """ShareGPT records (`id`, `conversations` of `from`/`value` turns), identical on every call."""
    rng = random.Random(_SEED)
    return [_conversation(rng, index) for index in range(num_conversations)]


def _conversation(rng: random.Random, index: int) -> dict[str, Any]:
    topic = rng.choice(_TOPICS)
    turns = [("human", _opening_prompt(rng, topic)), ("gpt", _answer(rng, topic))]
    exchanges = 0 if rng.random() < 0.03 else rng.choice((1, 1, 1, 2, 3))
    for _ in range(exchanges - 1):
        turns += [("human", rng.choice(_FOLLOW_UPS)), ("gpt", _answer(rng, topic))]
    if exchanges == 0:
        turns = turns[:1]  # a conversation that never got a reply
    return {
        "id": f"sample_{index:04d}",
        "conversations": [{"from": speaker, "value": text} for speaker, text in turns],
    }


def _opening_prompt(rng: random.Random, topic: str) -> str:
    kind = rng.choices(("greeting", "question", "instruction", "notes", "long_paste"), weights=(6, 50, 30, 9, 5))[0]
    if kind == "greeting":
        return rng.choice(_GREETINGS)
    if kind == "question":
        other = rng.choice(_TOPICS)
        return rng.choice(
            (
                f"Explain how {topic} works, in simple terms.",
                f"What are the main differences between {topic} and {other}?",
                f"I am {rng.choice(_SITUATIONS)}. {_sentence(rng, topic)} How should I think about {topic}?",
                f"Why do people say that {topic} is hard to get right?",
            )
        )
    if kind == "instruction":
        return rng.choice(
            (
                f"Write a short {rng.choice(_FORMS)} about {topic}.",
                f"Give me {rng.randint(3, 10)} tips for {rng.choice(_ACTIVITIES)}.",
                f"Draft an email to my manager about {topic}. {_paragraph(rng, topic, rng.randint(1, 3))}",
            )
        )
    sentences = rng.randint(5, 40) if kind == "notes" else rng.randint(110, 170)
    return f"Can you summarize the following notes about {topic}?\n\n{_paragraphs(rng, topic, sentences)}"


def _answer(rng: random.Random, topic: str) -> str:
    kind = rng.choices(("short", "typical", "long", "essay"), weights=(5, 70, 20, 5))[0]
    if kind == "short":
        return rng.choice(_SHORT_REPLIES)
    if kind == "typical":
        sentences = int(rng.lognormvariate(2.0, 0.7)) + 1
    elif kind == "long":
        sentences = rng.randint(30, 80)
    else:
        sentences = rng.randint(150, 250)
    text = f"Here is how I would approach {topic}.\n\n{_paragraphs(rng, topic, sentences)}"
    if rng.random() < 0.4:
        items = [f"{n}. {_sentence(rng, topic)}" for n in range(1, rng.randint(3, 7))]
        text += "\n\nIn short:\n" + "\n".join(items)
    return text


def _paragraphs(rng: random.Random, topic: str, sentences: int) -> str:
    parts: list[str] = []
    while sentences > 0:
        size = min(sentences, rng.randint(2, 6))
        parts.append(_paragraph(rng, topic, size))
        sentences -= size
    return "\n\n".join(parts)


def _paragraph(rng: random.Random, topic: str, sentences: int) -> str:
    return " ".join(_sentence(rng, topic) for _ in range(sentences))


def _sentence(rng: random.Random, topic: str) -> str:
    tail = rng.choice(_TAILS)
    body = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}" + (
        f" {tail}" if tail else ""
    )
    if rng.random() < 0.25:
        body = f"When it comes to {topic}, {body[0].lower()}{body[1:]}"
    return body + "."
