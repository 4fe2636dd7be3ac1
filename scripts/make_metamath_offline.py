"""Make envs/data/gsm8k_test_metamathqa.jsonl: GSM8K test rows in MetaMathQA's schema.

MetaMathQA (meta-math/MetaMathQA) lives on the Hugging Face hub, which is not reachable
everywhere, so the MetaMathQA env ships a small offline default built from real GSM8K
test problems (openai/grade-school-math, MIT licence; see envs/data/README.md).

Each GSM8K row {question, answer: "...#### N"} becomes
    {"type": "GSM8K_test", "query": question, "original_question": question,
     "response": answer without the <<calculator>> annotations + "\\nThe answer is: N"}
which is how MetaMathQA's GSM-derived rows look ("#### N" then "The answer is: N").

    python scripts/make_metamath_offline.py GSM8K_TEST_JSONL [OUTPUT_JSONL] [--rows 200]

GSM8K_TEST_JSONL is `grade_school_math/data/test.jsonl` of github.com/openai/grade-school-math;
the shipped file holds its first 200 rows, in order.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "envs" / "data" / "gsm8k_test_metamathqa.jsonl"
ROW_TYPE = "GSM8K_test"  # not one of MetaMathQA's augmentation types: these rows are unaugmented
CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")


def convert_row(row: dict, line: int) -> dict:
    question, answer = row["question"], row["answer"]
    solution, marker, final = answer.rpartition("####")
    final = final.strip()
    if not marker or not final:
        raise ValueError(f"line {line}: GSM8K answer has no '#### N' final answer")
    if "final_answer" in row and row["final_answer"] != final:
        raise ValueError(f"line {line}: final_answer {row['final_answer']!r} != '#### {final}'")
    steps = CALCULATOR_ANNOTATION.sub("", solution).rstrip()
    response = f"{steps}\n#### {final}\nThe answer is: {final}"
    return {"type": ROW_TYPE, "query": question, "original_question": question, "response": response}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="GSM8K test rows (JSONL with question and answer)")
    parser.add_argument("output", type=Path, nargs="?", default=DEFAULT_OUTPUT)
    parser.add_argument("--rows", type=int, default=200, help="take the first N rows (0: all)")
    args = parser.parse_args(argv[1:])
    rows = []
    with args.source.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if args.rows and len(rows) == args.rows:
                break
            if text.strip():
                rows.append(convert_row(json.loads(text), line))
    output = args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
