"""A fictional world, deterministic by seed: the offline search corpus and its hard questions.

Like DeepDive's questions built by random walks over a knowledge graph with obfuscated
attributes, but over a generated world, so no model can know an answer without searching.
Entities: people, cities, guilds and artifacts, with attributes (years, professions, materials)
and relations (born in, member of, made by, kept in, founded by, seat in). One document per
entity. A question starts from an entity described by its attributes, not its name, and walks
1 to 3 relations; the answer is the last entity's name (with its surname as an alias) or a year.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "st",
    "th",
    "tr",
    "vr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "rk", "sk"]
PROFESSIONS = [
    "clockmaker",
    "cartographer",
    "glassblower",
    "astronomer",
    "luthier",
    "bookbinder",
    "alchemist",
    "shipwright",
]
MATERIALS = ["silver", "bronze", "oak", "glass", "ivory", "copper", "obsidian", "jade"]
ARTIFACT_KINDS = ["orrery", "astrolabe", "lute", "atlas", "chronometer", "compass", "lens", "codex"]
REGIONS = [
    "the Vorn valley",
    "the Amber coast",
    "the Kesh highlands",
    "the Silt marshes",
    "the Oster plains",
]
BASE_URL = "https://world.example/wiki/"


@dataclass(frozen=True)
class WorldSizes:
    people: int = 48
    cities: int = 16
    guilds: int = 10
    artifacts: int = 32
    train_questions: int = 240  # RL prompts (DeepDive's qa_rl)
    eval_questions: int = 60
    max_hops: int = 3  # questions walk 1 to max_hops relations
    # demonstrated questions for the supervised warm start (DeepDive's qa_sft), disjoint from
    # the RL prompts: GRPO on questions the policy was shown would reward recall, not search
    sft_questions: int = 120
    # > 0: the demonstrations walk this many other worlds (other seeds) instead of this one, so
    # the warm start cannot learn this world's facts and must learn to read them off the page
    sft_worlds: int = 0


@dataclass
class Entity:
    kind: str
    name: str
    attributes: dict[str, Any] = field(default_factory=dict)
    relations: dict[str, str] = field(default_factory=dict)  # relation -> entity name

    @property
    def url(self) -> str:
        return BASE_URL + self.name.replace(" ", "_")


@dataclass
class World:
    seed: int
    entities: dict[str, Entity]

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def _unique(taken: set[str], make: Any, key: Any = None) -> str:
    """A name not used yet; `key` picks the part that must be unique too (a person's surname)."""
    while True:
        name = str(make())
        part = key(name) if key else name
        if name not in taken and part not in taken:
            taken.update({name, part})
            return name


def _surname(name: str) -> str:
    return name.split()[-1]


def name_words(name: str) -> list[str]:
    """The generated words of an entity's name: "Fevrork Guild" -> ["Fevrork"], "Mareth atlas"
    -> ["Mareth"]. Generated words are capitalised and have two syllables, so no word of the
    page templates ("The", "Its", "Guild") is one."""
    return [word for word in name.split() if word != "Guild" and word[:1].isupper()]


def demonstration_world_seeds(seed: int, count: int) -> list[int]:
    """The seeds of the worlds a world's demonstrations come from: never `seed` itself."""
    return [seed * 1_000 + 100 + k for k in range(count)]


def unseen_world_seed(seed: int) -> int:
    """The seed of the world a run evaluates on besides its own (`[eval] unseen_questions`):
    never `seed`, nor one of its demonstration worlds."""
    return seed * 1_000 + 99


def generate_world(seed: int, sizes: WorldSizes = WorldSizes()) -> World:
    rng = random.Random(seed)
    taken: set[str] = set()
    cities = [Entity("city", _unique(taken, lambda: _word(rng, 2))) for _ in range(sizes.cities)]
    people = [
        Entity("person", _unique(taken, lambda: f"{_word(rng, 2)} {_word(rng, 2)}", _surname))
        for _ in range(sizes.people)
    ]
    guilds = [
        Entity("guild", _unique(taken, lambda: f"{_word(rng, 2)} Guild"))
        for _ in range(sizes.guilds)
    ]
    artifacts = [Entity("artifact", "") for _ in range(sizes.artifacts)]
    for city in cities:
        city.attributes = {"founded": rng.randint(900, 1500), "region": rng.choice(REGIONS)}
    for guild in guilds:
        guild.attributes = {"founded": rng.randint(1500, 1700)}
        guild.relations = {"seat": rng.choice(cities).name}
    for person in people:
        person.attributes = {"born": rng.randint(1650, 1850), "profession": rng.choice(PROFESSIONS)}
        person.relations = {"birthplace": rng.choice(cities).name, "guild": rng.choice(guilds).name}
    for guild in guilds:
        guild.relations["founder"] = rng.choice(people).name
    for artifact in artifacts:
        material, kind = rng.choice(MATERIALS), rng.choice(ARTIFACT_KINDS)
        maker = rng.choice(people)
        artifact.name = _unique(taken, lambda kind=kind: f"{_word(rng, 2)} {kind}")
        artifact.attributes = {
            "material": material,
            "kind": kind,
            "year": maker.attributes["born"] + rng.randint(20, 60),
        }
        artifact.relations = {"maker": maker.name, "kept_in": rng.choice(cities).name}
    entities = {e.name: e for e in [*cities, *people, *guilds, *artifacts]}
    return World(seed, entities)


def document(world: World, entity: Entity) -> dict[str, str]:
    """The encyclopedia page of one entity: every attribute and relation, in plain sentences."""
    a, r = entity.attributes, entity.relations
    if entity.kind == "city":
        sentences = [
            f"{entity.name} is a city in {a['region']}.",
            f"{entity.name} was founded in {a['founded']}.",
        ]
        seated = [g.name for g in world.of_kind("guild") if g.relations.get("seat") == entity.name]
        if seated:
            sentences.append(f"It is the seat of the {', '.join(seated)}.")
    elif entity.kind == "person":
        sentences = [
            f"{entity.name} was {_article(a['profession'])} {a['profession']} born in {a['born']} "
            f"in the city of {r['birthplace']}.",
            f"{entity.name.split()[0]} was a member of the {r['guild']}.",
        ]
        made = [
            x.name for x in world.of_kind("artifact") if x.relations.get("maker") == entity.name
        ]
        if made:
            sentences.append(f"Works attributed to {entity.name} include {', '.join(made)}.")
    elif entity.kind == "guild":
        sentences = [
            f"The {entity.name} is a guild founded in {a['founded']} by {r['founder']}.",
            f"Its seat is in the city of {r['seat']}.",
        ]
    else:
        sentences = [
            f"The {entity.name} is {_article(a['material'])} {a['material']} {a['kind']} "
            f"made in {a['year']} by {r['maker']}.",
            f"It is kept in the city of {r['kept_in']}.",
        ]
    return {"url": entity.url, "title": entity.name, "text": " ".join(sentences)}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def corpus(world: World) -> list[dict[str, str]]:
    return [document(world, e) for e in world.entities.values()]


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    aliases: tuple[str, ...]
    hops: int
    path: tuple[str, ...]  # the entity names the walk visits, start first

    def as_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "aliases": list(self.aliases),
            "hops": self.hops,
            "path": list(self.path),
        }


