"""WebShop's products, goals and search engine.

Two sources give the same `Catalog`:

- the shipped catalog (`envs/data/webshop_products.jsonl`, `webshop_goals.jsonl`), made by
  `scripts/make_webshop_catalog.py` from its own vocabulary (MIT, like the project);
- the original WebShop files, read from paths the user gives (`load_original_catalog`):
  the products file (`items_shuffle*.json`), the attributes file (`items_ins_v2*.json`,
  which also holds the synthetic instructions) and the human instructions
  (`items_human_ins.json`). That data is research-only licensed, so it is never shipped.

Loading follows WebShop's `load_products` / `get_goals`: option values lowercased with
'/' shown as ' | ', a price range "$a to $b" charged at a draw inside it, and a goal's
price limit drawn from the next few multiples of $10 above the price. WebShop draws both
from an unseeded `random`; here they come from seeded generators, so a catalog is the same
in every process. Search is BM25 (bm25s, Lucene's variant, as WebShop's pyserini index) over
the text WebShop indexes: title, description, first bullet point and the option listing.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from itertools import product as cartesian_product
from pathlib import Path

import numpy as np

from envs.data_files import SourceCache

DATA_DIR = Path(__file__).resolve().parent / "data"
SHIPPED_PRODUCTS = DATA_DIR / "webshop_products.jsonl"
SHIPPED_GOALS = DATA_DIR / "webshop_goals.jsonl"

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # WebShop's PRICE_RANGE
NO_PRICE_LIMIT = 1_000_000.0  # WebShop's price_upper when no limit is stated
DEFAULT_PRICE = 100.0          # WebShop's price for a product with no pricing
PRICE_SEED = 0x57EB            # seeds the charged price inside a "$a to $b" range
GOAL_SEED = 233                # seeds goal price limits; 233 is also WebShop's goal-shuffle seed
RAGEN_TEST_GOALS, RAGEN_VAL_GOALS = 500, 1000  # RAGEN: goals[:500] test, [500:1500] val, rest train
SPLITS = ("all", "train", "val", "test")

# Lucene's English stop words (what WebShop's pyserini index drops).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
_TOKEN = re.compile(r"[a-z0-9]+")


class WebShopDataError(ValueError):
    """A catalog or goal file that is missing or malformed."""


@dataclass(frozen=True)
class Product:
    asin: str                      # upper case, as shown on pages
    title: str
    category: str                  # WebShop's top-level category ("beauty")
    query: str                     # the search the product was collected under ("lipstick")
    product_category: str          # breadcrumb "A › B › C"
    description: str
    bullet_points: tuple[str, ...]
    attributes: tuple[str, ...]
    options: dict                  # option name → tuple of values (page order)
    pricing: tuple[float, ...]     # (price,) or (low, high)
    price: float                   # what buying it costs

    @property
    def price_tag(self) -> str:
        if len(self.pricing) == 1:
            return f"${self.pricing[0]:.2f}"
        return f"${self.pricing[0]:.2f} to ${self.pricing[1]:.2f}"


@dataclass(frozen=True)
class Goal:
    asin: str                      # the product the goal was written from
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: tuple[str, ...]  # option values asked for
    price_upper: float
    name: str                      # the target's title, query and breadcrumb: the type match
    query: str
    product_category: str
    split: str = "train"

    @property
    def search_text(self) -> str:
        """The instruction without its price clause: what the scripted expert searches."""
        return re.sub(r",? and price lower than [\d.]+ dollars$", "", self.instruction_text).strip()


def clean_option(value) -> str:
    """Option values as pages show and clicks name them: lower case, single spaces."""
    return " ".join(str(value).lower().split())


def search_tokens(text: str) -> list[str]:
    """Lower-case alphanumeric runs, stop words dropped, a plural 's' stripped ("shirts" ~ "shirt")."""
    tokens = []
    for token in _TOKEN.findall(text.lower()):
        if token in STOP_WORDS:
            continue
        if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
            token = token[:-1]
        tokens.append(token)
    return tokens


def search_document(product: Product) -> str:
    """The text WebShop indexes for a product (its convert_product_file_format)."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())
    first_bullet = product.bullet_points[0] if product.bullet_points else ""
    return " ".join((product.title, product.description, first_bullet, option_text)).lower()


