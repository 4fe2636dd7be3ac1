"""WebShop's purchase score, in our own code (semantics of web_agent_site/engine/goal.py).

    score = r_type · (attribute matches + option matches + [price ≤ price_upper])
                   / (goal attributes + goal options + 1)

- attribute match: a goal attribute fuzzy-matches one of the product's attributes
  (token-set ratio > 85), or appears verbatim in its title, bullet points or description;
- option match: a goal option value fuzzy-matches a chosen option value, after both are
  reduced to the first colour word they contain (WebShop's normalize_color);
- r_type (product type): 1.0 when the query matches, or two breadcrumb levels match, or
  the title overlap exceeds 0.2; else 0.5; then 0.1 when the overlap is under 0.1, and 0.0
  when it is nil. Title overlap = shared title terms / the goal title's terms.

Fuzzy matching is rapidfuzz's token_set_ratio with thefuzz's preprocessing (characters
U+0080-U+00FF deleted, as its `force_ascii` does; lower case; punctuation to spaces) and its
rounding to an integer, so scores equal thefuzz's, which WebShop uses.

Title terms: WebShop keeps the tokens spaCy's en_core_web_sm tags NOUN or PROPN.
`title_match` chooses how we get them:
- "nouns" (default, no model): words that are not stop words, bare numbers, the possessive
  "s", or a colour word written in lower case. spaCy tags a lower-case colour as an adjective
  ("red leather handbag" → leather, handbag) and nearly every capitalised title word as a
  proper noun ("Cruelty Free" → cruelty, free), which this mimics. Against en_core_web_sm
  3.8 it gives the same r_type on 99.9% of (goal, product) pairs of the shipped catalog.
- "words": every word but stop words and bare numbers (the earlier default; 99.8% there,
  but "red running shoes" bought for "red leather handbag" passes as the right type).
- "spacy_nouns": WebShop's rule itself, when spaCy and en_core_web_sm are installed.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from envs.webshop_catalog import STOP_WORDS, Goal, Product

FUZZY_THRESHOLD = 85
TITLE_MATCH_MODES = ("nouns", "words", "spacy_nouns")

# WebShop's COLOR_SET, in its order: normalize_color returns the first one contained.
COLOR_WORDS = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy "
    "camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral "
    "cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass "
    "gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon "
    "mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter "
    "pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone "
    "stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow"
).split()
_WORD = re.compile(r"[a-z0-9]+")
_CASED_WORD = re.compile(r"[A-Za-z0-9]+")
_COLOR_SET = frozenset(COLOR_WORDS)
_LATIN1_HIGH = re.compile(r"[\x80-\xff]")  # thefuzz's asciionly table: chr(128)..chr(255) only


@dataclass(frozen=True)
class PurchaseScore:
    total: float
    r_type: float
    r_att: float
    r_option: float | None   # None when the goal asks for no option
    r_price: bool
    num_attr_matches: int
    num_option_matches: int
    query_match: bool
    category_match: bool
    title_score: float

    def to_info(self) -> dict:
        return dict(self.__dict__)


def fuzzy_score(a: str, b: str) -> int:
    """thefuzz's token_set_ratio(a, b): U+0080-U+00FF dropped, default processing, rounded."""
    try:
        from rapidfuzz import fuzz, utils  # lazily: importing envs must not need it
    except ImportError:
        raise RuntimeError("the WebShop score needs the 'rapidfuzz' package (pip install rapidfuzz)") from None
    a = utils.default_process(_LATIN1_HIGH.sub("", a))
    b = utils.default_process(_LATIN1_HIGH.sub("", b))
    return int(round(fuzz.token_set_ratio(a, b)))


def normalize_color(value: str) -> str:
    for color in COLOR_WORDS:
        if color in value:
            return color
    return value


def word_terms(title: str) -> list[str]:
    return [w for w in _WORD.findall(title.lower()) if w not in STOP_WORDS and not w.isdigit()]


