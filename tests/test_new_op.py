"""`python -m harness new-op NAME [--dir DIR]`: the op it writes outside the repository runs on
the CPU at once and passes its own test; in the repository it would write kernels/NAME/,
experiments/NAME.yaml and tests/kernels/test_NAME.py; bad names and existing files are one-line
errors (exit 2) that write nothing."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from harness import store

from harness.experiment import newop
from harness.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def new_op(tmp_path_factory):
    """new-op swiglu_mine --dir <tmp> (in this process), then the written experiment run on the
    CPU and the written test run by pytest (one subprocess each)."""
    folder = tmp_path_factory.mktemp("my_kernels")
    out = io.StringIO()
    args = build_parser().parse_args(["new-op", "swiglu_mine", "--dir", str(folder)])
    assert newop.main(args, Console(file=out, width=200)) == 0
    env = {**os.environ, "HARNESS_OPS": str(folder / "swiglu_mine.py"), "COLUMNS": "200",
           "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the written test sets it itself without a GPU
    store_dir = folder / "runs"
    run = subprocess.run([sys.executable, "-m", "harness", "run", str(folder / "swiglu_mine.yaml"),
                          "--store", str(store_dir)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(folder / "test_swiglu_mine.py")], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    return folder, out.getvalue(), run, test, store_dir


def test_new_op_writes_a_harness_ops_module_its_yaml_and_its_test(new_op):
    folder, stdout, *_ = new_op
    assert sorted(p.name for p in folder.iterdir() if p.suffix in (".py", ".yaml")) == [
        "swiglu_mine.py", "swiglu_mine.yaml", "test_swiglu_mine.py"]
    assert f"export HARNESS_OPS={folder / 'swiglu_mine.py'}" in stdout
    text = (folder / "swiglu_mine.py").read_text()
    assert "@triton.autotune(" in text and 'op = Op(\n    "swiglu_mine"' in text


def test_the_written_experiment_runs_on_the_cpu_right_away(new_op):
    *_, run, _, store_dir = new_op
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (run_dir,) = [p for p in store_dir.iterdir() if (p / "manifest.json").exists()]
    cases = store.load_cases(run_dir)
    res = store.load_results(run_dir)
    assert set(cases.impl) == {"torch", "triton"} and (cases.status == "ok").all()
    assert res.correct.all() and len(res) == 4  # 2 impls x the 2 smoke sizes
    triton = res[res.case_id.str.startswith("triton.")]
    assert set(triton.config_source) == {"interpreter"}


def test_the_written_test_passes(new_op):
    *_, test, _ = new_op
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]
    assert "11 passed" in test.stdout  # 2 impls x 3 sizes, 4 autotune configs, the counts


def test_in_the_repository_it_writes_a_kernels_folder_an_experiment_and_a_test():
    files = newop.plan("not_yet_an_op", None)
    assert [p.relative_to(ROOT).as_posix() for p in files] == [
        "kernels/not_yet_an_op/__init__.py", "experiments/not_yet_an_op.yaml",
        "tests/kernels/test_not_yet_an_op.py"]
    text = list(files.values())
    compile(text[0], "op", "exec")
    compile(text[2], "test", "exec")
    assert "from kernels.not_yet_an_op import op as OP" in text[2]
    assert not (ROOT / "kernels" / "not_yet_an_op").exists()  # planned, not written


@pytest.mark.parametrize("args, expected", [
    (["new-op", "Swi-GLU"], "'Swi-GLU' is not a lower-case Python identifier"),
    (["new-op", "softmax"], "op 'softmax' is already registered (by kernels/softmax)"),
    (["new-op", "json", "--dir", "{tmp}"], "a module named 'json' already exists"),
    (["new-op", "taken", "--dir", "{tmp}"], "taken.yaml already exists; nothing written"),
])
def test_bad_names_and_existing_files_are_one_line_errors(tmp_path, capsys, args, expected):
    from harness.cli import main

    (tmp_path / "taken.yaml").write_text("mine\n")
    before = sorted(tmp_path.iterdir())
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert sorted(tmp_path.iterdir()) == before and (tmp_path / "taken.yaml").read_text() == "mine\n"
