"""WebShop: pages, parsing, the purchase score against hand-computed values, the shipped
goals (each one bought at full score by the scripted expert), and the original-data loader."""

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import envs
import envs.webshop  # registers "webshop" (until it is in registry.BUILTIN_MODULES)
from envs.parsing import format_response
from envs.webshop import WebShopConfig, WebShopEnv, canonical_action, expert_action
from envs.webshop_catalog import (
    PRICE_STEPS, SHIPPED_GOALS, SHIPPED_PRODUCTS, Catalog, Goal, Product, draw_price_upper,
    load_original_catalog, parse_pricing,
)
from envs.webshop_reward import (
    attribute_matches, fuzzy_score, noun_terms, normalize_color, option_matches, purchase_score, type_score,
    word_terms,
)

ROOT = Path(__file__).resolve().parents[2]
LIPS = "Beauty & Personal Care › Makeup › Lips › Lipstick"


def act(env, *actions):
    """Play actions one turn each; return the last step's (obs, reward, terminated, truncated, info)."""
    result = None
    for action in actions:
        result = env.step(format_response([action], think="t"))
    return result


def product(asin, title, query, breadcrumb, attributes=(), options=None, price=10.0, description="", bullets=()):
    return Product(asin=asin, title=title, category="test", query=query, product_category=breadcrumb,
                   description=description, bullet_points=tuple(bullets), attributes=tuple(attributes),
                   options=options or {}, pricing=(price,), price=price)


# A tiny catalog whose scores are worked out by hand below.
LIPSTICK = product("B000000001", "Velora Lipstick, Long Lasting, Cruelty Free", "lipstick", LIPS,
                   ["long lasting", "cruelty free", "matte finish"], {"color": ("red", "pink", "nude")}, 18.0,
                   "A lipstick that stays on all day.", ["Long lasting", "Cruelty free"])
PRICEY = product("B000000002", "Lumiere Lipstick, Matte Finish", "lipstick", LIPS, ["matte finish", "moisturizing"],
                 {"color": ("red", "plum")}, 75.0, "Lumiere lipstick with a matte finish.")
MUG = product("B000000003", "Linden Coffee Mug, Ceramic", "coffee mug", "Home & Kitchen › Kitchen & Dining › Mugs",
              ["dishwasher safe", "ceramic"], {"size": ("11 ounce", "15 ounce")}, 12.0, "A ceramic mug.")
CREAM = product("B000000004", "Velora Hand Cream", "hand cream", "Health & Household › Skin Care › Hand Creams",
                ["long lasting", "fragrance free"], {}, 9.0, "Rich hand cream.")
GOAL = Goal(asin=LIPSTICK.asin, instruction_text="i need long lasting and cruelty free lipstick with color: red, "
            "and price lower than 30.00 dollars", attributes=("long lasting", "cruelty free"), goal_options=("red",),
            price_upper=30.0, name=LIPSTICK.title, query="lipstick", product_category=LIPS)


@pytest.fixture(scope="module")
def tiny_catalog():
    return Catalog([LIPSTICK, PRICEY, MUG, CREAM], [GOAL], source="tiny")


def tiny_env(catalog, **overrides):
    return WebShopEnv(WebShopConfig(split="all", **overrides), catalog=catalog)


# --- the score, worked by hand: (attributes + options + price) / (2 + 1 + 1) × r_type ----------

@pytest.mark.parametrize("bought, options, expected, parts", [
    (LIPSTICK, {"color": "red"}, 4 / 4, dict(num_attr_matches=2, num_option_matches=1, r_price=True, r_type=1.0)),
    (LIPSTICK, {"color": "pink"}, 3 / 4, dict(num_option_matches=0)),                      # wrong colour
    (LIPSTICK, {}, 3 / 4, dict(num_option_matches=0)),                                     # no option chosen
    (PRICEY, {"color": "red"}, 1 / 4, dict(num_attr_matches=0, r_price=False, query_match=True)),  # over price
    (MUG, {"size": "11 ounce"}, 0.0, dict(title_score=0.0, r_type=0.0)),                  # wrong type
    # other type, one of six title terms shared (1/6 ≤ 0.2): r_type 0.5; "long lasting" matches, price ok
    (CREAM, {}, (1 + 0 + 1) / 4 * 0.5, dict(num_attr_matches=1, r_type=0.5, query_match=False,
                                             category_match=False)),
])
def test_purchase_score_matches_hand_computed_values(bought, options, expected, parts):
    score = purchase_score(bought, GOAL, bought.price, options)
    assert score.total == pytest.approx(expected, abs=1e-12)
    for key, value in parts.items():
        assert getattr(score, key) == pytest.approx(value), key


