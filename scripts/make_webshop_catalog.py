"""Make the shipped WebShop catalog and goals: envs/data/webshop_{products,goals}.jsonl.

    python scripts/make_webshop_catalog.py [--out DIR] [--seed 0]

Deterministic: the same seed writes the same bytes (tests/envs/test_webshop.py checks the shipped
files against a fresh run). 8 categories x 3 product types x 17 products; each product has a
brand, 3-4 attributes from its type's pool, 2 option groups, a price; title, description and
bullet points are written from those. Goals follow WebShop's synthetic ones: an instruction
from 1-3 of the product's attributes, one value of every option group, and a price limit
drawn as WebShop draws it. A goal is kept only when the scripted expert
(`envs.webshop.expert_action`) buys its product at full score within the 9-action budget;
every 5th kept goal is in the 'test' split.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from envs.parsing import format_response
from envs.webshop import WebShopConfig, WebShopEnv, expert_action
from envs.webshop_catalog import (
    DATA_DIR, Catalog, draw_price_upper, goal_from_record, price_clause, product_from_record,
)
from envs.webshop_reward import fuzzy_score

PRODUCTS_PER_TYPE = 17
GOALS_PER_TYPE = 7
TEST_EVERY = 5

# category → (breadcrumb root, brands, types). A type: query, title noun, breadcrumb tail,
# attribute pool, option groups, price range. Option values avoid '/' and '||'.
CATEGORIES = {
    "beauty": ("Beauty & Personal Care", ["Velora", "Lumiere", "Aubrey Lane", "Petalra", "Nordessa"], [
        ("lipstick", "Lipstick", "Makeup › Lips › Lipstick",
         ["long lasting", "cruelty free", "paraben free", "matte finish", "moisturizing", "waterproof"],
         {"color": ["red", "pink", "nude", "coral", "plum", "berry"]}, (5, 75)),
        ("shampoo", "Shampoo", "Hair Care › Shampoo & Conditioner › Shampoos",
         ["sulfate free", "natural ingredients", "color safe", "dry scalp", "vegan formula", "volumizing"],
         {"size": ["8 fl oz", "12 fl oz", "16 fl oz", "33.8 fl oz"],
          "scent": ["lavender", "coconut", "citrus", "unscented"]},
         (6, 90)),
        ("nail polish", "Nail Polish", "Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
         ["quick drying", "chip resistant", "non toxic", "high gloss", "salon quality"],
         {"color": ["red", "black", "nude", "teal", "gold", "lilac"], "size": ["0.5 fl oz", "1 fl oz"]}, (3, 45)),
    ]),
    "clothing": ("Clothing, Shoes & Jewelry", ["Northway", "Bramble & Co", "Kestrel", "Urbanfold", "Hollis"], [
        ("men t-shirt", "Men's Crew Neck T-Shirt", "Men › Clothing › Shirts › T-Shirts",
         ["machine washable", "cotton", "short sleeve", "classic fit", "moisture wicking", "tagless"],
         {"size": ["small", "medium", "large", "x-large", "xx-large"],
          "color": ["black", "white", "navy", "olive", "maroon"]},
         (8, 80)),
        ("women dress", "Women's Midi Dress", "Women › Clothing › Dresses › Casual",
         ["long sleeve", "v neck", "elastic waist", "side pockets", "lightweight fabric", "hand wash"],
         {"size": ["x-small", "small", "medium", "large", "x-large"],
          "color": ["black", "navy", "burgundy", "sage green", "mustard"]},
         (15, 140)),
        ("hoodie", "Pullover Hoodie", "Men › Clothing › Fashion Hoodies & Sweatshirts",
         ["fleece lined", "drawstring hood", "kangaroo pocket", "ribbed cuffs", "relaxed fit"],
         {"size": ["small", "medium", "large", "x-large"],
          "color": ["charcoal", "black", "forest green", "royal blue"]},
         (18, 120)),
    ]),
    "electronics": ("Electronics", ["Voltix", "Sonara", "Quillon", "Arcwave", "Tandem Labs"], [
        ("wireless earbuds", "Wireless Earbuds", "Headphones, Earbuds & Accessories › Earbud Headphones",
         ["noise cancelling", "bluetooth 5.3", "long battery life", "water resistant", "touch control",
          "built in microphone"],
         {"color": ["black", "white", "navy blue", "rose gold"]}, (15, 220)),
        ("usb c charger", "USB C Charger", "Accessories & Supplies › Chargers & Adapters",
         ["fast charging", "compact design", "foldable plug", "multi port", "overheat protection"],
         {"wattage": ["20w", "30w", "65w", "100w"], "color": ["black", "white"]}, (8, 90)),
        ("wireless mouse", "Wireless Mouse", "Computers & Accessories › Keyboards, Mice & Accessories › Mice",
         ["ergonomic design", "silent click", "rechargeable battery", "adjustable dpi", "plug and play"],
         {"color": ["black", "grey", "pink", "white"]}, (8, 95)),
    ]),
    "home": ("Home & Kitchen", ["Harbor Home", "Linden", "Cozynest", "Maple Row", "Serewood"], [
        ("throw pillow cover", "Throw Pillow Cover",
         "Home Décor › Decorative Pillows, Inserts & Covers › Pillow Covers",
         ["hidden zipper", "linen blend", "double sided", "hand painted", "boho style"],
         {"size": ["16x16 inch", "18x18 inch", "20x20 inch"],
          "color": ["beige", "navy", "sage green", "mustard yellow", "grey"]},
         (6, 70)),
        ("coffee mug", "Coffee Mug", "Kitchen & Dining › Dining & Entertaining › Cups, Mugs & Saucers › Mugs",
         ["dishwasher safe", "microwave safe", "ceramic", "lead free", "large handle"],
         {"size": ["11 ounce", "15 ounce", "20 ounce"], "color": ["white", "black", "blue", "speckled"]}, (7, 60)),
        ("bath towel set", "Bath Towel Set", "Bath › Towels › Bath Towels",
         ["100% cotton", "quick dry", "highly absorbent", "extra soft", "fade resistant"],
         {"color": ["white", "grey", "navy", "aqua"], "size": ["2 piece", "4 piece", "6 piece"]}, (15, 150)),
    ]),
    "grocery": ("Grocery & Gourmet Food", ["Hearthfield", "Sunmeadow", "Bluecrest", "Oak & Ember", "Tidewell"], [
        ("coffee beans", "Whole Bean Coffee", "Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
         ["organic", "fair trade", "single origin", "low acid", "small batch roasted"],
         {"flavor": ["medium roast", "dark roast", "espresso roast", "french vanilla"],
          "size": ["12 ounce", "2 pound", "5 pound"]},
         (8, 110)),
        ("protein bar", "Protein Bars", "Snack Foods › Bars › Protein Bars",
         ["gluten free", "low sugar", "high protein", "keto friendly", "plant based"],
         {"flavor": ["chocolate chip", "peanut butter", "cookies and cream", "salted caramel"],
          "size": ["pack of 6", "pack of 12", "pack of 24"]},
         (10, 90)),
        ("green tea", "Green Tea Bags", "Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
         ["usda organic", "antioxidant rich", "non gmo", "individually wrapped", "kosher"],
         {"flavor": ["jasmine", "mint", "lemon", "original"], "size": ["20 count", "50 count", "100 count"]}, (4, 55)),
    ]),
    "sports": ("Sports & Outdoors", ["Trailcraft", "Peakform", "Riverbend", "Solstice Athletics", "Ironpine"], [
        ("yoga mat", "Yoga Mat", "Exercise & Fitness › Yoga › Yoga Mats",
         ["non slip", "eco friendly", "extra thick", "carrying strap", "alignment lines"],
         {"color": ["purple", "black", "blue", "teal", "pink"], "thickness": ["4mm", "6mm", "8mm"]}, (12, 120)),
        ("water bottle", "Water Bottle", "Outdoor Recreation › Camping & Hiking › Hydration › Water Bottles",
         ["bpa free", "vacuum insulated", "leak proof", "stainless steel", "wide mouth"],
         {"color": ["black", "white", "teal", "red", "lavender"], "size": ["18 oz", "24 oz", "32 oz", "40 oz"]},
         (9, 95)),
        ("running shoes", "Running Shoes", "Sports & Fitness › Running › Footwear › Road Running Shoes",
         ["breathable mesh", "arch support", "rubber sole", "cushioned midsole", "wide toe box"],
         {"size": ["7", "8", "9", "10", "11", "12"], "color": ["black", "white", "grey", "blue"]}, (25, 220)),
    ]),
    "furniture": ("Home & Kitchen › Furniture", ["Woodhaven", "Axford", "Nestly", "Grainline", "Cobalt & Pine"], [
        ("office chair", "Office Chair", "Home Office Furniture › Home Office Chairs › Desk Chairs",
         ["lumbar support", "adjustable height", "mesh back", "padded armrests", "360 swivel"],
         {"color": ["black", "grey", "white", "blue"]}, (50, 450)),
        ("bookshelf", "Bookshelf", "Living Room Furniture › Bookcases",
         ["easy assembly", "solid wood", "space saving", "metal frame", "anti tip hardware"],
         {"color": ["walnut", "white", "black", "rustic brown"], "size": ["3 tier", "4 tier", "5 tier"]}, (30, 320)),
        ("nightstand", "Nightstand", "Bedroom Furniture › Nightstands",
         ["storage drawer", "charging station", "open shelf", "rounded corners", "mid century"],
         {"color": ["white", "black", "oak", "walnut"]}, (25, 260)),
    ]),
    "pets": ("Pet Supplies", ["Pawsome", "Barkley & Bean", "Whiskerwood", "Furrow", "Tailspin"], [
        ("dog bed", "Dog Bed", "Dogs › Beds & Furniture › Beds",
         ["machine washable", "orthopedic foam", "non slip bottom", "waterproof lining", "raised rim"],
         {"size": ["small", "medium", "large", "x-large"], "color": ["grey", "brown", "beige", "navy"]}, (15, 180)),
        ("cat scratching post", "Cat Scratching Post", "Cats › Furniture › Scratchers",
         ["sisal rope", "sturdy base", "dangling toy", "plush cover", "tool free assembly"],
         {"color": ["beige", "grey", "dark brown"], "size": ["24 inch", "32 inch"]}, (12, 130)),
        ("dog leash", "Dog Leash", "Dogs › Collars, Harnesses & Leashes › Leashes",
         ["reflective stitching", "padded handle", "heavy duty", "nylon webbing", "hands free"],
         {"color": ["black", "red", "blue", "pink", "orange"], "size": ["4 ft", "5 ft", "6 ft"]}, (6, 60)),
    ]),
}
DESCRIPTIONS = (
    "The {brand} {noun} is {attrs}. Backed by a 30 day return policy.",
    "Meet the {noun} from {brand}: {attrs}, made for everyday use.",
    "{brand} designed this {noun} to be {attrs}. Ships in recyclable packaging.",
)
INSTRUCTIONS = ("i need {attrs} {query}", "find me {attrs} {query}", "i am looking for {query} that is {attrs}",
                "i want to buy {query}, {attrs}")


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _asin(rng: np.random.Generator, taken: set[str]) -> str:
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    while True:
        asin = "B0" + "".join(alphabet[i] for i in rng.integers(len(alphabet), size=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def make_products(rng: np.random.Generator) -> list[dict]:
    products, taken = [], set()
    for category, (root, brands, types) in CATEGORIES.items():
        for query, noun, tail, pool, option_groups, (low, high) in types:
            for _ in range(PRODUCTS_PER_TYPE):
                brand = brands[int(rng.integers(len(brands)))]
                picks = sorted(rng.choice(len(pool), size=int(rng.integers(3, 5)), replace=False))
                attributes = [pool[i] for i in picks]
                options = {}
                for name, values in option_groups.items():
                    count = int(rng.integers(min(2, len(values)), len(values) + 1))
                    options[name] = [values[i] for i in sorted(rng.choice(len(values), size=count, replace=False))]
                price = round(float(rng.uniform(low, high)), 2)
                title = f"{brand} {noun}, " + ", ".join(a.title() for a in attributes[:2])
                template = DESCRIPTIONS[int(rng.integers(len(DESCRIPTIONS)))]
                products.append({
                    "asin": _asin(rng, taken), "title": title, "category": category, "query": query,
                    "product_category": f"{root} › {tail}", "pricing": [price], "attributes": attributes,
                    "options": options,
                    "description": template.format(brand=brand, noun=noun.lower(), attrs=_join(attributes)),
                    "bullet_points": [a.capitalize() for a in attributes] + [f"Sold by {brand}"],
                })
    _check_attributes_are_distinct(products)
    return products


def _check_attributes_are_distinct(products: list[dict]) -> None:
    """A product must not match an attribute of its type's pool that it lacks (fuzzy or in its text)."""
    pools = {query: pool for _, (_, _, types) in CATEGORIES.items() for query, _, _, pool, _, _ in types}
    for product in products:
        text = " ".join([product["title"], product["description"], *product["bullet_points"]]).lower()
        for attribute in set(pools[product["query"]]) - set(product["attributes"]):
            clash = attribute in text or any(fuzzy_score(a, attribute) > 85 for a in product["attributes"])
            if clash:
                raise SystemExit(f"vocabulary clash: {product['title']!r} matches attribute {attribute!r}")


