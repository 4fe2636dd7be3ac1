"""SearchQA: answer a multi-hop question by searching paragraphs, HotpotQA style.

Each turn is one action: `search[query]` shows the top-k paragraphs (titles and text,
clipped to a character budget) for the query; `finish[answer]` submits an answer and ends
the episode. Any other piece in the answer tags is, by default (`free_text="answer"`, as
RAGEN-2's Search env), a final answer: `free_text_answer` extracts it (RAGEN-2's rllm
heuristics) and it is scored like `finish`; `free_text="drop"` drops it with a reason and
the turn gets the format penalty. Reward: 1 for an exact match after SQuAD normalisation,
else the token F1 when it reaches `f1_threshold` (0.3), else 0; success = reward > 0
(`success_rule="positive_reward"`, RAGEN-2's) or exact match only (`"exact_match"`).
Running out of actions (10 by default) truncates with reward 0.

Retrieval (envs/retrieval.py): BM25 over the question's own context paragraphs
(HotpotQA's distractor setting gives ten: two gold, eight distractors), or over a corpus
file (JSONL of {title, text}) when `corpus_path` is set.

Questions (config `source`):
- `builtin` (default): 43 invented two-hop questions shipped in envs/data/ in HotpotQA's
  schema (see envs/data/searchqa_README.md), so the env works with no network.
- `file`: a JSONL file of HotpotQA rows, or a JSON array such as hotpot_dev_distractor_v1.json.
- `hub`: `datasets.load_dataset(hub_id, hub_config, split=split)`, imported only when used.
Loaded questions are cached per source behind a lock and shared by every env copy
(envs/searchqa_questions.py).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs.parsing import (
    ACTION_SEPARATOR, ANSWER_CLOSE, MAX_DROPPED_RECORDED, DroppedAction, ParsedResponse, parse_response,
)
from envs import ragen_text
from envs.registry import register
from envs.retrieval import RETRIEVER_KINDS, Passage, Retriever, corpus_retriever, make_retriever, tokenize
from envs.data_files import SourceCache, file_version
from envs.searchqa_questions import (
    BUILTIN_PATH, MultiHopQuestion, QADatasetError, load_hub_questions, read_question_file,
)

SOURCES = ("builtin", "file", "hub")
# A piece that is not search[…]/finish[…]. answer (RAGEN-2): strict search[/finish[ prefixes,
# anything else is a final answer read out of the text; drop (ours): case- and space-lenient
# verbs, anything else dropped and the turn penalised (the model is held to the format taught).
FREE_TEXT = ("answer", "drop")
# positive_reward (RAGEN-2: `exact_match or reward > 0`): an F1 >= threshold answer succeeds;
# exact_match: only an exact match does.
SUCCESS_RULES = ("positive_reward", "exact_match")
MAX_ECHO_CHARS = 200  # how much of a query or answer the observation repeats back

# --- SQuAD answer normalisation and scores -------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)  # one C pass, not a Python loop per character
# HotpotQA's evaluation scores these only by exact match: "no" must not half-match "no idea".
_YES_NO = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, drop punctuation, drop articles, squash whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def answer_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between the normalised answers (HotpotQA's yes/no rule included)."""
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    if not pred_tokens or not gold_tokens:  # SQuAD v2's rule: empty matches only empty
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    # = 2PR/(P+R) with P = overlap/|pred|, R = overlap/|gold|; one division keeps 0.3 exactly 0.3
    return 2 * overlap / (len(pred_tokens) + len(gold_tokens))


def answer_reward(prediction: str, gold: str, f1_threshold: float = 0.3) -> tuple[float, bool, float]:
    """(reward, exact match, F1): 1 for a match, else F1 if F1 >= threshold, else 0."""
    em, f1 = exact_match(prediction, gold), answer_f1(prediction, gold)
    reward = 1.0 if em else (f1 if f1 >= f1_threshold else 0.0)
    return reward, em, f1


# --- actions --------------------------------------------------------------------------

_ACTION = re.compile(r"(search|finish)\s*+\[(.*)\]", re.IGNORECASE | re.DOTALL)  # fullmatch only: one start


# RAGEN-2's Search env (from rllm) reads an answer out of free text in this order. Its
# `<think>.*?</think>`, `\\boxed\{([^}]+)\}` and `^\W+|\W+$` are quadratic on model output (every
# unclosed `<think>` or `\boxed{`, every position of a non-word run, rescans to the end): those
# three are str.find / anchored scans below with the same results. The rest are linear: a run is
# possessive where the next piece cannot match its class (so no match changes), and each start's
# scan stops at the next `*` or at the first match.
_BOLD = (re.compile(r"\*\*([^*]++)\*\*"), re.compile(r"\*([^*]++)\*"))
_STATED = (re.compile(r"(?:the\s++)?(?:correct\s++)?answer\s++is\s*:?\s*([^.!?]++)", re.IGNORECASE),
           re.compile(r"(?:therefore|thus|so|hence)\s*,?\s*([^.!?]++)", re.IGNORECASE))  # no \b: "also" counts