def noun_terms(title: str) -> list[str]:
    """The model-free approximation of spaCy's nouns (see the module docstring)."""
    terms = []
    for word in _CASED_WORD.findall(title):
        lower = word.lower()
        if lower in STOP_WORDS or lower.isdigit() or lower == "s" or (word == lower and lower in _COLOR_SET):
            continue
        terms.append(lower)
    return terms


_SPACY_LOCK = threading.Lock()
_SPACY_NLP = []


def spacy_noun_terms(title: str) -> list[str]:
    """WebShop's own title terms: tokens spaCy tags NOUN or PROPN (needs en_core_web_sm)."""
    with _SPACY_LOCK:
        if not _SPACY_NLP:
            try:
                import spacy
                _SPACY_NLP.append(spacy.load("en_core_web_sm"))
            except (ImportError, OSError) as error:
                raise RuntimeError(
                    "title_match='spacy_nouns' needs spaCy and its en_core_web_sm model "
                    f"installed ({error}); use title_match='words' otherwise"
                ) from None
        parsed = _SPACY_NLP[0](title)
    return [t.text.lower() for t in parsed if t.pos_ in ("PNOUN", "NOUN", "PROPN")]


def title_terms_for(mode: str) -> Callable[[str], list[str]]:
    if mode not in TITLE_MATCH_MODES:
        raise ValueError(f"title_match must be one of {list(TITLE_MATCH_MODES)}, got {mode!r}")
    return {"nouns": noun_terms, "words": word_terms, "spacy_nouns": spacy_noun_terms}[mode]


def type_score(product: Product, goal: Goal, title_terms: Callable[[str], list[str]] = noun_terms) -> tuple:
    """(r_type, query_match, category_match, title_score)."""
    query_match = product.query == goal.query
    bought_levels = {level.strip() for level in product.product_category.split("›")}
    goal_levels = {level.strip() for level in goal.product_category.split("›")}
    category_match = len(bought_levels & goal_levels) >= 2
    wanted = title_terms(goal.name)
    if not wanted:
        title_score = 0.2  # WebShop's value when the goal title has no terms
    else:
        title_score = len(set(title_terms(product.title)) & set(wanted)) / len(wanted)
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal: Goal) -> int:
    text_fields = (product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower())
    matches = 0
    for wanted in goal.attributes:
        if any(fuzzy_score(have, wanted) > FUZZY_THRESHOLD for have in product.attributes):
            matches += 1
        elif any(wanted in field for field in text_fields):
            matches += 1
    return matches


def option_matches(chosen: Sequence[str], wanted: Sequence[str]) -> int:
    chosen = [normalize_color(o) for o in chosen]
    matches = 0
    for goal_option in (normalize_color(o) for o in wanted):
        if any(fuzzy_score(have, goal_option) > FUZZY_THRESHOLD for have in chosen):
            matches += 1
    return matches


def purchase_score(product: Product, goal: Goal, price: float, options: Mapping[str, str] | Sequence[str],
                   title_terms: Callable[[str], list[str]] = noun_terms) -> PurchaseScore:
    """Score buying `product` at `price` with `options` (name → value, or the values) for `goal`."""
    chosen = list(options.values()) if isinstance(options, Mapping) else list(options)
    r_type, query_match, category_match, title_score = type_score(product, goal, title_terms)
    r_price = price <= goal.price_upper
    num_attr = attribute_matches(product, goal)
    num_opt = option_matches(chosen, goal.goal_options)
    denominator = len(goal.attributes) + len(goal.goal_options) + 1
    total = (num_attr + num_opt + int(r_price)) / denominator * r_type
    return PurchaseScore(
        total=total, r_type=r_type,
        r_att=num_attr / len(goal.attributes) if goal.attributes else 0.0,
        r_option=num_opt / len(goal.goal_options) if goal.goal_options else None,
        r_price=r_price, num_attr_matches=num_attr, num_option_matches=num_opt,
        query_match=query_match, category_match=category_match, title_score=title_score,
    )