def make_goal_candidates(products: list[dict], rng: np.random.Generator) -> list[dict]:
    price_rng = random.Random(int(rng.integers(2**31)))  # WebShop draws the limit with `random`
    goals = []
    by_query: dict[str, list[dict]] = {}
    for product in products:
        by_query.setdefault(product["query"], []).append(product)
    for query, members in by_query.items():
        for index in sorted(rng.choice(len(members), size=GOALS_PER_TYPE + 2, replace=False)):
            product = members[index]
            count = int(rng.integers(1, min(3, len(product["attributes"])) + 1))
            picks = sorted(rng.choice(len(product["attributes"]), count, replace=False))
            attributes = [product["attributes"][i] for i in picks]
            chosen = {name: values[int(rng.integers(len(values)))] for name, values in product["options"].items()}
            template = INSTRUCTIONS[int(rng.integers(len(INSTRUCTIONS)))]
            option_text = ", and ".join(f"{name}: {value}" for name, value in chosen.items())
            upper = draw_price_upper(product["pricing"][0], price_rng)
            goals.append({
                "asin": product["asin"],
                "instruction_text": template.format(attrs=_join(attributes), query=query)
                + f" with {option_text}" + price_clause(upper),
                "attributes": attributes, "goal_options": list(chosen.values()),
                "price_upper": upper if upper is not None else 1_000_000.0,
            })
    return goals


