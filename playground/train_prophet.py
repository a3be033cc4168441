"""Train a prophet draft head for a target model: ``python -m playground.train_prophet``.

Stages (each resumable; the data lives under the user cache dir, never in git):

1. ``prompts``  varied chat prompts from our own templates x topics x tasks
   (chat, code, explanations, lists, math, summaries, translation).
2. ``data``     the target's own greedy responses (chat template, batched
   ``generate`` with left padding) together with the target's last-layer hidden
   state at every position, captured during that same generation. Saved in
   shards ``<data-dir>/shard-XXXX.pt``; a rerun continues after the last shard.
3. ``train``    every position of whole answers is an anchor, trained in one
   parallel forward per batch: step 0 feeds the committed pairs (with
   ``--context`` each attends to all earlier pairs of its answer), then the
   head is unrolled ``--depth`` draft steps with teacher tokens (a draft token
   only matters when every earlier one was accepted, i.e. equal to the teacher
   token); attention masks give each anchor and step exactly what the drafter
   sees at inference. Loss: cross-entropy on the target's greedy tokens, KL to
   the target's distribution over the draft vocabulary and a regression of the
   prophet's features onto the target's, under bfloat16 autocast (``--no-bf16``
   for float32). Checkpoints to ``--out-dir`` (``--resume`` continues);
   held-out top-1 agreement per step and an estimate of alpha are printed as
   training goes.

Example (the command used for the shipped weights is in presets/prophet/README.md)::

    python -m playground.train_prophet --target smollm2-135m-instruct --gen-minutes 12 \
        --train-minutes 12 --export presets/prophet/smollm2-135m-instruct.safetensors
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F

from decoding.runtime.head import Prophet, ProphetConfig, save_prophet
from decoding.runtime.models import PRESETS_DIR, cache_root, load_model
from playground.training.prophet_data import answer, final_records, generate_mix
from playground.training.stopping import Stop, stop_requested

# --------------------------------------------------------------------------- 1. prompts

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "climate change",
    "the water cycle", "volcanoes", "the immune system", "blockchain", "the Roman Empire", "gravity",
    "electric cars", "coffee", "the internet", "honey bees", "the moon landing", "vaccines",
    "renewable energy", "the human heart", "chess", "jazz music", "the stock market", "rainforests",
    "quantum computing", "dinosaurs", "the printing press", "sleep", "recycling", "earthquakes",
    "the Olympic games", "bread baking", "solar panels", "the Great Wall of China", "DNA",
    "social media", "time management", "public speaking", "learning a new language", "gardening",
    "the ocean", "artificial intelligence", "healthy eating", "the solar system", "electricity",
    "friendship", "remote work", "cats", "dogs", "mountains", "rivers", "the brain", "money",
    "democracy", "the weather", "music theory", "video games", "meditation", "running", "cities",
    # a wider second set (more data for a GPU run: every template x topic pair is a prompt)
    "tides", "rainbows", "lightning", "glaciers", "deserts", "coral reefs", "penguins", "whales", "ants",
    "butterflies", "wolves", "elephants", "octopuses", "bacteria", "viruses", "antibiotics", "the kidneys",
    "the lungs", "muscles", "bones", "vitamins", "caffeine", "sugar", "exercise", "stress", "memory",
    "dreams", "emotions", "habits", "motivation", "happiness", "creativity", "curiosity", "kindness",
    "the Industrial Revolution", "ancient Egypt", "the Vikings", "the Renaissance", "the Cold War",
    "the Silk Road", "the Aztecs", "medieval castles", "the Titanic", "the Wright brothers",
    "the telephone", "the steam engine", "the light bulb", "photography", "cinema", "radio", "television",
    "smartphones", "computers", "robots", "self-driving cars", "drones", "3D printing", "virtual reality",
    "cloud computing", "cybersecurity", "passwords", "encryption", "open source software", "databases",
    "programming", "algorithms", "the binary number system", "prime numbers", "fractions", "geometry",
    "probability", "statistics", "algebra", "calculus", "infinity", "the number zero", "maps", "compasses",
    "airplanes", "trains", "bicycles", "ships", "rockets", "satellites", "Mars", "Jupiter", "the sun",
    "stars", "galaxies", "the Big Bang", "comets", "eclipses", "the seasons", "wind power", "nuclear energy",
    "batteries", "magnets", "light", "sound", "heat", "friction", "atoms", "molecules", "chemical reactions",
    "acids and bases", "water", "salt", "plastic", "glass", "steel", "paper", "cotton", "wool", "chocolate",
    "cheese", "rice", "pasta", "tea", "spices", "fermentation", "vegetarian cooking", "farming", "soil",
    "trees", "flowers", "mushrooms", "cactus plants", "forests", "wetlands", "islands", "caves", "lakes",
    "pollution", "plastic waste", "composting", "water saving", "architecture", "bridges", "skyscrapers",
    "museums", "libraries", "schools", "universities", "homework", "exams", "reading", "writing poetry",
    "storytelling", "mythology", "fairy tales", "comics", "painting", "sculpture", "dance", "theatre",
    "opera", "the piano", "the violin", "drums", "rock music", "classical music", "hip hop", "podcasts",
    "journalism", "advertising", "marketing", "small businesses", "startups", "taxes", "inflation",
    "banks", "credit cards", "budgeting", "saving for retirement", "insurance", "renting an apartment",
    "moving house", "job interviews", "teamwork", "leadership", "negotiation", "email etiquette",
    "volunteering", "charity", "elections", "the United Nations", "human rights", "laws", "courts",
    "football", "basketball", "tennis", "swimming", "cycling", "yoga", "hiking", "camping", "fishing",
    "birdwatching", "photography for beginners", "travel", "airports", "hotels", "festivals", "holidays",
    "birthdays", "weddings", "pets", "horses", "parrots", "goldfish", "hamsters", "first aid",
    "the common cold", "allergies", "hand washing", "dentists", "eyesight", "hearing", "posture",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "finds the largest element in a list", "counts the vowels in a string", "sorts a list of numbers",
    "returns the Fibonacci numbers up to n", "checks whether a word is a palindrome",
    "merges two sorted lists", "removes duplicates from a list", "computes the average of a list",
    "converts Celsius to Fahrenheit", "reads a file and counts its lines", "finds the GCD of two numbers",
    "flattens a nested list", "counts word frequencies in a text", "implements binary search",
    "validates an email address", "computes the sum of the digits of a number", "transposes a matrix",
    "checks whether two strings are anagrams", "counts the words in a sentence",
    "finds the second largest number in a list", "converts a decimal number to binary",
    "checks whether a year is a leap year", "capitalizes the first letter of every word",
    "returns the intersection of two lists", "computes the power of a number without a library",
    "finds the most common element in a list", "splits a list into chunks of size n",
    "reverses the words in a sentence", "removes whitespace from both ends of a string",
    "checks whether a list is sorted", "rotates a list by k positions", "generates a random password",
    "computes the median of a list", "parses a date string", "counts the occurrences of a character",
    "builds a dictionary from two lists", "sums the even numbers in a list", "finds all divisors of a number",
    "implements a stack", "implements a queue", "computes the area of a circle", "checks for balanced brackets",
    "converts a string to title case", "finds the longest word in a sentence", "multiplies two matrices",
    "implements bubble sort", "computes the least common multiple of two numbers",
]
LANGS = ["Python", "JavaScript", "C", "Java", "Rust", "Go", "SQL", "Bash",
    "TypeScript", "C++", "Ruby", "Kotlin", "Swift", "PHP",
]
TARGET_LANGS = ["French", "Spanish", "German", "Italian", "Portuguese",
    "Dutch", "Swedish", "Polish",
]
SENTENCES = [
    "The weather is nice today.", "I would like a cup of tea, please.", "Where is the train station?",
    "My brother plays the guitar every evening.", "We are going to the beach tomorrow.",
    "This book is very interesting.", "Can you help me with my homework?", "The cat is sleeping on the sofa.",
    "I have been learning to cook this year.", "The museum opens at nine o'clock.",
    "The children are playing in the garden.", "I forgot my umbrella at home.",
    "How much does this jacket cost?", "She works at a hospital near the river.",
    "Please close the window, it is cold.", "Our neighbours have a new puppy.",
    "I usually drink coffee in the morning.", "The shop closes at six in the evening.",
    "We watched a film last night.", "Could you speak more slowly, please?",
    "My favourite season is autumn.", "The bus was late again this morning.",
    "I need to buy bread and milk.", "They are planning a trip to the mountains.",
    "Thank you for your help yesterday.",
]
PASSAGES = [
    "The city council met on Tuesday to discuss the new park. Residents asked for more trees, a playground "
    "and better lighting. The council agreed to spend part of next year's budget on the project.",
    "Researchers found that people who walk for thirty minutes a day sleep better and report less stress. "
    "The study followed two thousand adults for one year.",
    "The company released a new phone with a larger battery and a better camera. Reviewers praised the "
    "screen but said the price is too high for most buyers.",
    "Bees pollinate many of the crops we eat. Their numbers have fallen because of pesticides, disease "
    "and loss of habitat, and farmers are trying new ways to protect them.",
    "The library will close for two weeks in August for repairs. During that time, books can be returned "
    "at the community centre, and the online catalogue will stay open.",
    "A local bakery started giving its unsold bread to a food bank every evening. In six months it donated "
    "more than two thousand loaves, and two other shops in the street have now joined the scheme.",
    "Engineers tested a new kind of road surface that stays cooler in summer. Early results show the "
    "surface is up to ten degrees cooler than normal asphalt, but it costs about twice as much to lay.",
    "The school changed its timetable so that classes start an hour later. Teachers report that students "
    "are more awake in the morning, and attendance in the first lesson has improved.",
    "A small town replaced its street lights with LED lamps. The town now spends forty percent less on "
    "electricity for lighting, and residents say the streets feel safer at night.",
    "Scientists tracked a group of sea turtles with satellite tags. The turtles swam thousands of "
    "kilometres between their feeding grounds and the beaches where they were born.",
]
# everyday requests: advice, recommendations, comparisons, short messages (the chat style users type)
SKILLS = ["cooking", "drawing", "writing", "running", "saving money", "studying", "focusing at work",
          "public speaking", "playing the piano", "taking photos", "keeping plants alive", "waking up early",
          "staying calm", "making friends in a new city", "learning to swim", "organizing my desk",
    "cooking rice", "typing faster", "reading more books", "sleeping better", "drinking more water",
    "learning chess", "speaking French", "budgeting", "writing emails", "painting with watercolours",
    "doing push-ups", "remembering names", "meditating", "baking bread", "managing stress", "cycling to work",
    "keeping a journal", "negotiating a salary", "learning to code", "eating less sugar",
]
OCCASIONS = ["a weekend camping trip", "a beach holiday", "a job interview", "a birthday party", "a long flight",
             "a winter city break", "a picnic", "a first day at a new job", "a rainy Sunday", "a family dinner",
             "a road trip", "a wedding", "a ski trip", "a museum visit",
    "a hiking day", "a school trip", "a baby shower", "a housewarming party", "a business trip",
    "a music festival", "a day at the zoo", "a train journey", "a sleepover", "a garden party",
]
PAIRS = [("a virus", "a bacterium"), ("a lake", "a pond"), ("tea", "coffee"), ("a town", "a city"),
         ("speed", "velocity"), ("a comet", "an asteroid"), ("baking soda", "baking powder"),
         ("a crocodile", "an alligator"), ("a list", "a tuple"), ("RAM", "storage"), ("a loan", "a gift"),
         ("a hurricane", "a tornado"), ("a fruit", "a vegetable"), ("renting", "buying a home"),
    ("weather", "climate"), ("a cold", "the flu"), ("a rabbit", "a hare"), ("a moth", "a butterfly"),
    ("a sea", "an ocean"), ("a frog", "a toad"), ("latitude", "longitude"), ("an alligator", "a caiman"),
    ("a debit card", "a credit card"), ("a meteor", "a meteorite"), ("a violin", "a viola"),
    ("affect", "effect"), ("a hill", "a mountain"), ("a laptop", "a tablet"), ("jam", "jelly"),
    ("a poem", "a song"),
]
BUSINESSES = ["a coffee shop by the sea", "a bike repair shop", "a bookshop for children", "a vegan food truck",
              "a dog-walking service", "a pottery studio", "a tea room", "a small gym", "a flower stall",
              "an ice cream parlour", "a podcast about history", "a board game cafe",
    "a bakery in a small village", "a bicycle rental shop", "a language school", "a plant shop",
    "a second-hand clothes shop", "a pet grooming salon", "a cooking class", "a cleaning service",
]
ANIMAL_FACTS = ["dogs wag their tails", "birds sing in the morning", "fish swim in schools", "bees dance",
                "owls hunt at night", "cows lie down before rain", "dolphins sleep", "squirrels bury nuts",
                "frogs croak", "horses sleep standing up", "geese fly in a V shape", "zebras have stripes",
    "cats purr", "leaves change colour in autumn", "camels have humps", "giraffes have long necks",
    "bats hang upside down", "salmon swim upstream", "chameleons change colour", "penguins cannot fly",
]
SOCIAL = ["say no to extra work", "ask my neighbour to turn down the music", "thank a colleague for help",
          "apologize for being late", "remind a friend about money they owe me", "ask for a day off",
          "congratulate a friend on a new job", "end a long phone call", "invite coworkers to lunch",
          "tell a guest the party is over", "ask a teacher for more time on homework",
    "ask my boss for feedback", "decline a wedding invitation", "tell a friend I need some space",
    "ask a shop for a refund", "welcome a new colleague", "ask my landlord to fix the heating",
    "say goodbye to my team", "cancel a dinner with friends", "ask for a discount", "introduce myself to a neighbour",
]
MEALS = ["a quick breakfast", "a cheap lunch", "a vegetarian dinner", "a healthy snack", "a dessert without sugar",
         "a meal for a cold evening", "something with rice and eggs", "a lunch I can take to work",
    "a soup for a rainy day", "a breakfast without eggs", "a salad that is filling", "a snack for a long hike",
    "a dinner for two", "a meal with lentils", "a dish for a potluck", "a meal I can cook in ten minutes",
]
LIMITS = ["", " Keep it short.", " Answer in one sentence.", " Use three bullet points.", " Be brief.",
          " Answer in two sentences.", " Explain it simply."]

TEMPLATES = {
    "advice": ["How can I get better at {h}?{lim}", "What are some good habits for {h}?{lim}",
               "Give me two tips for {h}.{lim}", "I struggle with {h}. What can I do?{lim}",
               "What is a simple way to start {h}?{lim}"],
    "recommend": ["What should I bring to {o}?{lim}", "Recommend {m} I can make at home.{lim}",
                  "Suggest a name for {bz}.{lim}", "Give me ideas for {o}.{lim}",
                  "What would be a good gift for someone going on {o}?{lim}", "Suggest {m}.{lim}"],
    "compare": ["What is the difference between {x} and {y}?{lim}", "Is {x} the same as {y}?{lim}",
                "Compare {x} and {y}.{lim}", "Why do {af}?{lim}", "Do you know why {af}?{lim}"],
    "message": ["Give me a polite way to {so}.{lim}", "How do I {so} without being rude?{lim}",
                "Write a short message to {so}.", "Help me {so}.{lim}"],
    "explain": ["Explain {t} in simple terms.", "What is {t}?", "How does {t} work?",
                "What should a beginner know about {t}?{lim}", "Describe {t} in a few sentences.",
                "What is the history of {t}?{lim}", "Why do people care about {t}?{lim}",
                "Can you tell me about {t}?", "Why is {t} important?", "Give me a short overview of {t}.",
                "Explain {t} to a ten-year-old.", "What are the main facts about {t}?"],
    "list": ["List five interesting facts about {t}.", "Give me three tips about {t}.",
             "What are three things everyone should know about {t}?", "List some questions to ask about {t}.",
             "What are the pros and cons of {t}?", "Name some common misconceptions about {t}.",
             "List the key ideas someone should know about {t}."],
    "write": ["Write a short poem about {t}.", "Write a short story involving {t}.",
              "Write a paragraph describing {t}.", "Write a haiku about {t}.",
              "Write a tweet about {t}.", "Write an email to a friend about {t}."],
    "chat": ["Hi! Can you help me learn about {t}?", "I'm curious about {t}. Where should I start?",
             "Can you explain {t} to me?{lim}", "What is the most important thing about {t}?{lim}",
             "My friend told me about {t}. What is it?{lim}",
             "What do you think about {t}?", "Tell me something surprising about {t}.",
             "I have a test on {t} tomorrow. Any advice?"],
    "code": ["Write a {l} function that {c}.", "How do I write code in {l} that {c}?",
             "Give me {l} code that {c}.",
             "Show me a {l} program that {c}, with comments.", "Write a {l} snippet that {c} and explain it."],
    "math": ["What is {a} + {b}?", "What is {a} times {b}?", "Solve for x: {a}x + {b} = {c2}.",
             "If a train travels {a} km in {b} hours, what is its average speed?",
             "What is {a} percent of {b}?", "Is {a} a prime number? Explain.",
             "A shop sells apples for {b} cents each. How much do {a} apples cost?"],
    "translate": ["Translate into {tl}: {s}", "How do you say \"{s}\" in {tl}?", "Translate to {tl}: {s}"],
    "summarize": ["Summarize this text in one sentence: {p}", "Give the main point of this passage: {p}",
                  "Summarize: {p}"],
}


# the most of the prompts one kind may take: math's templates have numbers, so without a cap a large
# request would be mostly arithmetic once the other kinds run out of distinct prompts
KIND_SHARE = {"math": 0.12}


def build_prompts(n: int, seed: int = 0, exclude: frozenset = frozenset()) -> list[str]:
    """Up to ``n`` distinct prompts drawn round-robin over the task kinds (deterministic for a seed);
    fewer when the templates run out of distinct prompts."""
    rng = random.Random(seed)
    kinds = list(TEMPLATES)
    seen: set[str] = set()
    out: list[str] = []
    taken = dict.fromkeys(kinds, 0)
    cap = {kind: max(1, math.ceil(KIND_SHARE.get(kind, 1.0) * n)) for kind in kinds}
    for i in itertools.count():
        if len(out) >= n or i > 50 * n + 1000:
            break
        kind = kinds[i % len(kinds)]
        tpl = rng.choice(TEMPLATES[kind])
        text = tpl.format(t=rng.choice(TOPICS), l=rng.choice(LANGS), c=rng.choice(CODE_TASKS),
                          a=rng.randint(2, 99), b=rng.randint(2, 99), c2=rng.randint(100, 999),
                          tl=rng.choice(TARGET_LANGS), s=rng.choice(SENTENCES), p=rng.choice(PASSAGES),
                          h=rng.choice(SKILLS), o=rng.choice(OCCASIONS), bz=rng.choice(BUSINESSES),
                          af=rng.choice(ANIMAL_FACTS), so=rng.choice(SOCIAL), m=rng.choice(MEALS),
                          lim=rng.choice(LIMITS), **dict(zip("xy", rng.choice(PAIRS))))
        if text not in seen and text not in exclude and taken[kind] < cap[kind]:
            seen.add(text)
            out.append(text)
            taken[kind] += 1
    return out


# --------------------------------------------------------------------------- 2. data

def default_data_dir(target: str, kind: str = "") -> Path:
    return cache_root().parent / "prophet-data" / (target.replace("/", "--") + (f"-{kind}" if kind else ""))


def _shards(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("shard-*.pt"))


@torch.inference_mode()
def generate_data(lm: Any, prompts: list[str], data_dir: Path, *, batch: int, max_new: int,
                  minutes: float) -> None:
    """Greedy responses + the last-layer hidden state that predicted each response token.

    A shard holds a list of records ``{"tokens": [L] long, "hidden": [L, H] fp16}``
    where ``hidden[i]`` is the target's state at the position before ``tokens[i]``
    (so ``argmax(lm_head(hidden[i])) == tokens[i]``).
    """
    from tqdm import tqdm
    data_dir.mkdir(parents=True, exist_ok=True)
    done = len(_shards(data_dir))
    batches = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    deadline = time.time() + minutes * 60
    bar = tqdm(batches[done:], desc="target greedy data", unit="batch", initial=0)
    for index, group in enumerate(bar, start=done):
        if time.time() > deadline:
            bar.write(f"generation time budget of {minutes} min reached after {index} shards")
            break
        answers = answer(lm, [[{"role": "user", "content": p}] for p in group], max_new)
        records = [{"tokens": r["tokens"], "hidden": r["hidden"]} for r in answers]
        torch.save(records, data_dir / f"shard-{index:04d}.pt")
        bar.set_postfix(tokens=sum(len(r["tokens"]) for r in records))


def load_records(data_dir: Path) -> list[dict]:
    return [r for shard in _shards(data_dir) for r in torch.load(shard) if len(r["tokens"]) >= 2]


# --------------------------------------------------------------------------- 3. train

def draft_vocabulary(records: list[dict], size: int, always: tuple[int, ...]) -> torch.Tensor:
    """The ``size`` most frequent response tokens (plus ``always``, e.g. EOS), sorted ids."""
    counts = torch.bincount(torch.cat([r["tokens"] for r in records]))
    order = [int(t) for t in torch.argsort(counts, descending=True) if counts[t] > 0]
    keep = list(dict.fromkeys(list(always) + order))[:size]
    return torch.tensor(sorted(keep), dtype=torch.long)


class Answers:
    """Training examples: whole answers, padded into batches; every position is an anchor.

    Anchor ``i`` of an answer feeds the pair (``hidden[i]``, ``tokens[i]``); draft
    step ``j`` at that anchor predicts ``tokens[i + j + 1]``, whose preceding
    state ``hidden[i + j + 1]`` is the target's feature for it.
    """

    def __init__(self, records: list[dict], depth: int, layers: bool = False) -> None:
        self.depth = depth
        self.layers = layers     # batches carry each record's intermediate-layer states (a fusion head)
        self.records = [r for r in records if len(r["tokens"]) >= 2 and (not layers or "layers" in r)]

    def __len__(self) -> int:
        return len(self.records)

    def batch(self, idx: Any) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(hidden [B, S, H] float32, tokens [B, S] long with -1 after each answer, and with ``layers``
        the intermediate states [B, S, k, H] float32, else None)."""
        rs = [self.records[int(i)] for i in idx]
        S = max(len(r["tokens"]) for r in rs)
        H = rs[0]["hidden"].shape[1]
        hidden = torch.zeros(len(rs), S, H)
        tokens = torch.full((len(rs), S), -1, dtype=torch.long)
        extra = torch.zeros(len(rs), S, rs[0]["layers"].shape[1], H) if self.layers else None
        for b, r in enumerate(rs):
            L = len(r["tokens"])
            hidden[b, :L] = r["hidden"].float()
            tokens[b, :L] = r["tokens"]
            if extra is not None:
                extra[b, :L] = r["layers"].float()
        return hidden, tokens, extra