def draw_price_upper(price: float, rng: random.Random) -> float | None:
    """WebShop's goal price limit: the larger of two of the next four $10 steps above the price."""
    above = [step for step in PRICE_STEPS if step > price][:4]
    if len(above) < 2:
        return None
    return max(rng.sample(above, 2))


def price_clause(price_upper: float | None) -> str:
    return "" if price_upper is None else f", and price lower than {price_upper:.2f} dollars"


class Catalog:
    """Products, goals, and a BM25 index over the products (read-only, shared by threads)."""

    def __init__(self, products: list[Product], goals: list[Goal], source: str):
        if not products:
            raise WebShopDataError(f"{source}: the catalog has no products")
        if not goals:
            raise WebShopDataError(f"{source}: the catalog has no goals")
        self.source = source
        self.products = tuple(products)
        self.by_asin = {p.asin: p for p in self.products}
        missing = sorted({g.asin for g in goals} - set(self.by_asin))
        if missing:
            raise WebShopDataError(f"{source}: goals name products that are not in the catalog: {missing[:5]}")
        self.goals = tuple(goals)
        self.queries = tuple(sorted({p.query for p in self.products if p.query}))
        try:
            import bm25s  # lazily: importing envs must not cost bm25s's ~1 s import
        except ImportError:
            raise WebShopDataError("WebShop search needs the 'bm25s' package (pip install bm25s)") from None
        self._index = bm25s.BM25(method="lucene")
        self._index.index([search_tokens(search_document(p)) for p in self.products], show_progress=False)

    def search(self, text: str, limit: int) -> list[Product]:
        """The best `limit` products for `text`, best first; only products sharing a term."""
        token_ids = self._index.get_tokens_ids(search_tokens(text))  # words in no product drop out
        if not token_ids:
            return []
        scores = np.asarray(self._index.get_scores_from_ids(token_ids), dtype=float)
        order = np.argsort(-scores, kind="stable")[:limit]  # ties keep catalog order
        return [self.products[i] for i in order if scores[i] > 0]

    def goals_in(self, split: str) -> tuple[Goal, ...]:
        if split == "all":
            return self.goals
        chosen = tuple(g for g in self.goals if g.split == split)
        if not chosen:
            raise WebShopDataError(f"{self.source}: split {split!r} has no goals")
        return chosen


# --- the shipped catalog --------------------------------------------------------------------

def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise WebShopDataError(f"{path} not found")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise WebShopDataError(f"{path}:{number}: not JSON ({error})") from None
            if not isinstance(row, dict):
                raise WebShopDataError(f"{path}:{number}: expected an object, got {type(row).__name__}")
            rows.append(row)
    return rows


def product_from_record(row: dict, where: str = "product") -> Product:
    """A Product from the shipped schema (`scripts/make_webshop_catalog.py` writes it)."""
    try:
        pricing = tuple(float(p) for p in row["pricing"])
        return Product(
            asin=str(row["asin"]).upper(), title=str(row["title"]), category=str(row["category"]),
            query=str(row["query"]).lower().strip(), product_category=str(row["product_category"]),
            description=str(row["description"]), bullet_points=tuple(map(str, row["bullet_points"])),
            attributes=tuple(map(str, row["attributes"])),
            options={str(k).lower(): tuple(map(clean_option, vs)) for k, vs in row["options"].items()},
            pricing=pricing, price=pricing[0],
        )
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise WebShopDataError(f"{where}: bad product record ({type(error).__name__}: {error})") from None


