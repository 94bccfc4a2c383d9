"""Deterministic generator of the Search-QA corpus: fictitious entities, passages and questions.

Everything is invented, so world knowledge does not help: an agent must search. Names are shared
on purpose as distractors; a question takes 1 or 2 hops. A seed gives the same corpus everywhere
(:attr:`Corpus.corpus_id` digests it); ``python -m agent_memory.envs.search_qa`` dumps one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Final, TypeVar

from agent_memory.envs.base import check_int

T = TypeVar("T")

#: Corpus size (per seed). Small enough to build and index in milliseconds.
NUM_COUNTRIES: Final = 5
NUM_BASE_CITIES: Final = 14
NUM_LOOKALIKE_CITIES: Final = 6
NUM_COMPANY_STEMS: Final = 15  # two companies per stem
NUM_PEOPLE: Final = 60  # the first 2 * NUM_COMPANY_STEMS of them found one company each
#: Every ``TEST_EVERY``-th question (after the seeded shuffle) is in the test split.
TEST_EVERY: Final = 5

# A name is a first onset (clusters allowed), vowel, then plain consonant + vowel syllables and a
# coda: "Zorvex", "Talimar", "Brenosk". Repeated letters stay rare, so names read as names.
_FIRST_ONSETS: Final = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "fl",
    "g",
    "gr",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "qu",
    "r",
    "s",
    "sk",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "z",
)
_ONSETS: Final = ("b", "d", "g", "k", "l", "m", "n", "r", "s", "t", "v", "z", "nd", "rv", "st")
_VOWELS: Final = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou")
_CODAS: Final = ("n", "r", "l", "s", "x", "th", "k", "m", "nd", "sk", "rn", "ck")
_OCCUPATIONS: Final = (
    "geologist",
    "architect",
    "chemist",
    "painter",
    "engineer",
    "economist",
    "botanist",
    "composer",
    "surveyor",
    "cartographer",
)
_INDUSTRIES: Final = (
    "shipping",
    "software",
    "textile",
    "mining",
    "robotics",
    "biotechnology",
    "aerospace",
    "food",
    "publishing",
    "energy",
)
_COMPANY_SUFFIXES: Final = (
    "Labs",
    "Systems",
    "Dynamics",
    "Industries",
    "Works",
    "Group",
    "Holdings",
    "Motors",
    "Analytics",
    "Foundry",
)
_CITY_LOOKALIKES: Final = ("Port {}", "{} Falls", "New {}", "{} Springs", "North {}", "{} Heights")


@dataclass(frozen=True)
class Document:
    """One passage: Search-R1 indexes ``title + "\\n" + text`` and shows both."""

    doc_id: str
    title: str
    text: str
    kind: str  # "person" | "company" | "city" | "country"


@dataclass(frozen=True)
class Hop:
    """One reasoning step: search ``entity``, read its passage ``doc_id``, follow ``relation``."""

    entity: str
    relation: str
    doc_id: str


@dataclass(frozen=True)
class Question:
    """A question, its gold answer and the chain of hops that leads to it."""

    qid: str
    text: str
    answer: str
    hops: tuple[Hop, ...]
    kind: str
    split: str  # "train" | "test"


@dataclass(frozen=True)
class Corpus:
    """The generated world: passages, questions and the facts both were written from."""

    seed: int
    documents: tuple[Document, ...]
    questions: tuple[Question, ...]
    #: (subject, relation) -> object, the ground truth the passages state.
    facts: dict[tuple[str, str], str] = field(repr=False)
    corpus_id: str = ""

    def to_dict(self) -> dict:
        """A JSON-ready dict (facts as [subject, relation, object] triples)."""
        return {
            "seed": self.seed,
            "documents": [asdict(d) for d in self.documents],
            "questions": [asdict(q) for q in self.questions],
            "facts": [[s, r, o] for (s, r), o in sorted(self.facts.items())],
        }

    def document(self, doc_id: str) -> Document:
        """The passage with id ``doc_id``."""
        return self.documents[int(doc_id.removeprefix("doc-"))]


class _Rng:
    """Only ``Random.random()`` (stable across Python versions) feeds every choice."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def below(self, n: int) -> int:
        return min(n - 1, int(self._random.random() * n))

    def between(self, lo: int, hi: int) -> int:
        return lo + self.below(hi - lo + 1)

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.below(len(seq))]

    def shuffle(self, items: list[T]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


class _Names:
    """Unique invented words; a word is never reused across entity kinds."""

    def __init__(self, rng: _Rng) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def word(self, syllables: int, suffix: str = "") -> str:
        while True:
            parts = [self._rng.choice(_FIRST_ONSETS) + self._rng.choice(_VOWELS)]
            parts += [
                self._rng.choice(_ONSETS) + self._rng.choice(_VOWELS) for _ in range(syllables - 1)
            ]
            candidate = ("".join(parts) + self._rng.choice(_CODAS) + suffix).capitalize()
            if candidate.lower() not in self._used:
                self._used.add(candidate.lower())
                return candidate


def generate_corpus(seed: int = 0) -> Corpus:
    """Generate the corpus for ``seed`` (deterministic; a few milliseconds).

    Example:
        >>> corpus = generate_corpus(0)
        >>> len(corpus.documents), len(corpus.questions) > 500
        (115, True)
        >>> generate_corpus(0).corpus_id == corpus.corpus_id != generate_corpus(1).corpus_id
        True
    """
    seed = check_int("corpus_seed", seed, 0)
    rng = _Rng(seed)
    names = _Names(rng)
    # Every step draws from rng in turn: their order is part of the corpus.
    world = _World()
    _add_places(world, rng, names)
    _add_people_and_companies(world, rng, names)
    documents = _passages(world, rng, names)
    questions = _questions(world, documents, rng)
    corpus = Corpus(seed=seed, documents=documents, questions=questions, facts=world.facts)
    digest = hashlib.sha256(json.dumps(corpus.to_dict(), sort_keys=True).encode("utf-8"))
    return replace(corpus, corpus_id=digest.hexdigest()[:16])


@dataclass
class _World:
    """The entities drawn so far and their facts ((subject, relation) -> object)."""

    facts: dict[tuple[str, str], str] = field(default_factory=dict)
    countries: list[str] = field(default_factory=list)
    cities: list[str] = field(default_factory=list)
    capitals: dict[str, str] = field(default_factory=dict)  # country -> city
    people: list[str] = field(default_factory=list)
    companies: list[str] = field(default_factory=list)


def _add_places(world: _World, rng: _Rng, names: _Names) -> None:
    """Countries, cities (some with a look-alike name) and each country's capital."""
    facts = world.facts
    world.countries = [names.word(2, "ia") for _ in range(NUM_COUNTRIES)]
    base_cities = [names.word(rng.between(2, 3)) for _ in range(NUM_BASE_CITIES)]
    patterns = list(_CITY_LOOKALIKES)
    rng.shuffle(patterns)
    lookalikes = [
        patterns[i].format(base_cities[i]) for i in range(NUM_LOOKALIKE_CITIES)
    ]  # same name token as a base city: a retrieval distractor
    world.cities = base_cities + lookalikes
    order = list(world.cities)
    rng.shuffle(order)
    per_country = len(world.cities) // NUM_COUNTRIES
    for c, country in enumerate(world.countries):
        members = order[c * per_country : (c + 1) * per_country]
        for city in members:
            facts[(city, "country")] = country
        world.capitals[country] = rng.choice(members)
        facts[(country, "capital")] = world.capitals[country]


def _add_people_and_companies(world: _World, rng: _Rng, names: _Names) -> None:
    """People (shared first names and surnames) and companies (two per stem), each founded by
    one of the first people; everyone works for a company."""
    facts, cities = world.facts, world.cities
    half = NUM_PEOPLE // 2
    firsts = [names.word(2) for _ in range(half)]
    lasts = [names.word(rng.between(2, 3)) for _ in range(half)]
    # i and i + half share a first name; (7 * i + i // half) % half is a bijection on each half,
    # so full names are unique and every surname is used twice.
    people = [f"{firsts[i % half]} {lasts[(7 * i + i // half) % half]}" for i in range(NUM_PEOPLE)]
    rng.shuffle(people)
    for person in people:
        facts[(person, "born_in")] = rng.choice(cities)
        facts[(person, "birth_year")] = str(rng.between(1920, 1985))

    companies: list[str] = []
    for _ in range(NUM_COMPANY_STEMS):
        stem = names.word(2)
        first = rng.below(len(_COMPANY_SUFFIXES))
        second = (first + 1 + rng.below(len(_COMPANY_SUFFIXES) - 1)) % len(_COMPANY_SUFFIXES)
        companies += [f"{stem} {_COMPANY_SUFFIXES[first]}", f"{stem} {_COMPANY_SUFFIXES[second]}"]
    rng.shuffle(companies)
    founders = dict(zip(companies, people[: len(companies)], strict=True))
    for company, founder in founders.items():
        facts[(company, "founded_by")] = founder
        year = int(facts[(founder, "birth_year")]) + rng.between(25, 40)
        facts[(company, "founded_in")] = str(year)
        facts[(company, "headquarters")] = rng.choice(cities)
        facts[(founder, "employer")] = company
    for person in people[len(companies) :]:
        facts[(person, "employer")] = rng.choice(companies)
    world.people, world.companies = people, companies


def _passages(world: _World, rng: _Rng, names: _Names) -> tuple[Document, ...]:
    """One Wikipedia-like passage per entity: people, companies, cities, then countries."""
    facts, capitals = world.facts, world.capitals
    texts: list[tuple[str, str, str]] = []  # (title, text, kind)
    for person in world.people:
        employer = facts[(person, "employer")]
        born = int(facts[(person, "birth_year")])
        since = max(born + rng.between(22, 30), int(facts[(employer, "founded_in")]) + 1)
        surname = person.split(" ", 1)[1]
        occupation = rng.choice(_OCCUPATIONS)
        article = "an" if occupation[0] in "aeiou" else "a"
        city = facts[(person, "born_in")]
        opening = rng.choice(
            (
                f"{person} is {article} {occupation} who was born in {city} in {born}.",
                f"{person} (born {born} in {city}) is {article} {occupation}.",
            )
        )
        text = f"{opening} {surname} has worked for {employer} since {since}."
        texts.append((person, text, "person"))
    for company in world.companies:
        industry = rng.choice(_INDUSTRIES)
        article = "an" if industry[0] in "aeiou" else "a"
        founder, year = facts[(company, "founded_by")], facts[(company, "founded_in")]
        hq = facts[(company, "headquarters")]
        staff = rng.between(12, 900) * 10
        opening = rng.choice(
            (
                f"{company} is {article} {industry} company founded by {founder} in {year}.",
                f"{company} is {article} {industry} company. "
                f"It was founded in {year} by {founder}.",
            )
        )
        text = f"{opening} Its headquarters are in {hq}. It employs {staff} people."
        texts.append((company, text, "company"))
    for city in world.cities:
        country = facts[(city, "country")]
        river = names.word(2)
        population = rng.between(20, 2000) * 1000
        capital_note = f" It is the capital of {country}." if capitals[country] == city else ""
        text = (
            f"{city} is a city in {country}.{capital_note} It lies on the {river} river "
            f"and has about {population:,} inhabitants."
        )
        texts.append((city, text, "city"))
    for country in world.countries:
        currency, language = names.word(2).lower(), names.word(2, "ish")
        text = (
            f"{country} is a country whose capital is {capitals[country]}. Its currency is "
            f"the {currency} and its official language is {language}."
        )
        texts.append((country, text, "country"))
    return tuple(
        Document(doc_id=f"doc-{i:03d}", title=title, text=text, kind=kind)
        for i, (title, text, kind) in enumerate(texts)
    )


#: A question before numbering: (kind, text, chain of (entity, relation) hops).
_RawQuestion = tuple[str, str, tuple[tuple[str, str], ...]]


def _questions(world: _World, documents: Sequence[Document], rng: _Rng) -> tuple[Question, ...]:
    """Every 1- and 2-hop question, shuffled, numbered and split into train and test."""
    raw = _question_chains(world)
    rng.shuffle(raw)
    doc_of = {d.title: d.doc_id for d in documents}
    return tuple(
        Question(
            qid=f"q{i:04d}",
            text=text,
            answer=world.facts[chain[-1]],
            kind=kind,
            hops=tuple(Hop(entity=e, relation=r, doc_id=doc_of[e]) for e, r in chain),
            split="test" if i % TEST_EVERY == TEST_EVERY - 1 else "train",
        )
        for i, (kind, text, chain) in enumerate(raw)
    )


def _question_chains(world: _World) -> list[_RawQuestion]:
    """The questions about each person, company, city and country, in that order."""
    facts, capitals = world.facts, world.capitals
    raw: list[_RawQuestion] = []

    def add(kind: str, text: str, *chain: tuple[str, str]) -> None:
        raw.append((kind, text, chain))

    for p in world.people:
        add("born_in", f"In which city was {p} born?", (p, "born_in"))
        add("birth_year", f"In what year was {p} born?", (p, "birth_year"))
        add("employer", f"Which company does {p} work for?", (p, "employer"))
        city = facts[(p, "born_in")]
        add("born_in.country", f"In which country was {p} born?", (p, "born_in"), (city, "country"))
        company = facts[(p, "employer")]
        add(
            "employer.founded_in",
            f"In what year was the company that {p} works for founded?",
            (p, "employer"),
            (company, "founded_in"),
        )
        if facts[(company, "founded_by")] != p:  # a founder's answer would be in the question
            add(
                "employer.founded_by",
                f"Who founded the company that {p} works for?",
                (p, "employer"),
                (company, "founded_by"),
            )
    for c in world.companies:
        founder, hq = facts[(c, "founded_by")], facts[(c, "headquarters")]
        add("founded_by", f"Who founded {c}?", (c, "founded_by"))
        add("founded_in", f"In what year was {c} founded?", (c, "founded_in"))
        add("headquarters", f"In which city is {c} headquartered?", (c, "headquarters"))
        add(
            "founded_by.born_in",
            f"In which city was the founder of {c} born?",
            (c, "founded_by"),
            (founder, "born_in"),
        )
        add(
            "founded_by.birth_year",
            f"In what year was the founder of {c} born?",
            (c, "founded_by"),
            (founder, "birth_year"),
        )
        add(
            "headquarters.country",
            f"In which country is {c} headquartered?",
            (c, "headquarters"),
            (hq, "country"),
        )
    for city in world.cities:
        country = facts[(city, "country")]
        add("country", f"In which country is {city}?", (city, "country"))
        if capitals[country] != city:
            add(
                "country.capital",
                f"What is the capital of the country where {city} is located?",
                (city, "country"),
                (country, "capital"),
            )
    for country in world.countries:
        add("capital", f"What is the capital of {country}?", (country, "capital"))
    return raw


@lru_cache(maxsize=8)
def get_corpus(seed: int = 0) -> Corpus:
    """The corpus for ``seed``, generated once per process (envs share it)."""
    return generate_corpus(seed)


def main(argv: Sequence[str] | None = None) -> None:
    """Dump a generated corpus as JSON (``python -m agent_memory.envs.search_qa --seed 0``)."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_memory.envs.search_qa",
        description="Dump a generated Search-QA corpus as JSON.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="-", help="output file ('-' = stdout)")
    args = parser.parse_args(argv)
    corpus = generate_corpus(args.seed)
    text = json.dumps({"corpus_id": corpus.corpus_id, **corpus.to_dict()}, indent=1)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