def test_type_score_levels():
    goal = Goal(asin="X", instruction_text="", attributes=("a",), goal_options=(), price_upper=10.0,
                name="Alpha Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliet Kilo", query="q1",
                product_category="A › B › C")
    far = product("Y", "Kilo Widget", "q2", "D › E › F")
    assert type_score(far, goal)[0] == 0.1 and type_score(far, goal)[3] == pytest.approx(1 / 11)  # overlap < 0.1
    # A query or breadcrumb match lifts r_type to 1.0 only when the title overlap is at least 0.1.
    assert type_score(product("Y", "Kilo Widget", "q1", "A › B › C"), goal)[:3] == (0.1, True, True)
    shelf_mate = product("Y", "Kilo Juliet Widget", "q2", "B › A › Z")  # 2/11; two levels shared, any order
    assert type_score(shelf_mate, goal)[:3] == (1.0, False, True)
    same_query = product("Y", "Kilo Juliet Widget", "q1", "D › E › F")
    assert type_score(same_query, goal)[:2] == (1.0, True)
    assert type_score(product("Y", "Kilo Juliet Widget", "q2", "D › E › F"), goal)[0] == 0.5
    stranger = product("Y", "Zulu", "q1", "A › B › C")  # query and breadcrumb match, but no shared title term
    assert type_score(stranger, goal)[0] == 0.0


def test_attribute_and_option_matching_follow_webshops_own_cases():
    goal = Goal(asin="X", instruction_text="", attributes=("tea tree", "essential oils", "natural ingredients"),
                goal_options=(), price_upper=1.0, name="n", query="q", product_category="c")
    exact = product("Y", "", "q", "c", ["tea tree", "essential oil", "natural ingredients"])
    assert attribute_matches(exact, goal) == 3
    assert attribute_matches(product("Y", "", "q", "c", ["essential oil", "natural ingredients"]), goal) == 2
    in_text = product("Y", "", "q", "c", [], bullets=["This shampoo has essential oils and smells like lemons"],
                      description="Best shampoo on the market, made with natural ingredients")
    assert attribute_matches(in_text, goal) == 2
    assert attribute_matches(product("Y", "English tea for breakfast", "q", "c", ["tea bag", "earl gray", "lipton"],
                                     description="Best tea made by Lipton"), goal) == 0
    assert option_matches(["pack of 12", "grey", "XL"], ["grey", "XL", "pack of 12"]) == 3
    assert option_matches(["pack of 12", "blue", "XL"], ["grey", "XL", "pack of 12"]) == 2
    assert option_matches(["pack of 12", "powder snow", "XL"], ["cool powder snow", "XL", "pack of 12"]) == 3
    assert option_matches(["goal 1"], []) == 0
    # thefuzz's rounding: 85.71 rounds to 86 > 85; colours reduce to their first colour word
    assert fuzzy_score("machine wash", "machine washable") == 86
    assert normalize_color("navy blue") == "blue" and normalize_color("wine red") == "red"


# spaCy's NOUN/PROPN tokens, as WebShop's get_type_reward keeps them, from en_core_web_sm 3.8.0
# (spaCy 3.8.18) run on each title: the reference for the model-free default.
SPACY_NOUNS = {
    "red leather handbag": ["leather", "handbag"],
    "red running shoes": ["running", "shoes"],
    "men's running shoes": ["men", "running", "shoes"],
    "blue denim jacket": ["denim", "jacket"],
    "wireless bluetooth headphones": ["wireless", "headphones"],
    "stainless steel water bottle": ["steel", "water", "bottle"],
    "organic green tea": ["tea"],
    "Women's Leather Handbag, Red": ["women", "leather", "handbag", "red"],
}


