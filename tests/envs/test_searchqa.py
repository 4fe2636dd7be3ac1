"""SearchQA: SQuAD normalisation and F1 by hand, BM25, the loaders and their errors, episodes."""

import json
import math
import sys
import threading
import time
import types
import uuid

import numpy as np
import pytest

import envs
import envs.retrieval as retrieval
import envs.searchqa as searchqa
from envs.base import EnvConfigError
from envs.parsing import format_response
from envs.retrieval import BM25Retriever, Passage, Retriever, RetrievalError, corpus_retriever, read_corpus_file
from envs.searchqa import (
    SearchQAConfig, SearchQAEnv, answer_f1, answer_reward, exact_match, load_questions, normalize_answer,
)
from envs.searchqa_questions import QADatasetError, read_question_file


def act(env, *actions):
    return env.step(format_response(list(actions), think="t"))


def hotpot_row(question="Q?", answer="A", **extra) -> dict:
    """A row as `datasets` spells HotpotQA (dicts of columns)."""
    row = {
        "id": "x1", "question": question, "answer": answer, "type": "bridge", "level": "easy",
        "supporting_facts": {"title": ["Alpha", "Beta"], "sent_id": [0, 1]},
        "context": {"title": ["Alpha", "Beta", "Gamma"],
                    "sentences": [["Alpha is a town.", " It has a mill."], ["Beta is a river.", " It is long."],
                                  ["Gamma is a hill."]]},
    }
    row.update(extra)
    return row


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def env_on_question(index: int, **overrides) -> SearchQAEnv:
    """A builtin env reset onto question `index` (seeds are searched: reset picks by seed only)."""
    env = SearchQAEnv(SearchQAConfig(**overrides))
    for seed in range(2000):
        if env.reset(seed=seed)[1]["index"] == index:
            return env
    raise AssertionError(f"no seed below 2000 picks question {index}")


# --- normalisation and scores ---------------------------------------------------------------

@pytest.mark.parametrize("text, normalised", [
    ("The Cat!", "cat"),                           # case, article, punctuation
    ("  An   apple,\ta day\n", "apple day"),       # every article, any whitespace
    ("Theatre of the Absurd", "theatre of absurd"),  # 'the' only as a whole word
    ("Jean-Luc O'Neil", "jeanluc oneil"),          # punctuation is deleted, not spaced
    ("11,500", "11500"),
    ("A.B.C.", "abc"),                             # 'A.' loses its dot first, then is no article
    ("Café  Noir", "café noir"),                   # non-ASCII letters stay
    ("the", ""),
])
def test_squad_normalisation(text, normalised):
    assert normalize_answer(text) == normalised


@pytest.mark.parametrize("prediction, gold, f1", [
    ("the Pell River", "Pell River", 1.0),
    ("Lake Ives in Harrowmere", "Lake Ives", 2 / 3),        # P = 2/4, R = 2/2
    ("Ives", "Lake Ives", 2 / 3),                           # P = 1/1, R = 1/2
    ("the river of the north", "Sable River", 0.4),         # [river of north]: P = 1/3, R = 1/2
    ("river river", "river", 2 / 3),                        # a repeated word counts once per gold copy
    ("Cobbleford", "Dunhallow", 0.0),
    ("Smith John", "John Smith", 1.0),                      # F1 ignores order (EM does not)
    ("no way", "no", 0.0),                                  # HotpotQA: yes/no/noanswer only by exact match
    ("yes", "no", 0.0),
    ("the", "an", 1.0),                                     # both empty after normalising
    ("the", "Cobbleford", 0.0),
])
def test_f1_by_hand(prediction, gold, f1):
    assert answer_f1(prediction, gold) == pytest.approx(f1, abs=1e-12)


def test_exact_match_is_equality_after_normalising():
    assert exact_match("the  Pell river.", "Pell River")
    assert exact_match("11500", "11,500")
    assert not exact_match("Smith John", "John Smith")
    assert not exact_match("Pell", "Pell River")


