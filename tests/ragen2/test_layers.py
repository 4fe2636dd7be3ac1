"""Engine internals are not a library: reports, export and the commands that run no engine import
nothing from ragen2.engines.local (what they share with it lives below it: models, run_dir,
scoring, shared_prefix, checkpoint formats)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ragen2"
ENGINE = "ragen2.engines.local"
RUN_AN_ENGINE = {"train.py", "sft.py"}  # the commands that train: they start the local engine


def engine_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == ENGINE or a.name.startswith(ENGINE + ".")]
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == ENGINE or node.module.startswith(ENGINE + ".")):
            found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "ragen2.engines":
            found += [f"from ragen2.engines import {a.name}" for a in node.names if a.name == "local"]
    return found


def test_reports_export_and_engineless_commands_do_not_import_the_local_engine():
    files = [*ROOT.joinpath("reports").glob("*.py"), ROOT / "export.py",
             *(p for p in ROOT.joinpath("commands").glob("*.py") if p.name not in RUN_AN_ENGINE)]
    assert len(files) > 10
    offenders = {str(p.relative_to(ROOT)): found for p in files if (found := engine_imports(p))}
    assert offenders == {}


def test_the_check_sees_every_spelling_of_an_engine_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import ragen2.engines.local.trainer\nfrom ragen2.engines.local import learner\n"
                    "from ragen2.engines import local\ndef f():\n    from ragen2.engines.local.checkpoint import save\n")
    assert len(engine_imports(path)) == 4


def test_no_function_of_the_local_engine_takes_more_than_six_parameters():
    """Values that travel together become one dataclass (issue 51): a long signature is where
    a reader loses the thread. The scoring pass and shared-prefix passes count as the engine's."""
    files = [*ROOT.joinpath("engines", "local").glob("*.py"), ROOT / "scoring.py", ROOT / "shared_prefix.py"]
    too_long = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                count = len(names) - (names[:1] in (["self"], ["cls"]))
                if count > 6:
                    too_long[f"{path.name}:{node.name}"] = count
    assert too_long == {}