def test_default_title_rule_fails_the_wrong_type_as_webshop_does():
    # WebShop scores red running shoes bought for a red leather handbag 0.0 (no shared noun).
    goal = Goal(asin="X", instruction_text="", attributes=("red",), goal_options=(), price_upper=100.0,
                name="red leather handbag", query="handbag", product_category="Bags › Handbags › Totes")
    shoes = product("Y", "red running shoes", "shoes", "Shoes › Running › Road", ["red"], price=10.0)
    assert noun_terms("red leather handbag") == ["leather", "handbag"]
    assert type_score(shoes, goal)[0] == 0.0 and purchase_score(shoes, goal, 10.0, {}).total == 0.0
    assert type_score(shoes, goal, word_terms)[0] == 1.0  # the old "words" rule: "red" is 1/3 > 0.2


@pytest.mark.parametrize("goal_title", sorted(SPACY_NOUNS))
def test_default_title_rule_gives_spacys_r_type_on_reference_titles(goal_title):
    goal = Goal(asin="X", instruction_text="", attributes=(), goal_options=(), price_upper=1.0,
                name=goal_title, query="goal query", product_category="G1 › G2 › G3")
    for bought_title in SPACY_NOUNS:
        bought = product("Y", bought_title, "other query", "P1 › P2 › P3")
        expected = type_score(bought, goal, lambda title: SPACY_NOUNS[title])
        assert type_score(bought, goal) == expected, bought_title


def test_spacy_noun_mode_matches_the_reference_when_spacy_is_installed():
    spacy = pytest.importorskip("spacy")
    try:
        spacy.load("en_core_web_sm")
    except OSError:
        pytest.skip("en_core_web_sm is not installed")
    from envs.webshop_reward import spacy_noun_terms
    for title, nouns in SPACY_NOUNS.items():
        assert spacy_noun_terms(title) == nouns


@pytest.mark.parametrize("a, b, reference", [
    # thefuzz 0.22.1 token_set_ratio (force_ascii drops only chr(128)..chr(255)):
    ("łódź", "odz", 33),           # ł and ź are kept (outside Latin-1); ó is dropped
    ("café crème", "cafe creme", 89),
    ("naïve ☃ snow", "naive snow", 95),
    ("€ 5 coupon", "5 coupon", 100),
])
def test_fuzzy_score_drops_only_latin1_high_characters_as_thefuzz(a, b, reference):
    assert fuzzy_score(a, b) == reference


# --- the env on the tiny catalog -----------------------------------------------------------------

def test_buying_through_the_pages_pays_the_score_and_logs_it(tiny_catalog):
    assert WebShopConfig().reward_mode == "success"  # RAGEN-2's WebShop env: 1.0 if raw_reward >= 1.0 else 0.0
    env = tiny_env(tiny_catalog, reward_mode="score")
    obs, info = env.reset_to_goal(0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] i need long lasting")
    assert obs.endswith("You must choose from these actions: search[<content>].")
    obs, *_ = act(env, "search[lipstick]")
    assert "Page 1 (Total results: 2)" in obs and "click[b000000001]" in obs and "Next >" not in obs
    obs, reward, terminated, truncated, info = act(env, "click[b000000001]", "click[pink]", "click[buy now]")
    assert terminated and not truncated and reward == pytest.approx(0.75) and not info["success"]
    bought = info["action_infos"][0]
    assert bought["raw_score"] == pytest.approx(0.75) and bought["options"] == {"color": "pink"}
    assert obs == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 0.75"

    binary = tiny_env(tiny_catalog)  # the default
    binary.reset_to_goal(0)
    *_, info = act(binary, "search[lipstick]", "click[b000000001]", "click[pink]")
    _, reward, _, _, info = act(binary, "click[buy now]")
    assert reward == 0.0 and info["action_infos"][0]["raw_score"] == pytest.approx(0.75)
    binary.reset_to_goal(0)
    _, reward, terminated, _, info = act(binary, "search[lipstick]", "click[b000000001]", "click[red]",
                                         "click[buy now]")
    assert reward == 1.0 and terminated and info["success"]