@pytest.mark.parametrize("prediction, gold, reward, em", [
    ("Pell River!", "Pell River", 1.0, True),
    ("river delta town harbour", "Sable River", 1 / 3, False),       # F1 = 2·1/(4+2) = 0.333 >= 0.3
    ("river delta town harbour bay", "Sable River", 0.0, False),     # F1 = 2·1/(5+2) = 0.286 < 0.3
    ("a b c x y z p q r s", "a b c d e f g h i j", 0.0, False),      # articles go: 8 vs 9 tokens
    ("b c d x y z p q r s", "b c d e f g h i j k", 0.3, False),      # F1 = 2·3/(10+10) = 0.3 exactly
    ("Smith John", "John Smith", 1.0, False),                        # full F1 without exact match
])
def test_reward_is_exact_match_else_f1_from_the_threshold(prediction, gold, reward, em):
    got_reward, got_em, f1 = answer_reward(prediction, gold, 0.3)
    assert got_reward == pytest.approx(reward, abs=1e-12) and got_em == em
    assert math.isfinite(f1)


# --- BM25 --------------------------------------------------------------------------------------

def test_bm25_score_matches_the_lucene_formula_by_hand():
    retriever = BM25Retriever([Passage("", "apple banana"), Passage("", "banana cherry cherry")])
    # 'cherry': N = 2, df = 1 → idf = ln(1 + 1.5/1.5) = ln 2; in doc 2 tf = 2, |d| = 3, avgdl = 2.5.
    # Lucene's BM25 (no (k1 + 1) numerator, which scales every score alike):
    # ln 2 · 2 / (2 + 1.5·(0.25 + 0.75·3/2.5)) = ln 2 · 2/3.725
    assert retriever.scores("cherry") == pytest.approx([0.0, math.log(2) * 2 / 3.725], rel=1e-6)
    assert retriever.search("cherry", k=5) == [Passage("", "banana cherry cherry")]  # score 0 is no match
    assert retriever.search("durian", k=5) == [] and retriever.search("the of", k=5) == []  # stopwords only


def test_bm25_finds_the_supporting_paragraph_for_a_targeted_query():
    question = load_questions(SearchQAConfig())[0]  # the Orlen Lighthouse question
    retriever = BM25Retriever(question.context)
    assert isinstance(retriever, Retriever)
    assert retriever.search("who designed the Orlen Lighthouse", k=3)[0].title == "Orlen Lighthouse"
    assert retriever.search("architect Mira Thessaly born", k=3)[0].title == "Mira Thessaly"
    top = retriever.search("lighthouse", k=2)
    assert len(top) == 2 and top[0].title == "Orlen Lighthouse"


def test_bm25_ties_keep_corpus_order_and_k_is_checked():
    retriever = BM25Retriever([Passage("a", "same words"), Passage("b", "same words"), Passage("c", "other")])
    assert [p.title for p in retriever.search("same", k=3)] == ["a", "b"]
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever.search("same", k=0)
    with pytest.raises(RetrievalError, match="empty list"):
        BM25Retriever([])


# --- the corpus file --------------------------------------------------------------------------

def test_corpus_file_is_searched_instead_of_the_context(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [
        {"title": "Orlen Lighthouse", "text": "A corpus copy: the lighthouse was designed by Mira Thessaly."},
        {"title": "Quiet Harbour", "text": "Boats rest here."},
        {"title": "Mira Thessaly", "text": "Mira Thessaly was born in Cobbleford.", "url": "extra keys are fine"},
    ])
    env = env_on_question(0, corpus_path=corpus)
    obs, _, _, _, info = act(env, "search[Mira Thessaly born]")
    assert info["action_infos"][0]["titles"] == ["Mira Thessaly", "Orlen Lighthouse"]
    assert "[1] Mira Thessaly: Mira Thessaly was born in Cobbleford." in obs
    assert info["action_infos"][0]["supporting_found"] == ["Mira Thessaly", "Orlen Lighthouse"]
    assert corpus_retriever(corpus) is env.retriever  # indexed once per path, shared


@pytest.mark.parametrize("content, message", [
    ('{"title": "a", "text": "b"}\nnot json\n', r"line 2: not valid JSON"),
    ('{"title": "a"}\n', r"line 1: missing field 'text'"),
    ('{"title": "a", "text": 3}\n', r"line 1: field 'text' must be a string, got int"),
    ('["a", "b"]\n', r"line 1: expected a JSON object"),
    ('\n\n', r"holds no passages"),
])
def test_bad_corpus_files_are_named_with_their_line(tmp_path, content, message):
    path = tmp_path / f"{uuid.uuid4().hex}.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(RetrievalError, match=message):
        read_corpus_file(path)
    with pytest.raises(RetrievalError, match=message):
        envs.make("searchqa", corpus_path=str(path))