def _on(device: torch.device, tensors: tuple) -> tuple:
    """A batch's tensors on ``device`` (``None`` stays ``None``: no layer states)."""
    return tuple(None if t is None else t.to(device) for t in tensors)


def _ahead(x: torch.Tensor, depth: int, fill: float) -> torch.Tensor:
    """``x [B, S, ...]`` -> ``[B, D, S, ...]``: what step ``j`` at anchor ``i`` predicts, ``x[:, i + j + 1]``
    (``fill`` past the end)."""
    B, S = x.shape[:2]
    padded = torch.cat([x, x.new_full((B, depth + 1, *x.shape[2:]), fill)], dim=1)
    return torch.stack([padded[:, j + 1: j + 1 + S] for j in range(depth)], dim=1)


def _labels(tokens: torch.Tensor, depth: int) -> torch.Tensor:
    """``[B, D, S]``: the token step ``j`` at anchor ``i`` should draft, ``tokens[i + j + 1]`` (-1 = none)."""
    return _ahead(tokens, depth, -1)


def unrolled_loss(prophet: Prophet, hidden: torch.Tensor, tokens: torch.Tensor, depth: int,
                  kl_weight: float, feat_weight: float, extra: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss over every anchor and draft step; also (correct [D], counted [D]) top-1 agreement per step.

    Cross-entropy on the target's greedy tokens (a step only matters when every
    earlier one was accepted, i.e. equal to the teacher token, so the teacher
    tokens are the inputs), KL to the target's distribution over the draft
    vocabulary, and a regression of the head's features onto the target's.
    """
    out, f = prophet.forward_train(hidden, tokens.clamp_min(0), depth, extra)   # [B, D, S, Vd], [B, D, S, H]
    full = _labels(tokens, depth)                                           # [B, D, S]
    valid = full >= 0
    labels = prophet.to_draft_ids(full)
    loss = F.cross_entropy(out.flatten(0, 2), labels.flatten(), ignore_index=-1)
    n_valid = valid.sum().clamp_min(1)
    if kl_weight:
        with torch.no_grad():   # one teacher row per position, shared by the steps that predict it
            teacher = _ahead(prophet.draft_logits(hidden).log_softmax(-1), depth, 0.0)    # [B, D, S, Vd]
        kl = F.kl_div(out.log_softmax(-1), teacher, log_target=True, reduction="none").sum(-1)
        loss = loss + kl_weight * (kl * valid).sum() / n_valid
    if feat_weight:   # the target's feature for the label of step j at anchor i is hidden[i + j + 1]
        reg = F.smooth_l1_loss(f, _ahead(hidden, depth, 0.0), reduction="none").mean(-1)
        loss = loss + feat_weight * (reg * valid).sum() / n_valid
    with torch.no_grad():
        hit = (out.argmax(-1) == labels) & (labels >= 0)
        correct = hit.sum((0, 2)).float()
        counted = valid.sum((0, 2)).float()
    return loss, correct, counted


@torch.no_grad()
def evaluate(prophet: Prophet, data: Answers, batch: int = 16) -> dict:
    """Held-out top-1 agreement per draft step, the acceptance chain and an alpha estimate.

    ``accept[d]`` = P(step d correct and every earlier step correct); alpha for k
    drafts = E[accepted] / k with E[accepted] = sum_d accept[d].
    """
    was_training = prophet.training
    prophet.eval()
    D = data.depth
    prefix_ok = torch.zeros(D)
    top1 = torch.zeros(D)
    counted = torch.zeros(D)
    for start in range(0, len(data), batch):
        hidden, tokens, extra = _on(prophet.device, data.batch(range(start, min(start + batch, len(data)))))
        out, _ = prophet.forward_train(hidden, tokens.clamp_min(0), D, extra)
        full = _labels(tokens, D)
        labels = prophet.to_draft_ids(full)
        valid = full >= 0
        hit = (out.argmax(-1) == labels) & (labels >= 0)                  # [B, D, S]
        chain = torch.cumprod(hit.float(), dim=1)
        top1 += hit.sum((0, 2)).float().cpu()
        prefix_ok += (chain * valid).sum((0, 2)).cpu()
        counted += valid.sum((0, 2)).float().cpu()
    prophet.train(was_training)
    top1 = (top1 / counted.clamp_min(1)).tolist()
    accept = (prefix_ok / counted.clamp_min(1)).tolist()
    alpha = {k: round(sum(accept[:k]) / k, 4) for k in range(1, D + 1)}
    return {"top1": [round(x, 4) for x in top1], "accept_chain": [round(x, 4) for x in accept], "alpha": alpha}


def lr_factor(step: int, steps: int, time_used: float, start_step: int = 0) -> float:
    """Warm-up over 50 steps, then cosine from 1 to 0.1 over the run's progress: the step count or the share
    of the ``--train-minutes`` budget used, whichever is further along (on a fast device the time cap
    may end the run long before ``--steps``, and the rate should still have decayed by then). A resumed
    run's time share counts from its own start, on top of the steps already done."""
    warm = min(1.0, (step + 1) / 50)
    done = max(step / steps, start_step / steps + (1 - start_step / steps) * time_used) if steps else 1.0
    return warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def train(prophet: Prophet, train_set: Answers, held: Answers, args: argparse.Namespace,
          out_dir: Path, start_step: int = 0, optim_state: Optional[dict] = None,
          stop: Optional[Stop] = None) -> dict:
    """Steps until ``args.steps``, the time budget, or ``stop`` (``stopping.stop_requested``: SIGTERM), each of
    which ends with an evaluation and a checkpoint."""
    from tqdm import tqdm
    stop = stop if stop is not None else Stop()
    params = [p for p in prophet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    if optim_state:
        opt.load_state_dict(optim_state)
    bf16 = bf16_is_native(prophet.device) if args.bf16 is None else bool(args.bf16)
    t_begin = time.time()
    deadline = t_begin + args.train_minutes * 60
    gen = torch.Generator().manual_seed(args.seed + start_step)
    log = {}
    bar = tqdm(range(start_step, args.steps), desc="prophet training", unit="step", initial=start_step,
               total=args.steps)
    step = start_step
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.steps, (time.time() - t_begin) / (args.train_minutes * 60),
                                              start_step)
        idx = torch.randint(len(train_set), (args.batch,), generator=gen)
        hidden, tokens, extra = _on(prophet.device, train_set.batch(idx))
        with torch.autocast(prophet.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, correct, counted = unrolled_loss(prophet, hidden, tokens, train_set.depth, args.kl, args.feat,
                                                   extra)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        acc = (correct / counted.clamp_min(1)).tolist()
        bar.set_postfix(loss=f"{loss.item():.3f}", top1=" ".join(f"{a:.2f}" for a in acc[:4]))
        last = step + 1 == args.steps or time.time() > deadline or bool(stop)
        if (step + 1) % args.eval_every == 0 or last:
            log = evaluate(prophet, held)
            log["step"] = step + 1
            bar.write(json.dumps(log))
            torch.save({"step": step + 1, "model": prophet.trainable_state(), "optim": opt.state_dict(),
                        "config": prophet.config.to_dict(), "vocab": prophet.vocab.cpu()}, out_dir / "checkpoint.pt")
        if last:
            if stop:
                bar.write(f"{stop.signal} at step {step + 1}: stopped after its checkpoint")
            elif time.time() > deadline:
                bar.write(f"training time budget of {args.train_minutes} min reached at step {step + 1}")
            break
    log["steps_done"] = step + 1
    return log


# --------------------------------------------------------------------------- CLI

def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m playground.train_prophet", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave torch's default)")
    p.add_argument("--tf32", action="store_true",
                   help="TensorFloat-32 matrix products for the float32 target on a GPU (faster data; its greedy "
                        "answers may differ from float32's in rare near-ties)")
    p.add_argument("--data-dir", type=Path, default=None, help="default: user cache dir/prophet-data/<target>")
    p.add_argument("--out-dir", type=Path, default=Path("out/prophet"))
    p.add_argument("--resume", action="store_true", help="continue from --out-dir/checkpoint.pt")
    p.add_argument("--export", type=Path, default=None, help="write the shipped fp16 safetensors here")
    p.add_argument("--prompts", type=int, default=2000, help="training prompts to generate for")
    p.add_argument("--prompt-offset", type=int, default=0,
                   help="skip this many prompts of the deterministic sequence first (fresh prompts for a second "
                        "round of data after an earlier run used the first ones)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from a shipped prophet weights file (its config, draft vocabulary and weights) "
                        "instead of the target's last layers: continue training an exported head on new data")
    p.add_argument("--gen-batch", type=int, default=32)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--gen-minutes", type=float, default=60.0, help="stop generating data after this long")
    p.add_argument("--skip-data", action="store_true", help="train on the shards that already exist")
    p.add_argument("--data", choices=("templates", "mix"), default="templates",
                   help="templates: the target's answers to our template prompts (--prompts of them); mix: "
                        "self-generated (Magpie), grounded, code/math/translation and template prompts, held out "
                        "by source (playground/training/prophet_data.py; --units of them)")
    p.add_argument("--units", type=int, default=120, help="--data mix: batches of prompts to make and answer")
    p.add_argument("--workers", type=int, default=1, help="--data mix: processes sharing the data folder")
    p.add_argument("--worker", type=int, default=0, help="--data mix: this process's index among --workers")
    p.add_argument("--data-only", action="store_true", help="make the data, then stop")
    p.add_argument("--store-layers", type=_indices, default=(),
                   help="--data mix: also keep these hidden-state indices (e.g. 2,15: outputs of decoder layers 2 "
                        "and 15) for the held-out units and one training unit in --layers-every")
    p.add_argument("--layers-every", type=int, default=4, help="--store-layers: one training unit in this many")
    p.add_argument("--min-free-gb", type=float, default=0.0, help="--data mix: stop generating below this free disk")
    p.add_argument("--feature-layers", type=_indices, default=(),
                   help="train an EAGLE-3-style head that fuses these hidden-state indices with the last layer "
                        "(needs data made with the same --store-layers; trains on those units only)")
    p.add_argument("--only-layered", action="store_true",
                   help="train on the units that stored layer states only, without using them (the same-data "
                        "baseline for a --feature-layers head)")
    p.add_argument("--new-vocab", action="store_true",
                   help="with --init-from: a fresh draft vocabulary (--vocab most frequent tokens of this data) "
                        "instead of the file's")
    p.add_argument("--vocab", type=int, default=4096, help="draft vocabulary size (most frequent tokens)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--depth", type=int, default=5, help="draft positions unrolled in training")
    p.add_argument("--context", action=argparse.BooleanOptionalAction, default=True,
                   help="let the head attend to every committed answer position's state (EAGLE-style); "
                        "--no-context keeps only the newest")
    p.add_argument("--init-from-target", action=argparse.BooleanOptionalAction, default=True,
                   help="initialize the prophet layers from the target's last decoder layers")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--train-minutes", type=float, default=60.0)
    p.add_argument("--batch", type=int, default=8, help="answers per step (every position of each is an anchor)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bfloat16 autocast for the training steps (weights and evaluation stay float32); "
                        "default: on where bfloat16 matrix products are native (a CUDA GPU with bfloat16, a "
                        "CPU with AVX-512 BF16 or AMX), off elsewhere: on an AVX2-only CPU they fall back to "
                        "a slow reference GEMM (measured: about 40x slower per step)")
    p.add_argument("--kl", type=float, default=0.5, help="weight of KL to the target's draft-vocab distribution")
    p.add_argument("--feat", type=float, default=1.0, help="weight of the feature regression")
    p.add_argument("--held-out", type=float, default=0.05, help="fraction of responses held out")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _indices(text: str) -> tuple[int, ...]:
    """``"2,15"`` -> ``(2, 15)``: hidden-state indices (argparse type)."""
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices like 2,15; got {text!r}")
    if any(i < 0 for i in out):
        raise argparse.ArgumentTypeError(f"layer indices must be >= 0; got {text!r}")
    return out


