"""`railyard simulate` on an install without the `sim` extra (decision 0079): one line saying
how to install it, and a non-zero exit — not a traceback, and nothing written."""

from __future__ import annotations

from pathlib import Path

from railyard.cli.simulate import SIM_EXTRA
from support.without import run_without

RUN_RAILYARD = ("import sys\n"
                "from railyard.cli.main import main\n"
                "sys.argv = ['railyard', *sys.argv[1:]]\n"
                "main()\n")


def test_simulate_without_the_sim_extra_says_how_to_install_it_and_exits_1(tmp_path: Path):
    out = tmp_path / "report"
    r = run_without(SIM_EXTRA, RUN_RAILYARD, ["simulate", "--no-progress", "--output", str(out)])
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("railyard: error: ")
    assert "pip install 'railyard[sim]'" in r.stderr
    assert not out.exists()


def test_each_missing_package_of_the_extra_is_named(tmp_path: Path):
    for name in sorted(SIM_EXTRA):
        r = run_without({name}, RUN_RAILYARD, ["simulate", "--output", str(tmp_path / name)])
        assert r.returncode == 1, r.stderr
        assert f"({name} is not installed)" in r.stderr


def test_other_commands_and_help_work_without_the_sim_extra():
    r = run_without(SIM_EXTRA, RUN_RAILYARD, ["simulate", "--help"])
    assert r.returncode == 0 and "--cluster" in r.stdout
    r = run_without(SIM_EXTRA, RUN_RAILYARD,
                    ["allocate", "--profile", "generic", "--request", "gpus=1"])
    assert r.returncode == 0, r.stderr