def describe(entity: Entity) -> str:
    """The start of a walk, by attributes only (its name would make the question a look-up)."""
    a = entity.attributes
    if entity.kind == "person":
        return f"the {a['profession']} born in {a['born']}"
    if entity.kind == "artifact":
        return f"the {a['material']} {a['kind']} made in {a['year']}"
    if entity.kind == "guild":
        return f"the guild founded in {a['founded']}"
    return f"the city in {a['region']} founded in {a['founded']}"


# Relation chains a walk can take, with how a question phrases each step and its answer.
_CHAINS: list[tuple[str, tuple[str, ...], str]] = [
    ("person", ("birthplace",), "In which city was {start} born?"),
    ("person", ("guild",), "Which guild was {start} a member of?"),
    ("artifact", ("maker",), "Who made {start}?"),
    ("artifact", ("kept_in",), "In which city is {start} kept?"),
    ("guild", ("founder",), "Who founded {start}?"),
    ("person", ("birthplace", "@founded"), "In which year was the birthplace of {start} founded?"),
    ("artifact", ("maker", "birthplace"), "In which city was the maker of {start} born?"),
    ("artifact", ("maker", "guild"), "Which guild did the maker of {start} belong to?"),
    ("person", ("guild", "founder"), "Who founded the guild that {start} belonged to?"),
    ("guild", ("founder", "birthplace"), "In which city was the founder of {start} born?"),
    (
        "artifact",
        ("maker", "guild", "seat"),
        "In which city is the seat of the guild of the maker of {start}?",
    ),
    (
        "artifact",
        ("maker", "guild", "founder"),
        "Who founded the guild that the maker of {start} belonged to?",
    ),
    (
        "person",
        ("guild", "founder", "birthplace"),
        "In which city was the founder of {start}'s guild born?",
    ),
]


def _walk(world: World, start: Entity, steps: tuple[str, ...]) -> tuple[list[Entity], str] | None:
    path, current = [start], start
    for step in steps:
        if step.startswith("@"):
            return path, str(current.attributes[step[1:]])
        target = current.relations.get(step)
        if target is None:
            return None
        current = world.entities[target]
        path.append(current)
    return path, current.name


def _aliases(entity: Entity) -> tuple[str, ...]:
    """Other names an answer may go by: a person's surname, a guild without "Guild"."""
    if entity.kind == "person":
        return (_surname(entity.name),)
    if entity.kind == "guild":
        return (entity.name.removesuffix(" Guild"),)
    return ()


def _unambiguous(world: World, start: Entity) -> bool:
    """No other entity of the kind shares the description (else the question has two answers)."""
    description = describe(start)
    return sum(describe(e) == description for e in world.of_kind(start.kind)) == 1


def generate_questions(
    world: World, count: int, seed: int, taken: set[str] | None = None, max_hops: int = 3
) -> list[Question]:
    rng = random.Random(seed)
    chains = [chain for chain in _CHAINS if len(chain[1]) <= max_hops]
    seen = set() if taken is None else taken
    questions: list[Question] = []
    attempts = 0
    while len(questions) < count and attempts < count * 50:
        attempts += 1
        kind, steps, template = rng.choice(chains)
        start = rng.choice(world.of_kind(kind))
        if not _unambiguous(world, start):
            continue
        walked = _walk(world, start, steps)
        if walked is None:
            continue
        path, answer = walked
        text = template.format(start=describe(start))
        text = text[0].upper() + text[1:]
        if text in seen:
            continue
        seen.add(text)
        final = path[-1]
        aliases = () if steps[-1].startswith("@") else _aliases(final)
        questions.append(
            Question(
                f"w{world.seed}-q{len(seen):05d}",
                text,
                answer,
                aliases,
                len(steps),
                tuple(e.name for e in path),
            )
        )
    return questions