def test_corpus_is_indexed_once_for_many_threads(tmp_path, monkeypatch):
    corpus = write_jsonl(tmp_path / "shared.jsonl", [{"title": "T", "text": "shared words"}])
    calls = []
    real_read = retrieval.read_corpus_file

    def slow_read(path):
        calls.append(path)
        time.sleep(0.05)  # widen the window in which a second thread could start its own load
        return real_read(path)

    monkeypatch.setattr(retrieval, "read_corpus_file", slow_read)
    built = []
    workers = [threading.Thread(target=lambda: built.append(envs.make("searchqa", corpus_path=corpus)))
               for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(built) == 8 and len(calls) == 1
    assert all(env.corpus is built[0].corpus for env in built)


def test_missing_corpus_file(tmp_path):
    with pytest.raises(RetrievalError, match="no such corpus file"):
        envs.make("searchqa", corpus_path=str(tmp_path / "absent.jsonl"))


# --- the HotpotQA-schema loader ------------------------------------------------------------------

def test_the_three_spellings_of_a_hotpotqa_row_load_alike(tmp_path):
    dict_form = hotpot_row()
    original = {  # the original release: a JSON array, "_id", lists of [title, x] pairs
        "_id": "x1", "question": "Q?", "answer": "A", "type": "bridge", "level": "easy",
        "supporting_facts": [["Alpha", 0], ["Beta", 1]],
        "context": [[t, s] for t, s in zip(dict_form["context"]["title"], dict_form["context"]["sentences"])],
    }
    structs = dict(dict_form, supporting_facts=[{"title": "Alpha", "sent_id": 0}, {"title": "Beta", "sent_id": 1}],
                   context=[{"title": t, "sentences": s}
                            for t, s in zip(dict_form["context"]["title"], dict_form["context"]["sentences"])])
    (tmp_path / "dev.json").write_text(json.dumps([original]), encoding="utf-8")
    write_jsonl(tmp_path / "columns.jsonl", [dict_form])
    write_jsonl(tmp_path / "structs.jsonl", [structs])
    loaded = [read_question_file(tmp_path / name)[0] for name in ("dev.json", "columns.jsonl", "structs.jsonl")]
    assert loaded[0] == loaded[1] == loaded[2]
    question = loaded[0]
    assert (question.id, question.question, question.answer, question.type, question.level) == \
        ("x1", "Q?", "A", "bridge", "easy")
    assert question.supporting_facts == (("Alpha", 0), ("Beta", 1))
    assert question.supporting_titles == ("Alpha", "Beta")
    assert question.context[0] == Passage("Alpha", "Alpha is a town. It has a mill.")  # sentences joined
    assert [p.title for p in question.context] == ["Alpha", "Beta", "Gamma"]


def test_file_source_plays_an_episode(tmp_path):
    path = write_jsonl(tmp_path / "qs.jsonl", [hotpot_row("Which town has a mill?", "Alpha")])
    env = envs.make("searchqa", source="file", path=path)
    obs, info = env.reset(seed=0)
    assert obs.startswith("Question: Which town has a mill?") and info["id"] == "x1"
    obs, reward, _, _, info = act(env, "search[mill]")
    assert reward == 0.0 and info["action_infos"][0]["titles"] == ["Alpha"]
    assert "[1] Alpha: Alpha is a town. It has a mill." in obs
    assert act(env, "finish[alpha.]")[1:3] == (1.0, True)


@pytest.mark.parametrize("row, message", [
    (hotpot_row(answer=""), r"line 1: field 'answer' must be a non-empty string"),
    ({"question": "Q?"}, r"line 1: field 'answer' must be a non-empty string"),
    (hotpot_row(context={"title": ["a", "b"], "sentences": [["x"]]}), r"context: 2 titles but 1 sentencess"),
    (hotpot_row(context=[["a"]]), r"context\[0\]: expected \[title, sentences\]"),
    (hotpot_row(context={"title": ["a"], "sentences": ["not a list"]}), r"a list of string sentences"),
    (hotpot_row(supporting_facts=[["a", "0"]]), r"an int sent_id"),
    (hotpot_row(level=3), r"'id', 'type' and 'level' must be strings"),
    ("[1, 2]", r"line 1: expected a JSON object, got list"),
])
def test_bad_rows_are_named(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text((row if isinstance(row, str) else json.dumps(row)) + "\n", encoding="utf-8")
    with pytest.raises(QADatasetError, match=message):
        read_question_file(path)


def test_a_question_without_context_needs_a_corpus(tmp_path):
    path = write_jsonl(tmp_path / "qs.jsonl", [{"question": "Q?", "answer": "A", "id": "bare"}])
    env = envs.make("searchqa", source="file", path=path)
    with pytest.raises(QADatasetError, match="'bare' has no context paragraphs to search"):
        env.reset(seed=0)
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"title": "A", "text": "the answer"}])
    env = envs.make("searchqa", source="file", path=path, corpus_path=corpus)
    env.reset(seed=0)
    assert act(env, "search[answer]")[4]["action_infos"][0]["titles"] == ["A"]