def bf16_is_native(device: torch.device) -> bool:
    """Whether bfloat16 matrix products run on native kernels on ``device`` (the ``--bf16`` default)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def benchmark_prompts() -> list[str]:
    """Every prompt of the project's benchmarks (the template set and the unseen set): never trained on."""
    import yaml
    out = []
    for name in ("prompts.yaml", "bench_unseen.yaml"):
        path = PRESETS_DIR / name
        if path.is_file():
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            for items in data.values():
                out += [i.get("prompt") if isinstance(i, dict) else i for i in items or []]
    return [t for t in out if isinstance(t, str)]


def mixed_data(lm: Any, args: argparse.Namespace) -> tuple[list[dict], list[dict], float]:
    """``--data mix``: units of self-generated, grounded and template prompts with the target's answers
    (``playground/training/prophet_data.py``), held out by source; (held, train, seconds generating)."""
    data_dir = args.data_dir or default_data_dir(args.target, "mix")
    t0 = time.time()
    exclude = benchmark_prompts()
    if not args.skip_data:
        generate_mix(lm, data_dir, units=args.units, minutes=args.gen_minutes, batch=args.gen_batch,
                     max_new=args.max_new, worker=args.worker, workers=args.workers, exclude=exclude,
                     templates=lambda n, seed: build_prompts(n, seed=seed, exclude=frozenset(exclude)),
                     store_layers=args.store_layers, layers_every=args.layers_every, min_free_gb=args.min_free_gb)
    if args.data_only:
        return [], [], time.time() - t0
    train_records, held, counts = final_records(data_dir, exclude,
                                                layers=bool(args.feature_layers) or args.only_layered)
    if args.only_layered:   # the same records as a fusion head, without their layer states
        for r in train_records + held:
            r.pop("layers", None)
    print(f"mixed data in {data_dir}: {json.dumps(counts)}")
    if len(train_records) < 2 or not held:
        raise SystemExit(f"not enough mixed data in {data_dir}; run without --skip-data")
    return held, train_records, time.time() - t0