def test_navigation_between_pages(tiny_catalog):
    env = tiny_env(tiny_catalog, results_per_page=1, max_search_results=5, max_actions_per_traj=20)
    env.reset_to_goal(0)
    obs, *_ = act(env, "search[lipstick]")
    # BM25: "lipstick" is in Lumiere's title and description, Velora's title only, so Lumiere leads
    assert [p.asin for p in env.results] == ["B000000002", "B000000001"]
    assert env.available_actions() == ("click[back to search]", "click[next >]", "click[b000000002]")
    obs, *_ = act(env, "click[next >]")
    assert "Page 2 (Total results: 2)" in obs and "click[b000000001]" in obs and "click[next >]" not in obs
    assert "click[< prev]" in obs
    obs, *_ = act(env, "click[< prev]")
    assert "Page 1 (Total results: 2)" in obs and "click[< prev]" not in obs
    act(env, "click[b000000002]", "click[plum]", "click[description]")
    assert env.page == "description" and "Lumiere lipstick with a matte finish." in env.render()
    obs, *_ = act(env, "click[< prev]")
    assert env.page == "item" and obs.count("You have clicked plum.") == 1  # options survive a sub-page
    act(env, "click[< prev]")
    assert (env.page, env.page_number, env.chosen_options) == ("results", 1, {})
    act(env, "click[back to search]")
    assert env.page == "search" and env.results == []


def test_invalid_actions_by_default_spend_an_action_and_do_nothing_as_in_ragen2(tiny_catalog):
    # RAGEN-2 passes every parsed piece to WebShop (no action lookup, so no format penalty):
    # one that cannot run leaves the page as it was and counts against the 9-action budget.
    env = tiny_env(tiny_catalog)
    obs, _ = env.reset_to_goal(0)
    for text in ("click[buy now]", "buy it"):
        next_obs, reward, terminated, _, info = env.step(format_response([text], think="t"))
        assert (next_obs, reward, terminated, info["format_penalty"]) == (obs, 0.0, False, 0.0)
        assert info["action_infos"][0]["action_is_valid"] is False
    assert env.actions_left == 7
    assert env.step("<think>t</think><answer></answer>")[1] == env.config.format_penalty  # no action at all
    with pytest.raises(envs.EnvConfigError, match=r"invalid_actions must be one of \['noop', 'drop'\]"):
        tiny_env(tiny_catalog, invalid_actions="ignore")


def test_parser_keeps_only_actions_of_the_current_page(tiny_catalog):
    env = tiny_env(tiny_catalog, invalid_actions="drop")
    env.reset_to_goal(0)
    parsed = env.parse(format_response(["SEARCH[  Red   Lipstick ]"], think="t"))
    assert parsed.actions == ("search[red lipstick]",)
    for text, reason in (("click[buy now]", "not clickable on the search page"), ("buy it", "not search[...]"),
                         ("search[", "never closed"), ("search[   ]", "is empty"),
                         ("search[" + "x" * 501 + "]", "longer than 500")):
        parsed = env.parse(format_response([text], think="t"))
        assert parsed.actions == () and parsed.error == "no valid action" and reason in parsed.dropped[0].reason
    _, reward, _, _, info = env.step("<think>t</think><answer>click[b000000001]</answer>")
    assert reward == env.config.format_penalty and not info["action_is_valid"] and env.actions_left == 9
    act(env, "search[lipstick]")
    parsed = env.parse(format_response(["search[mug]"], think="t"))
    assert parsed.actions == () and "no search box on the results page" in parsed.dropped[0].reason
    assert env.parse(format_response(["Click[B000000001]"], think="t")).actions == ("click[b000000001]",)