class FakeHubDataset(list):
    @property
    def column_names(self):
        return list(self[0]) if self else []


def test_hub_source_goes_through_datasets_with_the_config_name(monkeypatch):
    calls = []

    def load_dataset(path, name=None, split=None, cache_dir=None):
        calls.append((path, name, split, cache_dir))
        return FakeHubDataset([hotpot_row("Hub question?", "Beta")])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    hub_id = f"test/hotpot-{uuid.uuid4().hex}"  # a fresh cache key
    env = envs.make("searchqa", source="hub", hub_id=hub_id, split="validation")
    envs.make("searchqa", source="hub", hub_id=hub_id, split="validation")
    assert calls == [(hub_id, "distractor", "validation", None)]
    assert env.reset(seed=0)[0].startswith("Question: Hub question?")
    assert act(env, "finish[Beta]")[1] == 1.0


def test_hub_errors_are_clear(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(QADatasetError, match=r"could not load hub dataset .* \(ConnectionError.*source='builtin'"):
        envs.make("searchqa", source="hub", hub_id=f"test/{uuid.uuid4().hex}")
    no_context = FakeHubDataset([{"question": "q", "answer": "a"}])
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: no_context))
    with pytest.raises(QADatasetError, match=r"missing column\(s\) \['context'\]"):
        envs.make("searchqa", source="hub", hub_id=f"test/{uuid.uuid4().hex}")


# --- episodes ----------------------------------------------------------------------------------

def test_the_offline_set_is_multi_hop_in_hotpotqa_schema():
    questions = load_questions(SearchQAConfig())
    assert len(questions) == 43 and len({q.id for q in questions}) == 43
    for q in questions:
        titles = [p.title for p in q.context]
        assert len(titles) == 10 and len(set(titles)) == 10  # two gold + eight distractors
        assert len(q.supporting_titles) == 2 and set(q.supporting_titles) <= set(titles)
        assert q.type in ("bridge", "comparison") and q.level in ("easy", "medium", "hard")


def test_a_scripted_expert_solves_every_offline_question():
    """Search for each supporting paragraph by its title (the bridge entity second), then answer."""
    questions = load_questions(SearchQAConfig())
    env = SearchQAEnv()
    solved = set()
    for seed in range(1000):
        _, info = env.reset(seed=seed)
        if info["index"] in solved:
            continue
        question = env.question
        seen = ""
        for title in question.supporting_titles:
            obs, reward, terminated, truncated, step_info = act(env, f"search[{title}]")
            assert title in step_info["action_infos"][0]["titles"], (question.id, title)
            assert (reward, terminated, truncated) == (0.0, False, False)
            seen += obs
        if question.answer not in ("yes", "no"):  # the answer is on screen (or, compared, in the question)
            assert question.answer in seen or question.answer in question.question, question.id
        obs, reward, terminated, truncated, step_info = act(env, f"finish[{question.answer}]")
        assert (reward, terminated, truncated, step_info["success"]) == (1.0, True, False, True), question.id
        assert step_info["em"] is True and step_info["f1"] == 1.0
        solved.add(info["index"])
        if len(solved) == len(questions):
            break
    assert len(solved) == len(questions) == 43


