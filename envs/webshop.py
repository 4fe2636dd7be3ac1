"""WebShop: buy the product an instruction describes, by searching and clicking (RAGEN's WebShop).

Pages and what can be done on them (WebShop's text mode; RAGEN lists the choices):

    search       search[<keywords>]
    results      click[back to search], click[< prev], click[next >], click[<product id>]
    item         click[back to search], click[< prev], click[description], click[features],
                 click[<option value>] (size, colour, …), click[buy now]
    description  click[back to search], click[< prev]     (features likewise)

Each observation is the page in WebShop's " [SEP] "-joined text, then "You must choose from
these actions: …". Buying ends the episode; WebShop's score (`envs.webshop_reward`) decides
the reward: by default RAGEN-2's, 1 for a full score else 0 (`reward_mode="success"`);
`reward_mode="score"` pays the score itself, a denser signal. Success is a full score. Defaults are RAGEN-2's: 9 actions per trajectory, 1 per turn.

Parsing: `<answer>` pieces must be `search[…]` (only on a page with a search box) or
`click[x]` with x on the current page, matched ignoring case and runs of spaces. Anything
else, by default (`invalid_actions="noop"`, RAGEN-2's), goes to the shop as WebShop does
with it: it does nothing, spends an action and gets no format penalty (RAGEN-2 penalises
only a turn with no action at all). `invalid_actions="drop"` drops it with a reason before
the shop, so it spends nothing, and the turn gets the format penalty.
With several actions per turn each must be on the page the model saw; one that the earlier
actions made unavailable does nothing but still spends an action (WebShop's no-op).

Departures from WebShop's page text, for a text-only agent: the item page says which
options are chosen ("You have clicked red."), and there is no Reviews or Rating (WebShop's
review data is not loaded either). Deliberately the same: search sees title, description,
first bullet point and options, not the attributes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs.parsing import ACTION_SEPARATOR, MAX_DROPPED_RECORDED, DroppedAction, ParsedResponse, parse_response
from envs import ragen_text
from envs.registry import register
from envs.webshop_catalog import SPLITS, Catalog, Goal, Product, WebShopDataError, get_catalog
from envs.webshop_reward import TITLE_MATCH_MODES, fuzzy_score, purchase_score, title_terms_for

SEARCH, RESULTS, ITEM, DESCRIPTION, FEATURES, DONE = "search", "results", "item", "description", "features", "done"
BACK_TO_SEARCH, PREV_PAGE, NEXT_PAGE, BUY_NOW = "back to search", "< prev", "next >", "buy now"
SUB_PAGES = (DESCRIPTION, FEATURES)
SEARCH_PLACEHOLDER = "search[<content>]"
MAX_QUERY_CHARS = 500  # a longer query is not a search a shopper types; it would only slow BM25
SEP = " [SEP] "
REWARD_MODES = ("score", "success")
INVALID_ACTION_MODES = ("noop", "drop")
FULL_SCORE = 1.0 - 1e-9
_SPACES = re.compile(r"\s+")

INSTRUCTION = (
    "You are shopping in an online store. Buy the product the instruction on the page asks for: search "
    "for it, read the results, open a product, choose its options (such as size and color) one click at "
    "a time, and buy it. Valid answers are search[<keywords>] or click[<one of the listed clickables>]; "
    "choose only from the actions listed under each page. For example, for 'i need a gingko light 20x20 "
    "pillow cover that is hand painted' start with <answer>search[gingko light pillow cover hand painted]"
    "</answer>. Leave out size, color and price from the search: choose those on the product page. "
    "You have {budget} actions in all; a product bought close to the instruction is better than none, "
    "so click[buy now] before they run out."
)


@dataclass(frozen=True)
class WebShopConfig(EnvConfig):
    max_actions_per_turn: int = 1   # RAGEN-2's WebShop setting
    max_actions_per_traj: int = 9
    split: str = "train"             # which goals instances draw from: all | train | val | test
    reward_mode: str = "success"     # success (RAGEN-2): 1 for a full score else 0; score: WebShop's score in [0, 1]
    results_per_page: int = 10       # WebShop's PRODUCT_WINDOW
    max_search_results: int = 50     # WebShop's SEARCH_RETURN_N
    title_match: str = "nouns"       # title terms of the type match: nouns | words | spacy_nouns (WebShop's)
    # noop (RAGEN-2): an action that cannot run on the page goes to the shop, does nothing and
    # spends an action, without the format penalty; drop: it is dropped before the shop and
    # the turn gets the format penalty (ours: the budget goes only to actions that can act).
    invalid_actions: str = "noop"
    # The original WebShop data, when the user has it (empty: the shipped catalog).
    products_file: str = ""          # items_shuffle*.json
    attributes_file: str = ""        # items_ins_v2*.json: product attributes, synthetic goals
    human_goals_file: str = ""       # items_human_ins.json: human goals (used when given)
    num_products: int = 0            # first N products only (0: all), as WebShop's num_products

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("results_per_page", "max_search_results", "num_products"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise EnvConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        for name in ("split", "reward_mode", "title_match", "invalid_actions", "products_file", "attributes_file",
                     "human_goals_file"):
            if not isinstance(getattr(self, name), str):
                raise EnvConfigError(f"{name} must be a str, got {getattr(self, name)!r}")
        for name, allowed in (("split", SPLITS), ("reward_mode", REWARD_MODES),
                              ("title_match", TITLE_MATCH_MODES), ("invalid_actions", INVALID_ACTION_MODES)):
            if getattr(self, name) not in allowed:
                raise EnvConfigError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.results_per_page < 1:
            raise EnvConfigError(f"results_per_page must be >= 1, got {self.results_per_page}")
        if self.max_search_results < self.results_per_page:
            raise EnvConfigError(f"max_search_results ({self.max_search_results}) must be >= "
                                 f"results_per_page ({self.results_per_page})")
        if self.num_products < 0:
            raise EnvConfigError(f"num_products must be >= 0 (0: all), got {self.num_products}")
        if not self.products_file and (self.attributes_file or self.human_goals_file or self.num_products):
            raise EnvConfigError("attributes_file, human_goals_file and num_products need products_file "
                                 "(the original WebShop items_shuffle*.json)")


def canonical_action(text: str) -> tuple[str, str] | str:
    """`search[x]` / `click[x]` → (verb, argument in lower case with single spaces), or why not."""
    text = text.strip()
    lowered = text.lower()
    for verb in ("search", "click"):
        if lowered.startswith(verb + "["):
            if not lowered.endswith("]"):
                return f"{verb}[ is never closed with ]"
            argument = _SPACES.sub(" ", lowered[len(verb) + 1:-1]).strip()
            if not argument:
                return f"{verb}[] is empty"
            return verb, argument
    return "not search[...] or click[...]"


class WebShopEnv(TextEnv):
    config_cls = WebShopConfig

    def __init__(self, config: WebShopConfig | None = None, catalog: Catalog | None = None):
        super().__init__(config)
        config = self.config
        try:
            self.catalog = catalog if catalog is not None else get_catalog(
                config.products_file, config.attributes_file, config.human_goals_file, config.num_products)
            self.goals = self.catalog.goals_in(config.split)
        except WebShopDataError as error:
            raise EnvConfigError(f"webshop data: {error}") from None
        self._title_terms = title_terms_for(config.title_match)
        try:  # a missing rapidfuzz or spaCy model fails here, not at the first purchase
            fuzzy_score("a", "a")
            self._title_terms("load the tagger now")
        except RuntimeError as error:
            raise EnvConfigError(str(error)) from None
        self._goal_override: int | None = None
        self.goal: Goal | None = None
        self.goal_index = -1
        self._to_search_page()

    # --- state ------------------------------------------------------------------------------

    def _to_search_page(self) -> None:
        self.page = SEARCH
        self.results: list[Product] = []
        self.page_number = 1
        self.product: Product | None = None
        self.chosen_options: dict[str, str] = {}
        self.purchase: dict | None = None

    def _reset(self, rng: np.random.Generator) -> dict:
        if self._goal_override is not None:
            self.goal_index = self._goal_override
        else:
            self.goal_index = int(rng.integers(len(self.goals)))
        self.goal = self.goals[self.goal_index]
        self._to_search_page()
        return {"goal_index": self.goal_index, "target_asin": self.goal.asin, "instruction": self.goal.instruction_text}

    def reset_to_goal(self, goal_index: int, seed: int = 0) -> tuple[str, dict]:
        """Start an episode on goal `goal_index` of this config's split (tests, evaluation sweeps)."""
        if isinstance(goal_index, bool) or not isinstance(goal_index, (int, np.integer)) \
                or not 0 <= goal_index < len(self.goals):
            raise EnvConfigError(f"goal_index must be in [0, {len(self.goals)}), got {goal_index!r}")
        self._goal_override = int(goal_index)
        try:
            return self.reset(seed=seed)
        finally:
            self._goal_override = None

    # --- what can be done here --------------------------------------------------------------

    def _page_results(self) -> list[Product]:
        start = (self.page_number - 1) * self.config.results_per_page
        return self.results[start:start + self.config.results_per_page]

    def clickables(self) -> dict[str, tuple]:
        """Lower-case clickable text → what it does, in page order."""
        if self.page == RESULTS:
            found = {BACK_TO_SEARCH: ("back",)}
            if self.page_number > 1:
                found[PREV_PAGE] = ("prev",)
            if self.page_number * self.config.results_per_page < len(self.results):
                found[NEXT_PAGE] = ("next",)
            for product in self._page_results():
                found.setdefault(product.asin.lower(), ("product", product))
            return found
        if self.page == ITEM:
            found = {BACK_TO_SEARCH: ("back",), PREV_PAGE: ("prev",), DESCRIPTION: ("sub",), FEATURES: ("sub",)}
            for name, values in self.product.options.items():
                for value in values:
                    found.setdefault(value, ("option", name))  # a button of the same name wins
            found[BUY_NOW] = ("buy",)
            return found
        if self.page in SUB_PAGES:
            return {BACK_TO_SEARCH: ("back",), PREV_PAGE: ("prev",)}
        return {}

    def available_actions(self) -> tuple[str, ...]:
        actions = [SEARCH_PLACEHOLDER] if self.page == SEARCH else []
        return tuple(actions + [f"click[{text}]" for text in self.clickables()])

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        """The current page's actions; `search[<content>]` stands for any search."""
        return self.available_actions() or (f"click[{BACK_TO_SEARCH}]",)

    def _why_unavailable(self, verb: str, argument: str) -> str | None:
        if verb == "search":
            if self.page != SEARCH:
                return f"no search box on the {self.page} page (click[{BACK_TO_SEARCH}] first)"
            if len(argument) > MAX_QUERY_CHARS:
                return f"search query longer than {MAX_QUERY_CHARS} characters"
            return None
        if argument not in self.clickables():
            return f"'{argument}' is not clickable on the {self.page} page"
        return None

    def parse(self, response: str) -> ParsedResponse:
        parsed = parse_response(response, vocabulary=None, max_actions=self.config.max_actions_per_turn,
                                require_think=self.config.require_think)
        if not parsed.actions:
            return parsed
        actions, dropped = [], list(parsed.dropped)
        for piece in parsed.actions:
            found = canonical_action(piece)
            reason = found if isinstance(found, str) else self._why_unavailable(*found)
            if reason is None:
                actions.append(f"{found[0]}[{found[1]}]")
            elif self.config.invalid_actions == "noop":
                actions.append(piece.strip())  # _apply_action turns it into a no-op
            else:
                dropped.append(DroppedAction(piece, reason))
        num_dropped = parsed.num_dropped + len(parsed.actions) - len(actions)
        return ParsedResponse(format_ok=True, think=parsed.think, answer=parsed.answer, actions=tuple(actions),
                              dropped=tuple(dropped[:MAX_DROPPED_RECORDED]), num_dropped=num_dropped,
                              num_invalid=parsed.num_invalid + len(parsed.actions) - len(actions),
                              error=None if actions else "no valid action")

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random action of this page; a search uses one of the catalog's product queries."""
        actions = self.action_vocabulary
        action = actions[int(rng.integers(len(actions)))]
        if action == SEARCH_PLACEHOLDER:
            query = self.catalog.queries[int(rng.integers(len(self.catalog.queries)))] if self.catalog.queries \
                else "product"
            action = f"search[{_SPACES.sub(' ', query.replace(ACTION_SEPARATOR, ' ')).strip()}]"
        return action

    # --- acting -----------------------------------------------------------------------------

    def _apply_action(self, action: str) -> ActionOutcome:
        found = canonical_action(action)
        reason = found if isinstance(found, str) else self._why_unavailable(*found)
        if reason is not None:  # invalid (invalid_actions="noop"), or an earlier action changed the page
            return ActionOutcome(reward=0.0, info={"page": self.page, "action_is_effective": False,
                                                   "action_is_valid": False, "reason": reason})
        verb, argument = found
        if verb == "search":
            self.results = self.catalog.search(argument, self.config.max_search_results)
            self.page, self.page_number = RESULTS, 1
            return ActionOutcome(reward=0.0, info={"page": self.page, "action_is_effective": True})
        kind = self.clickables()[argument]
        if kind[0] == "buy":
            return self._buy()
        if kind[0] == "back":
            self._to_search_page()
        elif kind[0] == "next":
            self.page_number += 1
        elif kind[0] == "prev":
            if self.page == RESULTS:
                self.page_number -= 1
            elif self.page == ITEM:  # WebShop re-renders the results, which clears the options
                self.page, self.product, self.chosen_options = RESULTS, None, {}
            else:
                self.page = ITEM
        elif kind[0] == "product":
            self.page, self.product, self.chosen_options = ITEM, kind[1], {}
        elif kind[0] == "option":
            self.chosen_options[kind[1]] = argument
        elif kind[0] == "sub":
            self.page = argument
        return ActionOutcome(reward=0.0, info={"page": self.page, "action_is_effective": True})

    def _buy(self) -> ActionOutcome:
        product, goal = self.product, self.goal
        score = purchase_score(product, goal, product.price, self.chosen_options, self._title_terms)
        success = score.total >= FULL_SCORE
        reward = score.total if self.config.reward_mode == "score" else float(success)
        self.page = DONE
        self.purchase = {"asin": product.asin, "options": dict(self.chosen_options), "price": product.price,
                         "score": score.total}
        info = {"page": DONE, "action_is_effective": True, "raw_score": score.total, "score_parts": score.to_info(),
                "purchased_asin": product.asin, "target_asin": goal.asin, "options": dict(self.chosen_options)}
        return ActionOutcome(reward=reward, terminated=True, success=success, info=info)

    # --- observation ------------------------------------------------------------------------

    @property
    def ragen_instruction(self) -> str:
        return ragen_text.WEBSHOP

    @property
    def ragen_max_words(self) -> int:
        return ragen_text.WEBSHOP_MAX_TOKENS

    @property
    def instruction(self) -> str:
        return INSTRUCTION.format(budget=self.config.max_actions_per_traj)

    def render_page(self) -> str:
        """The page as WebShop's text observation (" [SEP] "-joined visible text)."""
        instruction = self.goal.instruction_text
        if self.page == SEARCH:
            return SEP.join(("WebShop", "Instruction:", instruction, "Search"))
        head = ["Instruction:", instruction, "Back to Search"]
        if self.page == RESULTS:
            parts = head + [f"Page {self.page_number} (Total results: {len(self.results)})"]
            if self.page_number > 1:
                parts.append("< Prev")
            if NEXT_PAGE in self.clickables():
                parts.append("Next >")
            for product in self._page_results():
                parts += [product.asin, product.title, product.price_tag]
            return SEP.join(parts)
        if self.page == ITEM:
            parts = head + ["< Prev"]
            for name, values in self.product.options.items():
                parts += [name, *values]
            parts += [self.product.title, f"Price: {self.product.price_tag}", "Description", "Features", "Buy Now"]
            text = SEP.join(parts)
            if self.chosen_options:
                text += SEP + " ".join(f"You have clicked {v}." for v in self.chosen_options.values())
            return text
        if self.page == DESCRIPTION:
            return SEP.join(head + ["< Prev", self.product.description or "(no description)"])
        if self.page == FEATURES:
            return SEP.join(head + ["< Prev", *(self.product.bullet_points or ("(no features)",))])
        score = self.purchase["score"]
        return SEP.join(("Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{score:.2f}"))

    def render(self) -> str:
        if self.goal is None:
            return "(no goal: call reset() first)"
        text = self.render_page()
        actions = self.available_actions()
        if actions:
            text += "\nYou must choose from these actions: " + ", ".join(actions) + "."
        return text


def expert_action(env: WebShopEnv) -> str:
    """The scripted expert's next action: search the instruction, open the target, choose the
    goal's options, buy. It only reads the goal, never the score; tests use it to show every
    shipped goal is reachable at full score within the budget."""
    goal, clickables = env.goal, env.clickables()
    target = goal.asin.lower()
    if env.page == SEARCH:
        return f"search[{_SPACES.sub(' ', goal.search_text.lower()).strip()}]"
    if env.page == RESULTS:
        for option in (target, NEXT_PAGE, BACK_TO_SEARCH):
            if option in clickables:
                return f"click[{option}]"
    if env.page == ITEM:
        if env.product.asin.lower() != target:
            return f"click[{PREV_PAGE}]"
        chosen = set(env.chosen_options.values())
        for value in goal.goal_options:
            if value not in chosen and clickables.get(value, ("",))[0] == "option":
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"
    return f"click[{PREV_PAGE}]"


register("webshop", WebShopEnv, WebShopConfig(),
         "WebShop: search, open, choose options and buy what an instruction asks; our shipped catalog "
         "or the original data (RAGEN WebShop, 9 actions)")