_NON_WORD_RUN = re.compile(r"\W*+")


def _drop_think_blocks(text: str) -> str:
    """re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL), in one pass."""
    kept, at = [], 0
    while (start := text.find("<think>", at)) >= 0 and (end := text.find("</think>", start + 7)) >= 0:
        kept.append(text[at:start])
        at = end + 8
    return "".join(kept) + text[at:]


def _boxed(text: str) -> str | None:
    r"""Group 1 of re.search(r"\\boxed\{([^}]+)\}", text): the first non-empty \boxed{…} body."""
    start = text.find("\\boxed{")
    while start >= 0:
        close = text.find("}", start + 7)
        if close < 0:  # no later start can close either
            return None
        if close > start + 7:
            return text[start + 7:close]
        start = text.find("\\boxed{", start + 1)
    return None


def _strip_non_word(text: str) -> str:
    r"""re.sub(r"^\W+|\W+$", "", text) for text without a trailing newline (ours is stripped)."""
    head = _NON_WORD_RUN.match(text).end()
    tail = _NON_WORD_RUN.match(text[::-1]).end()
    return text[head:len(text) - tail] if head < len(text) else ""


def free_text_answer(text: str) -> str:
    """The answer in text that is not `finish[…]`: \\boxed{…}, else bold, else "the answer is …" /
    "so …" (over 3 characters), else the first sentence over 5 characters, else the first 100."""
    text = re.sub(r"\s+", " ", _drop_think_blocks(text.strip())).strip()
    if not text:
        return ""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed.strip()
    for pattern in _BOLD:
        found = [m.strip() for m in pattern.findall(text) if len(m.strip()) > 2 and not re.match(r"[^\w]*+$", m.strip())]
        if found:
            return found[0]
    for pattern in _STATED:
        match = pattern.search(text)
        if match:
            answer = _strip_non_word(match.group(1).strip())
            if len(answer) > 3:
                return answer
    sentences = [part.strip() for part in re.split(r"[.!?]+", text) if len(part.strip()) > 5]
    return sentences[0] if sentences else text[:100].strip()


def ragen_action(piece: str) -> tuple[str, str]:
    """(verb, argument) as RAGEN-2's Search env reads a piece: exactly `search[`…`]` or
    `finish[`…`]` (case and spacing as written), anything else a free-text answer."""
    piece = piece.strip()
    for verb in ("search", "finish"):
        if piece.startswith(verb + "[") and piece.endswith("]"):
            return verb, piece[len(verb) + 1:-1]
    return "answer", free_text_answer(piece)


def canonical_action(piece: str) -> tuple[str, str] | str:
    """`(canonical action, argument)` for `search[…]`/`finish[…]`, else why it is invalid."""
    match = _ACTION.fullmatch(piece.strip())
    if match is None:
        return "not search[query] or finish[answer]"
    verb, argument = match.group(1).lower(), match.group(2).strip()
    if not argument:
        return f"{verb}[] needs {'a query' if verb == 'search' else 'an answer'} inside the brackets"
    return f"{verb}[{argument}]", argument