def test_partial_and_wrong_answers():
    env = env_on_question(2)  # "How high above sea level is the birthplace of Ilse Marrow?" → "640 metres"
    assert env.question.answer == "640 metres"
    _, reward, terminated, _, info = act(env, "finish[640]")  # F1 = 2·1/(1+2)
    # RAGEN-2: success = exact_match or reward > 0, so an F1 >= 0.3 answer succeeds
    assert reward == pytest.approx(2 / 3) and terminated and info["success"]
    assert info["action_infos"][0] == {"action": "finish", "em": False, "f1": pytest.approx(2 / 3),
                                       "gold": "640 metres"}
    env.reset(seed=env.seed)
    _, reward, _, _, info = act(env, "finish[Dunhallow]")
    assert reward == 0.0 and not info["success"]
    strict = env_on_question(2, success_rule="exact_match")
    assert not act(strict, "finish[640]")[4]["success"]
    strict.reset(seed=strict.seed)
    assert act(strict, "finish[640 metres]")[4]["success"]


def test_running_out_of_actions_truncates_with_reward_zero():
    env = envs.make("searchqa")
    env.reset(seed=3)
    for turn in range(1, 11):
        _, reward, terminated, truncated, info = act(env, "search[town]")
        assert reward == 0.0 and not terminated and truncated == (turn == 10)
    assert info["em"] is False and info["f1"] == 0.0 and not info["success"] and env.actions_left == 0


def test_parse_accepts_only_search_and_finish():
    env = envs.make("searchqa", free_text="drop")
    env.reset(seed=0)
    parsed = env.parse(format_response(["  SEARCH [ Orlen  Lighthouse ]  "], think="t"))
    assert parsed.actions == ("search[Orlen  Lighthouse]",) and parsed.error is None
    assert env.parse(format_response(["Finish[Tom [Jr]]"], think="t")).actions == ("finish[Tom [Jr]]",)
    for text, reason in [("lookup[x]", "not search[query] or finish[answer]"),
                         ("search[]", "search[] needs a query inside the brackets"),
                         ("finish[  ]", "finish[] needs an answer inside the brackets"),
                         ("Cobbleford", "not search[query] or finish[answer]"),
                         ("search[a", "not search[query] or finish[answer]")]:
        parsed = env.parse(format_response([text], think="t"))
        assert parsed.format_ok and parsed.actions == () and parsed.num_dropped == 1
        assert parsed.dropped[0].reason == reason and parsed.error.startswith("no valid action")
        _, reward, _, _, info = env.step(format_response([text], think="t"))
        assert reward == env.config.format_penalty and not info["action_is_valid"]
    # `||` separates actions, so it cannot sit inside a query
    assert env.parse(format_response(["search[a || b]"], think="t")).actions == ()
    two = env.parse(format_response(["search[x]", "finish[y]"], think="t"))
    assert two.actions == ("search[x]",) and two.dropped[0].reason == "beyond max_actions_per_turn=1"


def test_observation_shows_the_top_k_within_the_character_budget():
    env = env_on_question(0, top_k=2, max_obs_chars=120)
    obs, _, _, _, info = act(env, "search[Orlen Lighthouse]")
    assert len(info["action_infos"][0]["titles"]) == 2
    lines = obs.split("\n")
    assert lines[1] == "Results for search[Orlen Lighthouse]:"
    assert lines[2].startswith("[1] Orlen Lighthouse: ") and len(lines[2]) == 60 and lines[2].endswith("…")
    assert lines[3].startswith("[2] ") and len(lines[3]) <= 60 and len(lines) == 4
    obs, _, _, _, _ = act(env, "search[zzzz]")
    assert obs.endswith("Results for search[zzzz]:\nNo paragraph matched the query.")
    assert "Orlen" not in obs.split("\n", 1)[1]  # a new turn's search replaces the old results
    obs = act(env, "finish[x]")[0]
    assert obs == f"Question: {env.question.question}\nYou answered: x"