def expert_reaches_full_score(env: WebShopEnv, goal_index: int) -> bool:
    env.reset_to_goal(goal_index)
    for _ in range(env.config.max_actions_per_traj):
        _, _, terminated, truncated, info = env.step(format_response([expert_action(env)], think="expert"))
        if terminated or truncated:
            return bool(info["success"])
    return False


def keep_reachable(products: list[dict], candidates: list[dict]) -> list[dict]:
    """Keep candidates the expert solves, GOALS_PER_TYPE per type, then mark every 5th as 'test'."""
    records = [product_from_record(p) for p in products]
    by_asin = {p.asin: p for p in records}
    goals = [goal_from_record(c, by_asin[c["asin"]]) for c in candidates]
    env = WebShopEnv(WebShopConfig(split="all"), catalog=Catalog(records, goals, source="generator"))
    kept, per_query = [], {}
    for index, (candidate, goal) in enumerate(zip(candidates, goals)):
        if per_query.get(goal.query, 0) < GOALS_PER_TYPE and expert_reaches_full_score(env, index):
            kept.append(candidate)
            per_query[goal.query] = per_query.get(goal.query, 0) + 1
    for index, goal in enumerate(kept):
        goal["split"] = "test" if index % TEST_EVERY == TEST_EVERY - 1 else "train"
    return kept


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    products = make_products(rng)
    goals = keep_reachable(products, make_goal_candidates(products, rng))
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "webshop_products.jsonl", products)
    write_jsonl(args.out / "webshop_goals.jsonl", goals)
    print(f"{len(products)} products, {len(goals)} goals "
          f"({sum(g['split'] == 'test' for g in goals)} test) → {args.out}")


if __name__ == "__main__":
    main()