def test_several_actions_per_turn_run_in_order_and_stale_ones_do_nothing(tiny_catalog):
    env = tiny_env(tiny_catalog, max_actions_per_turn=3)
    env.reset_to_goal(0)
    act(env, "search[lipstick]")
    _, _, _, _, info = env.step(format_response(["click[b000000001]", "click[back to search]"], think="t"))
    assert env.page == "search" and info["actions_executed"] == ["click[b000000001]", "click[back to search]"]
    act(env, "search[lipstick]", "click[b000000001]")
    _, reward, terminated, _, info = env.step(format_response(["click[red]", "click[buy now]"], think="t"))
    assert terminated and reward == 1.0 and info["success"]
    env.reset_to_goal(0)
    act(env, "search[lipstick]")
    _, _, _, _, info = env.step(format_response(["click[b000000001]", "click[b000000002]"], think="t"))
    assert env.product.asin == "B000000001" and env.actions_left == 6
    assert info["action_infos"][1] == {"page": "item", "action_is_effective": False, "action_is_valid": False,
                                       "reason": "'b000000002' is not clickable on the item page"}


def test_search_is_bm25_over_title_description_and_options(tiny_catalog):
    assert [p.asin for p in tiny_catalog.search("ceramic mug", 10)] == ["B000000003"]
    assert tiny_catalog.search("zzz qqq", 10) == []
    env = tiny_env(tiny_catalog)
    env.reset_to_goal(0)
    obs, *_ = act(env, "search[zzz qqq]")
    assert "Total results: 0" in obs and env.available_actions() == ("click[back to search]",)