def test_several_searches_in_one_turn_are_all_shown():
    env = env_on_question(0, max_actions_per_turn=2)
    obs = act(env, "search[Cobbleford]", "search[Cape Orlen]")[0]
    assert "Results for search[Cobbleford]:" in obs and "Results for search[Cape Orlen]:" in obs
    obs = env.step("garbage")[0]  # a turn without an action keeps the results on screen
    assert "Results for search[Cape Orlen]:" in obs


def test_sample_action_searches_question_words_and_sometimes_answers():
    env = envs.make("searchqa")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    samples = [env.sample_action(rng) for _ in range(400)]
    assert all(env.parse(format_response([s], think="t")).actions == (s,) for s in samples)
    searches = [s for s in samples if s.startswith("search[")]
    assert 0.65 < len(searches) / len(samples) < 0.85
    question_words = set(searchqa.tokenize(env.question.question))
    assert all(set(s[7:-1].split()) <= question_words for s in searches)
    assert f"finish[{env.question.answer}]" in samples


@pytest.mark.parametrize("overrides, message", [
    ({"source": "web"}, "source must be one of"),
    ({"source": "file"}, "source='file' needs path="),
    ({"path": "x.jsonl"}, "path is only read with source='file'"),
    ({"top_k": 0}, "top_k must be >= 1, got 0"),
    ({"max_obs_chars": 10}, "max_obs_chars must be >= 100"),
    ({"f1_threshold": 1.5}, r"f1_threshold must be in \[0, 1\], got 1.5"),
    ({"retriever": "dense"}, r"retriever must be one of \['bm25'\], got 'dense'"),
])
def test_bad_config_is_rejected(overrides, message):
    with pytest.raises(EnvConfigError, match=message):
        envs.make("searchqa", **overrides)


def test_searchqa_passes_the_env_checker():
    envs.check_env(lambda: envs.make("searchqa"))


@pytest.mark.parametrize("text, answer", [
    # rllm's order; each value is what RAGEN-2's ragen/env/search/reward.py
    # extract_answer_from_response returns (checked against it, and on 20,000 fuzzed strings)
    ("I think \\boxed{640 metres} is it", "640 metres"),
    ("It is **Cobbleford** I believe", "Cobbleford"),
    ("**ok** then *Tom Reed*", "then"),  # "ok" is too short; then *…* pairs the stars of "ok** then *"
    ("The correct answer is: Ilse Marrow. Yes.", "Ilse Marrow"),
    ("Thus, Orlen Lighthouse!", "Orlen Lighthouse"),
    ("It is also Dunhallow.", "Dunhallow"),  # "so" inside "also" matches: no word boundary
    ("Maybe. Cobbleford town. Then", "Cobbleford town"),  # first sentence over 5 characters
    ("<think>hmm</think>  Abc", "Abc"),
    ("<think>only thoughts</think>", ""),
])
def test_free_text_answers_are_read_as_ragen2_reads_them(text, answer):
    assert searchqa.free_text_answer(text) == answer


def test_free_text_is_a_final_answer_by_default_as_in_ragen2():
    env = env_on_question(2)  # gold "640 metres"
    _, reward, terminated, _, info = act(env, "The answer is 640 metres")
    assert (reward, terminated, info["success"], info["format_penalty"]) == (1.0, True, True, 0.0)
    assert info["action_infos"][0]["action"] == "answer" and env.submitted == "640 metres"
    env.reset(seed=env.seed)
    _, reward, terminated, _, info = act(env, "Cobbleford")  # a wrong bare answer: 0, no penalty, over
    assert (reward, terminated, info["success"], info["format_penalty"]) == (0.0, True, False, 0.0)
    # RAGEN-2 recognises the verbs exactly as written: "SEARCH [x]" is an answer, not a search
    env.reset(seed=env.seed)
    assert act(env, "SEARCH [Orlen Lighthouse]")[2] is True
    env.reset(seed=env.seed)
    _, reward, terminated, _, info = act(env, "search[]")  # an empty query searches, finds nothing
    assert (reward, terminated, info["format_penalty"]) == (0.0, False, 0.0)
    assert "No paragraph matched the query." in env.render()
    with pytest.raises(EnvConfigError, match="free_text"):
        envs.make("searchqa", free_text="keep")
