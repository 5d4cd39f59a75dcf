"""Experiment loading: every bad input is one line naming the field and the valid choices."""
import textwrap

import pytest

from harness.experiment import spec
from harness.errors import SpecError

GOOD = """
name: softmax-test
op: softmax
baseline: torch
candidates: [triton]
sweep: {M: [4, 8], N: [16, 100]}
dtypes: [fp16, bfloat16]
smoke: {M: [2], N: [5], dtypes: [float16]}
"""


def load(tmp_path, text):
    p = tmp_path / "e.yaml"
    p.write_text(textwrap.dedent(text))
    return spec.load(p)


def error(tmp_path, text) -> str:
    with pytest.raises(SpecError) as exc:
        load(tmp_path, text)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_good_file_expands_in_a_stable_order(tmp_path):
    exp = load(tmp_path, GOOD)
    cases = spec.expand(exp)
    assert len(cases) == 2 * 2 * 2 * 2  # dtypes x M x N x impls
    assert cases[0].case_id == "torch.M=4.N=16.float16"
    assert cases[1].case_id == "triton.M=4.N=16.float16"
    assert cases[1].role == "candidate" and cases[0].role == "baseline"
    assert cases[-1].case_id == "triton.M=8.N=100.bfloat16"
    assert [c.case_id for c in spec.expand(exp)] == [c.case_id for c in cases]  # stable


def test_smoke_overrides_sweep_and_dtypes(tmp_path):
    cases = spec.expand(load(tmp_path, GOOD), smoke=True)
    assert [c.case_id for c in cases] == ["torch.M=2.N=5.float16", "triton.M=2.N=5.float16"]


def test_explicit_cases_with_fixed_params_and_smoke(tmp_path):
    exp = load(tmp_path, """
        name: t
        op: softmax
        baseline: torch
        cases: [{M: 1, N: 7}, {M: 3, N: 9}]
        smoke: {N: [2]}
        """)
    assert [c.shape_id for c in spec.expand(exp)] == ["M=1.N=7.float16", "M=3.N=9.float16"]
    assert [c.shape_id for c in spec.expand(exp, smoke=True)] == ["M=1.N=2.float16",
                                                                  "M=3.N=2.float16"]


def test_case_ids_avoid_ncu_filter_syntax(tmp_path):
    for c in spec.expand(load(tmp_path, GOOD)):
        assert not set(c.case_id) & set("/@,:[]+* ")


def test_select_by_glob(tmp_path):
    cases = spec.expand(load(tmp_path, GOOD))
    assert {c.impl for c in spec.select(cases, "triton.*")} == {"triton"}
    with pytest.raises(Exception, match="matches no case"):
        spec.select(cases, "nothing*")


@pytest.mark.parametrize("text, expected", [
    (GOOD.replace("op: softmax", "op: sofmax"), ["op:", "sofmax", "Registered ops:", "softmax"]),
    (GOOD.replace("candidates: [triton]", "candidates: [trition]"),
     ["candidates[0]", "trition", "registered:", "torch_compile"]),
    (GOOD.replace("baseline: torch", "baseline: cudnn"), ["baseline", "cudnn", "triton"]),
    (GOOD.replace("sweep: {M: [4, 8], N: [16, 100]}", "sweep: {}"), ["sweep: empty", "M, N"]),
    (GOOD.replace("N: [16, 100]", 'N: [16, "big"]'), ["sweep.N[1]", "expected integer", "big"]),
    (GOOD.replace("N: [16, 100]", "N: []"), ["sweep.N", "empty list"]),
    (GOOD.replace("dtypes: [fp16, bfloat16]", "dtypes: [fp16, fp8]"),
     ["dtypes[1]", "fp8", "float16, bfloat16, float32"]),
    (GOOD + "sweeep: {M: [1]}\n", ["unknown key 'sweeep'", "top level", "sweep"]),
    (GOOD + "timing: {warmup: 3}\n", ["unknown key 'warmup'", "timing", "warmup_ms"]),
    (GOOD.replace("sweep: {M: [4, 8], N: [16, 100]}", "sweep: {M: [4]}"),
     ["missing parameter 'N'"]),
    (GOOD.replace("sweep: {M: [4, 8], N: [16, 100]}", "sweep: {M: [4], N: [1], K: [2]}"),
     ["sweep.K", "unknown parameter", "M, N"]),
    (GOOD + "profile: {ncu: {sections: [SpeedOfLite]}}\n",
     ["profile.ncu.sections", "SpeedOfLite", "SpeedOfLight"]),
    (GOOD.replace("name: softmax-test\n", ""), ["name", "required"]),
    ("- just\n- a list\n", ["expected a mapping"]),
])
def test_bad_input_is_one_line_naming_field_and_choices(tmp_path, text, expected):
    msg = error(tmp_path, text)
    for part in expected:
        assert part in msg, (part, msg)


def test_yaml_syntax_error_names_the_line(tmp_path):
    msg = error(tmp_path, "name: x\nop: softmax\nsweep: {M: [1, 2}\n")
    assert "YAML syntax error at line 3" in msg


def test_missing_file():
    with pytest.raises(SpecError, match="no such experiment file"):
        spec.load("experiments/does-not-exist.yaml")


def test_every_committed_experiment_is_valid():
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parent.parent.glob("experiments/**/*.yaml"))
    assert files
    for f in files:
        exp = spec.load(f)
        assert spec.expand(exp) and (exp.smoke is None or spec.expand(exp, smoke=True))


def test_spec_hash_changes_with_content(tmp_path):
    a = load(tmp_path, GOOD)
    b = load(tmp_path, GOOD.replace("[4, 8]", "[4, 16]"))
    assert spec.spec_hash(a) != spec.spec_hash(b) and spec.spec_hash(a) == spec.spec_hash(a)