def initial_checkpoint(path: Path, lm: Any) -> dict:
    """A shipped weights file as a step-0 checkpoint (no optimizer state): ``--init-from``."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    if not Path(path).is_file():
        raise SystemExit(f"--init-from {path}: no such file")
    with safe_open(str(path), framework="pt") as fh:
        config = json.loads(fh.metadata()["config"])
    if config.get("hidden") != lm.model.config.hidden_size or config.get("target_vocab") != lm.vocab_size:
        raise SystemExit(f"--init-from {path}: trained for {config.get('target')!r}, not {lm.name!r}")
    tensors = load_file(str(path))
    vocab = tensors.pop("draft_vocab")
    return {"step": 0, "model": {k: v.float() for k, v in tensors.items()}, "config": config, "vocab": vocab}


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(args.seed)
    t_start = time.time()
    lm = load_model(args.target, device=args.device, dtype=torch.float32)
    if args.bf16 is None:
        args.bf16 = bf16_is_native(lm.device)
    print(f"training under {'bfloat16 autocast' if args.bf16 else 'float32'} on {lm.device}")
    if args.data == "mix":
        held, train_records, t_data = mixed_data(lm, args)
        if args.data_only:
            return {"train_responses": len(train_records), "held_out_responses": len(held)}
        n_held = len(held)
        data_dir = args.data_dir or default_data_dir(args.target, "mix")
    else:
        data_dir = args.data_dir or default_data_dir(args.target)
        # 1-2. prompts and the target's greedy responses with hidden states
        if not args.skip_data:
            if args.prompts < 1 or args.prompt_offset < 0:
                raise SystemExit(f"--prompts must be >= 1 and --prompt-offset >= 0; got {args.prompts}, "
                                 f"{args.prompt_offset}")
            prompts = build_prompts(args.prompt_offset + args.prompts, seed=args.seed)[args.prompt_offset:]
            generate_data(lm, prompts, data_dir, batch=args.gen_batch, max_new=args.max_new,
                          minutes=args.gen_minutes)
        t_data = time.time() - t_start
        records = load_records(data_dir)
        if len(records) < 2:
            raise SystemExit(f"no training data in {data_dir}; run without --skip-data")
        rng = random.Random(args.seed)
        rng.shuffle(records)
        n_held = max(1, int(len(records) * args.held_out))
        held, train_records = records[:n_held], records[n_held:]
    n_tokens = sum(len(r["tokens"]) for r in train_records)
    print(f"data: {len(train_records)} responses / {n_tokens} tokens for training, {n_held} held out "
          f"({data_dir}, {t_data:.0f} s)")
    # 3. the prophet
    args.out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out_dir / "checkpoint.pt"
    ckpt = torch.load(ckpt_path) if args.resume and ckpt_path.is_file() else None
    if ckpt and args.init_from:
        raise SystemExit("--resume and --init-from both name a starting point; pick one")
    if args.init_from:
        ckpt = initial_checkpoint(args.init_from, lm)
    fresh_fusion = False
    if ckpt:
        config = ProphetConfig(**ckpt["config"])
        vocab = ckpt["vocab"]
        if args.init_from and args.feature_layers and not config.feature_layers:
            config = dataclasses.replace(config, feature_layers=tuple(args.feature_layers))
            fresh_fusion = True
        if args.init_from and args.new_vocab:
            vocab = draft_vocabulary(train_records, args.vocab, lm.eos_token_ids)
    else:
        config = ProphetConfig.for_target(lm, layers=args.layers, context=args.context,
                                          feature_layers=args.feature_layers)
        vocab = draft_vocabulary(train_records, args.vocab, lm.eos_token_ids)
    if args.feature_layers and config.feature_layers != tuple(args.feature_layers):
        raise SystemExit(f"--feature-layers {args.feature_layers} differ from the checkpoint's {config.feature_layers}")
    prophet = Prophet(config, lm, vocab)
    if ckpt:
        prophet.load_trainable(ckpt["model"], fresh_fusion=fresh_fusion)
    elif args.init_from_target:
        prophet.init_from_target(lm)
    prophet.train()
    fusion = bool(config.feature_layers)
    coverage = float(torch.isin(torch.cat([r["tokens"] for r in held]), vocab).float().mean())
    print(f"prophet: {prophet.num_trainable()} trainable parameters, draft vocab {len(vocab)} "
          f"(held-out token coverage {coverage:.3f})")
    t0 = time.time()
    if args.init_from:
        print(f"starting from {args.init_from}: held-out "
              f"{json.dumps(evaluate(prophet, Answers(held, args.depth, fusion)))}")
    # a timeout's SIGTERM ends training as its time budget would; the summary and the export still follow
    with stop_requested() as stop:
        log = train(prophet, Answers(train_records, args.depth, fusion), Answers(held, args.depth, fusion), args,
                    args.out_dir, start_step=ckpt["step"] if ckpt else 0,
                    optim_state=ckpt.get("optim") if ckpt else None, stop=stop)
        summary = {"target": args.target, "train_responses": len(train_records), "train_tokens": n_tokens,
                   "held_out_responses": n_held, "draft_vocab": len(vocab), "vocab_coverage": round(coverage, 4),
                   "data_seconds": round(t_data), "train_seconds": round(time.time() - t0), **log,
                   "device": str(lm.device), "threads": torch.get_num_threads(), "bf16": bool(args.bf16),
                   **stop.record()}
        (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary))
        if args.export:
            save_prophet(prophet, args.export, metadata={"train_tokens": str(n_tokens),
                                                         "steps": str(log["steps_done"])})
            print(f"wrote {args.export} ({args.export.stat().st_size / 1e6:.1f} MB)")
    return summary


if __name__ == "__main__":
    main()
