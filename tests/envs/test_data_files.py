"""The loading pieces MetaMathQA, DeepCoder and SearchQA (questions and corpus) share."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from envs.data_files import HubRows, SourceCache, file_version, json_lines, load_hub_dataset, read_utf8


class BadData(ValueError):
    pass


def test_read_utf8_names_the_path_and_the_problem(tmp_path):
    good = tmp_path / "rows.jsonl"
    good.write_text("{}\n", encoding="utf-8")
    assert read_utf8(good, BadData) == "{}\n"
    with pytest.raises(BadData, match=r"absent\.jsonl: no such file$"):
        read_utf8(tmp_path / "absent.jsonl", BadData)
    with pytest.raises(BadData, match=r"absent\.jsonl: no such corpus file$"):
        read_utf8(tmp_path / "absent.jsonl", BadData, missing="no such corpus file")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b"caf\xe9")
    with pytest.raises(BadData, match=r"latin\.jsonl: cannot read it as UTF-8 text \(.*can't decode byte 0xe9"):
        read_utf8(latin, BadData)


def test_file_version_changes_when_the_file_is_edited(tmp_path):
    path = tmp_path / "rows.jsonl"
    assert file_version(path) is None
    path.write_text("a")
    first = file_version(path)
    assert first == (path.stat().st_mtime_ns, 1)
    path.write_text("bb")
    assert file_version(path) == (path.stat().st_mtime_ns, 2) != first


def test_source_cache_loads_each_key_once_across_threads():
    cache, calls = SourceCache(), []

    def slow_load(key):
        calls.append(key)
        time.sleep(0.05)  # wide enough for every thread to arrive while the first one loads
        return [key]

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(("a",), lambda: slow_load("a"))))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["a"] and all(result is results[0] for result in results)
    assert cache.get(("b",), lambda: slow_load("b")) == ["b"] and calls == ["a", "b"]


def fake_datasets(monkeypatch, load_dataset):
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))


def test_load_hub_dataset_passes_a_config_only_when_given(monkeypatch):
    calls = []
    fake_datasets(monkeypatch, lambda *args, **kwargs: calls.append((args, kwargs)) or "rows")
    assert load_hub_dataset("org/set", None, "train", "", name="n", error=BadData, offline_hint="") == "rows"
    load_hub_dataset("org/set", "distractor", "test", "/c", name="n", error=BadData, offline_hint="")
    assert calls == [(("org/set",), {"split": "train", "cache_dir": None}),
                     (("org/set", "distractor"), {"split": "test", "cache_dir": "/c"})]


def test_load_hub_dataset_failures_name_the_dataset_and_the_offline_way(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")
    fake_datasets(monkeypatch, offline)
    with pytest.raises(BadData, match=r"^could not load hub dataset 'x' \(ConnectionError: no network\)\. "
                                      r"Use source='builtin'\.$"):
        load_hub_dataset("x", None, "train", "", name="hub dataset 'x'", error=BadData,
                         offline_hint="Use source='builtin'.")
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed: the import raises ImportError
    with pytest.raises(BadData, match=r"^hub dataset 'x': source='hub' needs the 'datasets' package "
                                      r"\(pip install datasets\)$"):
        load_hub_dataset("x", None, "train", "", name="hub dataset 'x'", error=BadData, offline_hint="")


def test_hub_rows_convert_a_row_only_when_it_is_read_and_name_it():
    seen = []

    def convert(row, where):
        seen.append(where)
        if row is None:
            raise BadData(f"{where}: empty row")
        return row * 2

    rows = HubRows([1, None, 3], "hub dataset 'x'", convert)
    assert len(rows) == 3 and seen == []
    assert rows[2] == 6 and seen == ["hub dataset 'x': row 2"]
    with pytest.raises(BadData, match=r"^hub dataset 'x': row 1: empty row$"):
        rows[1]
    assert rows[0] == 2


def test_json_lines_skip_blank_lines_and_name_the_line_that_is_not_json(tmp_path):
    path = tmp_path / "rows.jsonl"
    assert list(json_lines('{"a": 1}\n\n  \n[2]\n', path, BadData)) == [(f"{path}: line 1", {"a": 1}),
                                                                        (f"{path}: line 4", [2])]
    rows = json_lines('{"a": 1}\n{"a": \n', path, BadData)
    assert next(rows) == (f"{path}: line 1", {"a": 1})  # rows come one at a time, before the bad line is read
    with pytest.raises(BadData, match=r"rows\.jsonl: line 2: not valid JSON \(Expecting value\)$"):
        next(rows)