# --- the env --------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchQAConfig(EnvConfig):
    max_actions_per_traj: int = 10
    source: str = "builtin"  # builtin | file | hub
    path: str = ""  # HotpotQA-schema JSONL or JSON array, for source='file'
    hub_id: str = "hotpotqa/hotpot_qa"
    hub_config: str = "distractor"
    split: str = "train"  # the hub split; a file is one split
    cache_dir: str = ""  # for datasets.load_dataset; "" = its default
    corpus_path: str = ""  # JSONL of {title, text}: search it instead of the question's context
    retriever: str = "bm25"
    top_k: int = 3  # passages shown per search
    max_obs_chars: int = 1500  # budget for the passages of one search, shared between them
    f1_threshold: float = 0.3
    free_text: str = "answer"  # see FREE_TEXT
    success_rule: str = "positive_reward"  # see SUCCESS_RULES

    def __post_init__(self) -> None:
        if self.free_text not in FREE_TEXT:
            raise EnvConfigError(f"free_text must be one of {list(FREE_TEXT)}, got {self.free_text!r}")
        if self.success_rule not in SUCCESS_RULES:
            raise EnvConfigError(f"success_rule must be one of {list(SUCCESS_RULES)}, got {self.success_rule!r}")
        if self.source not in SOURCES:
            raise EnvConfigError(f"source must be one of {list(SOURCES)}, got {self.source!r}")
        if self.source == "file" and not self.path:
            raise EnvConfigError("source='file' needs path= a JSONL/JSON file in HotpotQA's schema")
        if self.source != "file" and self.path:
            raise EnvConfigError(f"path is only read with source='file' (source is {self.source!r})")
        if self.source == "hub" and not (self.hub_id and self.split):
            raise EnvConfigError("source='hub' needs a non-empty hub_id and split")
        if self.retriever not in RETRIEVER_KINDS:
            raise EnvConfigError(f"retriever must be one of {sorted(RETRIEVER_KINDS)}, got {self.retriever!r}")
        if self.top_k < 1:
            raise EnvConfigError(f"top_k must be >= 1, got {self.top_k}")
        if self.max_obs_chars < 100:
            raise EnvConfigError(f"max_obs_chars must be >= 100, got {self.max_obs_chars}")
        if not 0.0 <= self.f1_threshold <= 1.0:
            raise EnvConfigError(f"f1_threshold must be in [0, 1], got {self.f1_threshold}")
        super().__post_init__()


_CACHE = SourceCache()


def load_questions(config: SearchQAConfig) -> Sequence[MultiHopQuestion]:
    """The questions `config` names, loaded once per source and shared."""
    if config.source == "hub":
        key = ("hub", config.hub_id, config.hub_config, config.split, config.cache_dir)
        return _CACHE.get(key, lambda: load_hub_questions(config.hub_id, config.hub_config, config.split,
                                                          config.cache_dir))
    path = BUILTIN_PATH if config.source == "builtin" else Path(config.path).expanduser().resolve()
    return _CACHE.get(("file", str(path), file_version(path)), lambda: read_question_file(path))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)].rstrip() + "…"


def format_results(passages: Sequence[Passage], budget: int) -> str:
    """Number the passages; each gets an equal share of `budget` characters."""
    if not passages:
        return "No paragraph matched the query."
    share = budget // len(passages)
    return "\n".join(_clip(f"[{i}] {p.title}: {p.text}", share) for i, p in enumerate(passages, start=1))