def goal_from_record(row: dict, product: Product, where: str = "goal") -> Goal:
    try:
        return Goal(
            asin=product.asin, instruction_text=str(row["instruction_text"]),
            attributes=tuple(map(str, row["attributes"])),
            goal_options=tuple(map(clean_option, row["goal_options"])),
            price_upper=float(row["price_upper"]), name=product.title, query=product.query,
            product_category=product.product_category, split=str(row.get("split", "train")),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise WebShopDataError(f"{where}: bad goal record ({type(error).__name__}: {error})") from None


def load_shipped_catalog(products_path: Path = SHIPPED_PRODUCTS, goals_path: Path = SHIPPED_GOALS) -> Catalog:
    rows = _read_jsonl(products_path)
    products = [product_from_record(row, f"{products_path}:{i + 1}") for i, row in enumerate(rows)]
    by_asin = {p.asin: p for p in products}
    goals = []
    for i, row in enumerate(_read_jsonl(goals_path)):
        asin = str(row.get("asin", "")).upper()
        if asin not in by_asin:
            raise WebShopDataError(f"{goals_path}:{i + 1}: goal names unknown product {asin!r}")
        goals.append(goal_from_record(row, by_asin[asin], f"{goals_path}:{i + 1}"))
    return Catalog(products, goals, source=str(products_path))


# --- the original WebShop files ---------------------------------------------------------------

def _read_json(path: str | Path, expected: type) -> object:
    path = Path(path)
    if not path.is_file():
        raise WebShopDataError(f"{path} not found")
    try:
        with path.open(encoding="utf-8") as handle:
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise WebShopDataError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, expected):
        raise WebShopDataError(f"{path}: expected a JSON {expected.__name__}, got {type(data).__name__}")
    return data


def parse_pricing(pricing) -> tuple[float, ...]:
    """WebShop's pricing field ("$12.99", "$10.71 to $18.34", empty) → (price,) or (low, high)."""
    if not pricing:
        return (DEFAULT_PRICE,)
    if isinstance(pricing, str):
        pieces = [re.sub(r"[^\d.]", "", piece) for piece in pricing.split("$")[1:]]
    else:  # some re-exports keep a list of numbers or "$x" strings
        pieces = [re.sub(r"[^\d.]", "", str(piece)) for piece in pricing]
    try:
        values = tuple(float(Decimal(piece)) for piece in pieces if piece)
    except InvalidOperation:
        raise WebShopDataError(f"unreadable pricing {pricing!r}") from None
    return values[:2] if values else (DEFAULT_PRICE,)


def _charged_price(asin: str, pricing: tuple[float, ...]) -> float:
    if len(pricing) == 1:
        return pricing[0]
    rng = np.random.default_rng([PRICE_SEED, zlib.crc32(asin.encode())])
    return float(rng.uniform(pricing[0], pricing[1]))


def _original_product(raw: dict, attributes: dict) -> Product:
    asin = str(raw["asin"])
    options = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents is None:
            continue
        options[str(name).lower()] = tuple(
            clean_option(str(content["value"]).replace("/", " | ")) for content in contents
        )
    bullets = raw.get("small_description") or []
    pricing = parse_pricing(raw.get("pricing"))
    return Product(
        asin=asin.upper(), title=str(raw.get("name") or ""), category=str(raw.get("category") or ""),
        query=str(raw.get("query") or "").lower().strip(), product_category=str(raw.get("product_category") or ""),
        description=str(raw.get("full_description") or ""),
        bullet_points=tuple(map(str, bullets)) if isinstance(bullets, list) else (str(bullets),),
        attributes=tuple(map(str, (attributes.get(asin) or {}).get("attributes") or ())),
        options=options, pricing=pricing, price=_charged_price(asin, pricing),
    )


def _goal(product: Product, instruction: str, attributes, options, price_upper: float | None) -> Goal:
    return Goal(
        asin=product.asin, instruction_text=instruction + price_clause(price_upper),
        attributes=tuple(map(str, attributes)), goal_options=tuple(map(clean_option, options)),
        price_upper=NO_PRICE_LIMIT if price_upper is None else price_upper,
        name=product.title, query=product.query, product_category=product.product_category,
    )