def test_config_errors_are_specific():
    for overrides, message in (({"split": "dev"}, "split must be one of"),
                               ({"reward_mode": "dense"}, "reward_mode must be one of"),
                               ({"results_per_page": 0}, "results_per_page must be >= 1"),
                               ({"max_search_results": 5}, "max_search_results (5) must be >="),
                               ({"results_per_page": 2.5}, "results_per_page must be int"),
                               ({"attributes_file": "x.json"}, "need products_file"),
                               ({"products_file": "/nonexistent/items.json", "human_goals_file": "h.json"},
                                "/nonexistent/items.json not found")):
        with pytest.raises(envs.EnvConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            envs.make("webshop", **overrides)


# --- the shipped catalog -------------------------------------------------------------------------

def test_shipped_env_passes_the_checker_and_seeds_pick_goals():
    envs.check_env(lambda: envs.make("webshop"))
    env = envs.make("webshop")
    assert env.config.max_actions_per_traj == 9 and env.config.max_actions_per_turn == 1
    assert env.reset(seed=5)[1]["goal_index"] == envs.make("webshop").reset(seed=5)[1]["goal_index"]
    assert len({env.reset(seed=s)[1]["goal_index"] for s in range(30)}) > 10
    test_env = envs.make("webshop", split="test")
    assert {g.split for g in test_env.goals} == {"test"} and len(test_env.goals) >= 30


def test_shipped_catalog_size_and_shape():
    catalog = envs.make("webshop", split="all").catalog
    assert len(catalog.products) >= 300 and len(catalog.goals) >= 100
    assert len({p.category for p in catalog.products}) >= 6
    assert all(p.attributes and p.options and p.price > 0 for p in catalog.products)
    for goal in catalog.goals:
        target = catalog.by_asin[goal.asin]
        assert set(goal.attributes) <= set(target.attributes) and goal.price_upper > target.price
        assert goal.price_upper in PRICE_STEPS and goal.instruction_text.endswith(f"{goal.price_upper:.2f} dollars")


def test_the_expert_buys_every_shipped_goal_at_full_score_within_the_budget():
    env = envs.make("webshop", split="all")
    for index in range(len(env.goals)):
        env.reset_to_goal(index)
        for _ in range(env.config.max_actions_per_traj):
            _, reward, terminated, truncated, info = env.step(format_response([expert_action(env)], think="x"))
            if terminated or truncated:
                break
        assert terminated and info["success"] and reward == 1.0, (index, env.goals[index].instruction_text)


def test_a_wrong_colour_on_a_shipped_goal_costs_one_option():
    env = envs.make("webshop", split="all", reward_mode="score")
    index, goal = next((i, g) for i, g in enumerate(env.goals) if "color" in env.catalog.by_asin[g.asin].options)
    target = env.catalog.by_asin[goal.asin]
    wanted = next(v for v in goal.goal_options if v in target.options["color"])
    wrong = next(v for v in target.options["color"]
                 if fuzzy_score(normalize_color(v), normalize_color(wanted)) <= 85)
    env.reset_to_goal(index)
    act(env, expert_action(env))  # the expert's search
    while goal.asin.lower() not in env.clickables():
        act(env, "click[next >]")
    others = [v for v in goal.goal_options if v != wanted]
    _, reward, terminated, _, info = act(env, f"click[{goal.asin.lower()}]", f"click[{wrong}]",
                                         *(f"click[{v}]" for v in others), "click[buy now]")
    n_att, n_opt = len(goal.attributes), len(goal.goal_options)
    assert terminated and not info["success"]
    assert reward == pytest.approx((n_att + n_opt - 1 + 1) / (n_att + n_opt + 1))


def test_the_generator_reproduces_the_shipped_files(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_webshop_catalog
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    make_webshop_catalog.main(["--out", str(tmp_path)])
    assert (tmp_path / "webshop_products.jsonl").read_bytes() == SHIPPED_PRODUCTS.read_bytes()
    assert (tmp_path / "webshop_goals.jsonl").read_bytes() == SHIPPED_GOALS.read_bytes()


# --- the original WebShop files --------------------------------------------------------------------

def _raw(asin, name, query, pricing, options=None, **extra):
    return {"asin": asin, "name": name, "category": "fashion", "query": query,
            "product_category": "Clothing › Men › Jackets",
            "full_description": f"{name}, described.", "small_description": ["Packable hood", "Taped seams"],
            "pricing": pricing, "images": ["x.jpg"], "customization_options": options, "brand": "Acme", **extra}


@pytest.fixture()
def original_files(tmp_path):
    products = [
        _raw("B0TESTAAA1", "Acme Rain Jacket Waterproof", "rain jacket", "$40.00 to $60.00",
             {"Color": [{"value": "Navy/Blue", "image": None}, {"value": " Black ", "image": None},
                        {"value": "Grey / Green", "image": None}],
              "Size": [{"value": "Large", "image": None}]}),
        _raw("B0TESTAAA2", "Acme Compact Umbrella", "umbrella", "$12.99"),
        _raw("B0TESTAAA2", "a duplicate, skipped", "umbrella", "$1.00"),
        _raw("nan", "no asin, skipped", "x", "$1.00"),
        _raw("B0TESTAAA3", "Acme Poncho", "poncho", ""),
    ]
    attributes = {"B0TESTAAA1": {"attributes": ["waterproof", "packable hood"],
                                 "instruction": "Find me waterproof rain jacket",
                                 "instruction_attributes": ["waterproof"]},
                  "B0TESTAAA2": {"attributes": []}}
    human = {"B0TESTAAA1": [{"asin": "B0TESTAAA1", "instruction": "i need a waterproof rain jacket in navy blue.",
                             "instruction_attributes": ["waterproof"], "instruction_options": ["navy | blue", "large"]},
                            {"asin": "B0TESTAAA1", "instruction": "skipped: no attributes",
                             "instruction_attributes": [], "instruction_options": []}],
             "B0TESTAAA2": [{"asin": "B0TESTAAA2", "instruction": "i want a compact umbrella",
                             "instruction_attributes": ["compact"], "instruction_options": []}]}
    paths = {}
    for name, data in (("items_shuffle_test.json", products), ("items_ins_v2_test.json", attributes),
                       ("items_human_ins.json", human)):
        paths[name] = tmp_path / name
        paths[name].write_text(json.dumps(data))
    return paths


def test_loader_reads_webshops_product_schema(original_files):
    catalog = load_original_catalog(original_files["items_shuffle_test.json"], original_files["items_ins_v2_test.json"],
                                    original_files["items_human_ins.json"])
    assert [p.asin for p in catalog.products] == ["B0TESTAAA1", "B0TESTAAA2", "B0TESTAAA3"]
    jacket, umbrella, poncho = catalog.products
    assert jacket.options == {"color": ("navy | blue", "black", "grey | green"), "size": ("large",)}
    assert jacket.pricing == (40.0, 60.0) and 40.0 <= jacket.price <= 60.0 and jacket.price_tag == "$40.00 to $60.00"
    assert jacket.attributes == ("waterproof", "packable hood") and jacket.bullet_points[0] == "Packable hood"
    assert umbrella.price == 12.99 and umbrella.options == {} and poncho.pricing == (100.0,) and poncho.attributes == ()
    again = load_original_catalog(original_files["items_shuffle_test.json"], original_files["items_ins_v2_test.json"],
                                  original_files["items_human_ins.json"])
    assert again.products == catalog.products and again.goals == catalog.goals  # seeded draws
    assert parse_pricing(["$3.50", "$4"]) == (3.5, 4.0) and parse_pricing(None) == (100.0,)


def test_loader_builds_human_and_synthetic_goals(original_files):
    catalog = load_original_catalog(original_files["items_shuffle_test.json"], original_files["items_ins_v2_test.json"],
                                    original_files["items_human_ins.json"])
    by_asin = {g.asin: g for g in catalog.goals}
    assert len(catalog.goals) == 2 and {g.split for g in catalog.goals} == {"test"}  # under 500: all test (RAGEN)
    jacket_goal = by_asin["B0TESTAAA1"]
    assert jacket_goal.instruction_text.startswith(
        "i need a waterproof rain jacket in navy blue, and price lower than ")
    assert jacket_goal.goal_options == ("navy | blue", "large") and jacket_goal.name == "Acme Rain Jacket Waterproof"
    jacket = catalog.by_asin["B0TESTAAA1"]
    assert jacket_goal.price_upper in [s for s in PRICE_STEPS if s > jacket.price][1:4]
    synthetic = load_original_catalog(original_files["items_shuffle_test.json"],
                                      original_files["items_ins_v2_test.json"])
    assert sorted(g.instruction_text.split(", and price")[0] for g in synthetic.goals) == [
        "Find me waterproof rain jacket with color: black, and size: large",
        "Find me waterproof rain jacket with color: grey | green, and size: large",
        "Find me waterproof rain jacket with color: navy | blue, and size: large"]


def test_env_plays_the_original_files(original_files):
    env = envs.make("webshop", products_file=str(original_files["items_shuffle_test.json"]),
                    attributes_file=str(original_files["items_ins_v2_test.json"]),
                    human_goals_file=str(original_files["items_human_ins.json"]), split="test")
    index = next(i for i, g in enumerate(env.goals) if g.asin == "B0TESTAAA1")
    env.reset_to_goal(index)
    actions = []
    for _ in range(9):
        actions.append(expert_action(env))
        _, reward, terminated, truncated, info = act(env, actions[-1])
        if terminated or truncated:
            break
    assert actions[1:] == ["click[b0testaaa1]", "click[navy | blue]", "click[large]", "click[buy now]"]
    assert reward == 1.0 and info["success"]


def test_loader_errors_name_the_problem(original_files, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not JSON"):
        load_original_catalog(bad, human_goals_file=original_files["items_human_ins.json"])
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_original_catalog(original_files["items_human_ins.json"],
                              human_goals_file=original_files["items_human_ins.json"])
    with pytest.raises(ValueError, match="need attributes_file"):
        load_original_catalog(original_files["items_shuffle_test.json"])
    with pytest.raises(envs.EnvConfigError, match="split 'train' has no goals"):
        envs.make("webshop", products_file=str(original_files["items_shuffle_test.json"]),
                  human_goals_file=str(original_files["items_human_ins.json"]))


def test_price_limit_is_drawn_as_webshop_draws_it():
    rng = random.Random(0)
    uppers = {draw_price_upper(17.5, rng) for _ in range(200)}
    assert uppers == {30.0, 40.0, 50.0}          # the larger of two of 20, 30, 40, 50
    assert draw_price_upper(985.0, rng) is None  # fewer than two steps above: no limit


def test_canonical_action():
    assert canonical_action("  Click[ Buy   Now ] ") == ("click", "buy now")
    assert canonical_action("search[a]b]") == ("search", "a]b")
    assert isinstance(canonical_action("click[]"), str) and isinstance(canonical_action("jump[x]"), str)
    assert np.isfinite(envs.make("webshop").reset(seed=1)[1]["goal_index"])