class SearchQAEnv(TextEnv):
    config_cls = SearchQAConfig

    def __init__(self, config: SearchQAConfig | None = None):
        super().__init__(config)
        # at construction, so a bad source or corpus fails early rather than at the first search
        self.questions = load_questions(self.config)
        self.corpus = (corpus_retriever(self.config.corpus_path, self.config.retriever)
                       if self.config.corpus_path else None)
        self.question: MultiHopQuestion | None = None
        self.retriever: Retriever | None = None
        self.index = -1
        self.results: list[tuple[str, list[Passage]]] = []  # (query, passages) of this turn's searches
        self.submitted: str | None = None
        self.final_scores: dict | None = None
        self._new_turn = True

    @property
    def ragen_instruction(self) -> str:
        return ragen_text.SEARCHQA

    @property
    def ragen_max_words(self) -> int:
        return ragen_text.SEARCHQA_MAX_TOKENS

    @property
    def instruction(self) -> str:
        return (
            "Answer a multi-hop question by searching a collection of paragraphs. Actions: search[query] shows "
            f"the {self.config.top_k} paragraphs that best match the query; finish[answer] submits your final "
            "answer and ends the episode. Give one action inside the answer tags, e.g. "
            "<answer>search[Orlen Lighthouse]</answer> or <answer>finish[Cobbleford]</answer>. "
            "Answers are short: a name, a number or yes/no."
        )

    def _reset(self, rng: np.random.Generator) -> dict:
        self.index = int(rng.integers(len(self.questions)))
        self.question = self.questions[self.index]
        if self.corpus is None and not self.question.context:
            raise QADatasetError(f"question {self.question.id or self.index!r} has no context paragraphs to search: "
                                 f"give it some, or set corpus_path= a JSONL corpus of {{title, text}}")
        self.retriever = self.corpus or make_retriever(self.config.retriever, self.question.context)
        self.results, self.submitted, self.final_scores, self._new_turn = [], None, None, True
        return {"index": self.index, "id": self.question.id, "type": self.question.type, "level": self.question.level}

    def parse(self, response: str) -> ParsedResponse:
        """The shared parser (free-form); with free_text="drop", keep only `search[…]`/`finish[…]`."""
        parsed = parse_response(response, vocabulary=None, max_actions=self.config.max_actions_per_turn,
                                require_think=self.config.require_think)
        if not parsed.actions or self.config.free_text == "answer":  # every piece runs, as in RAGEN-2
            return parsed
        actions: list[str] = []
        dropped = list(parsed.dropped)
        num_dropped = parsed.num_dropped
        for piece in parsed.actions:
            found = canonical_action(piece)
            if isinstance(found, tuple):
                actions.append(found[0])
                continue
            num_dropped += 1
            if len(dropped) < MAX_DROPPED_RECORDED:
                dropped.append(DroppedAction(piece, found))
        error = None if actions else "no valid action: expected search[query] or finish[answer]"
        return ParsedResponse(format_ok=True, think=parsed.think, answer=parsed.answer, actions=tuple(actions),
                              dropped=tuple(dropped), num_dropped=num_dropped, error=error,
                              num_invalid=parsed.num_invalid + len(parsed.actions) - len(actions))

    def step(self, response: str) -> tuple[str, float, bool, bool, dict]:
        if not self.episode_over:
            self._new_turn = True  # this turn's first search replaces the results on show
        obs, reward, terminated, truncated, info = super().step(response)
        if terminated or truncated:  # the answer's scores at the top level, for episode logs
            scores = self.final_scores or {"em": False, "f1": 0.0}
            info["em"], info["f1"] = scores["em"], scores["f1"]
        return obs, reward, terminated, truncated, info

    def _apply_action(self, action: str) -> ActionOutcome:
        if self.config.free_text == "answer":
            verb, argument = ragen_action(action)
        else:
            canonical, argument = canonical_action(action)  # parse() let only valid actions through
            verb = canonical.split("[", 1)[0]
        if verb in ("finish", "answer"):
            reward, em, f1 = answer_reward(argument, self.question.answer, self.config.f1_threshold)
            self.submitted = argument
            self.final_scores = {"em": em, "f1": f1}
            success = em or (self.config.success_rule == "positive_reward" and reward > 0)
            return ActionOutcome(reward, terminated=True, success=success,
                                 info={"action": verb, "em": em, "f1": f1, "gold": self.question.answer})
        passages = self.retriever.search(argument, self.config.top_k)
        if self._new_turn:
            self.results, self._new_turn = [], False
        self.results.append((argument, passages))
        titles = [p.title for p in passages]
        return ActionOutcome(0.0, info={
            "action": "search", "query": _clip(argument, MAX_ECHO_CHARS), "titles": titles,
            "supporting_found": sorted(set(titles) & set(self.question.supporting_titles)),
        })

    def render(self) -> str:
        if self.question is None:
            return "(no question yet: call reset)"
        lines = [f"Question: {self.question.question}"]
        if self.submitted is not None:  # the episode is over: only the answer is left to show
            return "\n".join([*lines, f"You answered: {_clip(self.submitted, MAX_ECHO_CHARS)}"])
        if not self.results:
            lines.append("No search yet. Use search[query] to find paragraphs, then finish[answer].")
        for query, passages in self.results:
            lines.append(f"Results for search[{_clip(query, MAX_ECHO_CHARS)}]:")
            lines.append(format_results(passages, self.config.max_obs_chars))
        return "\n".join(lines)

    def sample_action(self, rng: np.random.Generator) -> str:
        """search[1–3 question words] mostly; finish[…] a quarter of the time, half of those the answer."""
        words = tokenize(self.question.question) if self.question is not None else []
        words = words or ["question"]
        if rng.random() < 0.25:
            answer = self.question.answer.strip() if self.question is not None else ""
            if rng.random() < 0.5 and _round_trips("finish", answer):
                return f"finish[{answer}]"
            return f"finish[{words[int(rng.integers(len(words)))]}]"
        count = int(rng.integers(1, min(3, len(words)) + 1))
        picked = [words[int(i)] for i in rng.choice(len(words), size=count, replace=False)]
        return f"search[{' '.join(picked)}]"


def _round_trips(verb: str, argument: str) -> bool:
    """Whether `verb[argument]` survives the parser unchanged (no separator or closing tag in it)."""
    if not argument or ACTION_SEPARATOR in argument or ANSWER_CLOSE in argument:
        return False
    found = canonical_action(f"{verb}[{argument}]")
    return isinstance(found, tuple) and found[0] == f"{verb}[{argument}]"


register("searchqa", SearchQAEnv, SearchQAConfig(),
         "Multi-hop QA with search[query] (BM25 over the question's paragraphs) and finish[answer]; "
         "reward EM, else F1 >= 0.3 (offline: 43 invented two-hop questions in HotpotQA's schema)")