def _human_goals(products: list[Product], human: dict, rng: random.Random) -> list[Goal]:
    goals = []
    for product in products:
        for record in human.get(product.asin, human.get(product.asin.lower())) or ():
            attributes = record.get("instruction_attributes") or []
            if not attributes:  # WebShop skips these
                continue
            upper = draw_price_upper(product.price, rng)
            goals.append(_goal(product, str(record["instruction"]).strip("."), attributes,
                               record.get("instruction_options") or [], upper))
    return goals


def _synthetic_goals(products: list[Product], attributes: dict, rng: random.Random) -> list[Goal]:
    """One goal per combination of option values, as WebShop's get_synthetic_goals."""
    goals = []
    for product in products:
        record = attributes.get(product.asin) or {}
        if not record.get("instruction") or not record.get("instruction_attributes"):
            continue
        upper = draw_price_upper(product.price, rng)
        names = sorted(product.options)
        for combination in cartesian_product(*(product.options[name] for name in names)):
            option_text = ", and ".join(f"{n}: {v}" for n, v in zip(names, combination))
            text = record["instruction"] + (f" with {option_text}" if option_text else "")
            goals.append(_goal(product, text, record["instruction_attributes"], combination, upper))
    return goals


def load_original_catalog(products_file: str | Path, attributes_file: str | Path | None = None,
                          human_goals_file: str | Path | None = None, num_products: int | None = None) -> Catalog:
    """Read WebShop's own files. Human goals when `human_goals_file` is given, else synthetic ones.

    Splits follow RAGEN: goals shuffled with WebShop's seed 233, then the first 500 are
    'test', the next 1000 'val', the rest 'train'.
    """
    if not attributes_file and not human_goals_file:
        raise WebShopDataError("WebShop goals need attributes_file (synthetic goals) or human_goals_file")
    raw_products = _read_json(products_file, list)
    attributes = _read_json(attributes_file, dict) if attributes_file else {}
    human = _read_json(human_goals_file, dict) if human_goals_file else None
    if num_products:
        raw_products = raw_products[:num_products]  # WebShop assumes the file is already shuffled
    products, seen = [], set()
    for index, raw in enumerate(raw_products):
        if not isinstance(raw, dict) or "asin" not in raw:
            raise WebShopDataError(f"{products_file}: item {index} is not a product with an 'asin'")
        asin = str(raw["asin"])
        if asin == "nan" or len(asin) > 10 or asin in seen:  # WebShop's filter
            continue
        seen.add(asin)
        try:
            products.append(_original_product(raw, attributes))
        except (KeyError, TypeError, AttributeError) as error:
            raise WebShopDataError(f"{products_file}: product {asin}: {type(error).__name__}: {error}") from None
    rng = random.Random(GOAL_SEED)
    try:
        goals = _human_goals(products, human, rng) if human is not None else _synthetic_goals(products, attributes, rng)
    except (KeyError, TypeError, AttributeError) as error:
        raise WebShopDataError(f"malformed WebShop goal record: {type(error).__name__}: {error}") from None
    random.Random(GOAL_SEED).shuffle(goals)
    for index, goal in enumerate(goals):
        split = "test" if index < RAGEN_TEST_GOALS else "val" if index < RAGEN_TEST_GOALS + RAGEN_VAL_GOALS else "train"
        goals[index] = replace(goal, split=split)
    return Catalog(products, goals, source=str(products_file))


# --- a cache, so every env of one process shares one catalog and index -------------------------

_CACHE = SourceCache()


def get_catalog(products_file: str = "", attributes_file: str = "", human_goals_file: str = "",
                num_products: int = 0) -> Catalog:
    """The shipped catalog when `products_file` is empty, else the original WebShop files."""
    if not products_file:
        return _CACHE.get(("shipped",), load_shipped_catalog)
    return _CACHE.get((products_file, attributes_file, human_goals_file, num_products),
                      lambda: load_original_catalog(products_file, attributes_file or None,
                                                    human_goals_file or None, num_products or None))
