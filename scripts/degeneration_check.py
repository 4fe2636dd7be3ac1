"""The degeneration detector on the committed completions and on constructed degenerate replies.

    python scripts/degeneration_check.py --out docs/benchmarks/degeneration_check.json

Part 1 judges every reply recorded in docs/experiments/**/completions.jsonl (real runs of the
bundled model) and lists each one flagged, with its text, so a reader can tell a false alarm
from a real loop; the near misses (the longest repeated stretches not flagged) show the margin.
(The runs record two replies per step, the best and the worst, so a step's share of degenerate
replies, what the alarm watches, cannot be measured from them.)
Part 2 builds degenerate replies (units repeated alone, or after a committed reply's opening as a
loop the token budget cut) and counts how many are flagged. Deterministic: no RNG, no timing.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from mi_probe.collapse import CollapseDetectorConfig
from mi_probe.degeneration import DegenerationConfig, _runs, judge_reply

ROOT = Path(__file__).resolve().parents[1]
UNITS = ["!", "?", " ", "\n", "0", "the ", "Up || ", "I think ", "Let me check the box again. ", "思考"]


def longest_repeat(text: str, cfg: DegenerationConfig) -> tuple[int, int]:
    """(span, period) of the longest stretch whose unit repeats >= min_repeats times."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    best = (0, 0)
    for period in range(1, min(cfg.max_period, len(text) // cfg.min_repeats) + 1):
        longest, _ = _runs(codes[period:] == codes[:-period])
        if longest + period >= cfg.min_repeats * period and longest + period > best[0]:
            best = (longest + period, period)
    return best


def committed(cfg: DegenerationConfig) -> tuple[dict, list[str]]:
    files = sorted((ROOT / "docs" / "experiments").glob("**/completions.jsonl"))
    reasons, kinds, flagged, near, normal = Counter(), Counter(), [], [], []
    steps = Counter()
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            for turn in record["turns"]:
                text, reason = turn["response"], turn["parse"]["finish_reason"]
                reasons[reason] += 1
                verdict = judge_reply(text, reason, cfg)
                steps[(str(path.parent.relative_to(ROOT)), record["step"])] += 1
                if verdict.degenerate:
                    kinds[verdict.kind] += 1
                    flagged.append({"file": str(path.relative_to(ROOT)), "step": record["step"], "kind": verdict.kind,
                                    "period": verdict.period, "span": verdict.span, "finish_reason": reason,
                                    "text": text})
                else:
                    normal.append(text)
                    span, period = longest_repeat(text, cfg)
                    if span:
                        near.append({"span": span, "period": period, "share": round(span / len(text), 3),
                                     "finish_reason": reason, "text": text})
    near.sort(key=lambda n: (-n["share"], -n["span"]))
    return {"files": len(files), "replies": sum(reasons.values()), "finish_reasons": dict(reasons),
            "flagged": len(flagged), "flagged_by_kind": dict(kinds), "flagged_replies": flagged,
            "near_misses": near[:10], "recorded_steps": len(steps),
            "replies_per_recorded_step": sorted(set(steps.values()))}, normal


def constructed(cfg: DegenerationConfig, openings: list[str]) -> dict:
    cases = []
    for unit in UNITS:
        for repeats in (8, 20, 60):
            loop = unit * repeats
            cut = loop[: max(len(loop) - 3, 1)]  # the budget stops it mid-unit
            cases.append(("repeat", loop, "stop", len(loop)))
            cases.append(("repeat", cut, "length", len(cut)))
            for opening in openings:  # a normal start, then a loop until the budget
                cases.append(("loop_cut", opening + " " + loop, "length", len(loop)))
    counts: dict[str, Counter] = defaultdict(Counter)
    missed = []
    for kind, text, reason, loop_chars in cases:
        verdict = judge_reply(text, reason, cfg)
        # loops shorter than min_chars are below what the detector judges, by design
        group = f"{kind}, loop >= min_chars" if loop_chars >= cfg.min_chars else f"{kind}, loop < min_chars"
        counts[group]["cases"] += 1
        counts[group]["flagged"] += verdict.degenerate
        if not verdict.degenerate:
            missed.append({"kind": kind, "finish_reason": reason, "loop_chars": loop_chars, "text": text})
    return {"units": UNITS, "repeats": [8, 20, 60], "openings": openings,
            "by_kind": {k: dict(v) for k, v in sorted(counts.items())}, "missed": missed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = DegenerationConfig()
    real, normal = committed(cfg)
    # openings: the first 60 characters of the three longest committed replies not flagged (distinct)
    openings = list(dict.fromkeys(text[:60] for text in sorted(normal, key=lambda t: (-len(t), t))))[:3]
    result = {"command": "python scripts/degeneration_check.py --out " + str(args.out),
              "detector": cfg.__dict__, "alarm_share": CollapseDetectorConfig().degenerate_share,
              "committed_completions": real, "constructed": constructed(cfg, openings)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({"replies": real["replies"], "flagged": real["flagged"],
                      "constructed": result["constructed"]["by_kind"]}))


if __name__ == "__main__":
    main()
