"""What a user's $HARNESS_OPS module can get wrong is one line, exit 2, nothing written: it does
not import (its traceback's last line, with the file:line), registers no op, registers a name
twice, or has an impl whose signature cannot take the op's inputs."""
from __future__ import annotations

import sys
import textwrap

import pytest

import harness.registry as reg
from harness.errors import RegistryError

OP_HEAD = """
import torch
from harness.registry import Op, Param

op = Op("{name}", params=[Param("N", int)], dtypes=("float32",))
op.inputs(lambda p, dtype, device, gen: (torch.randn(p.N), torch.randn(p.N)))
op.bytes(lambda p, itemsize: 3.0 * p.N * itemsize)


@op.reference
def reference(a, b):
    return a + b
"""


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """write(name, text) puts a module in tmp_path; load(entries) registers HARNESS_OPS."""
    written = []

    def write(name: str, text: str):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        written.append(name)
        return tmp_path / f"{name}.py"

    def load(entries: str):
        monkeypatch.setenv("HARNESS_OPS", entries)
        monkeypatch.setattr(reg, "_REGISTRY", None)
        return reg.registry()

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write, load
    for name in written:
        sys.modules.pop(name, None)


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_a_module_that_does_not_import_says_its_tracebacks_last_line_and_where(user_modules):
    write, load = user_modules
    path = write("u_broken", OP_HEAD.format(name="u1") + "\nx = undefined_name + 1\n")
    with pytest.raises(RegistryError) as exc:
        load(str(path))
    msg = _one_line(exc)
    assert msg.startswith(f"HARNESS_OPS: {path}: module 'u_broken' failed to import: ")
    assert msg.endswith("NameError: name 'undefined_name' is not defined (u_broken.py:14)")
    write("u_syntax", "def f(:\n    pass\n")
    with pytest.raises(RegistryError) as exc:
        load("u_syntax")
    assert "SyntaxError" in _one_line(exc) and "(u_syntax.py:1)" in str(exc.value)
    with pytest.raises(RegistryError) as exc:
        load("u_nowhere")
    assert "no module named 'u_nowhere'" in _one_line(exc)
    assert reg._REGISTRY is None  # nothing half-registered stays behind


def test_a_module_without_an_op_and_an_op_registered_twice(user_modules):
    write, load = user_modules
    write("u_empty", "import torch\nVALUE = 1\n")
    with pytest.raises(RegistryError) as exc:
        load("u_empty")
    assert "module 'u_empty' registers no op" in _one_line(exc)
    write("u_a", OP_HEAD.format(name="dup"))
    write("u_b", OP_HEAD.format(name="dup"))
    with pytest.raises(RegistryError) as exc:
        load("u_a,u_b")
    assert _one_line(exc) == ("op 'dup' is registered twice: by module 'u_a' and by module "
                              "'u_b'; rename one")
    write("u_soft", OP_HEAD.format(name="softmax"))
    with pytest.raises(RegistryError) as exc:
        load("u_soft")
    assert "op 'softmax' is registered twice: by kernels/softmax and by module 'u_soft'" in \
        _one_line(exc)
    write("u_impl2", OP_HEAD.format(name="u2") + textwrap.dedent("""
        op.impl("t", backend="torch")(lambda a, b: a + b)
        op.impl("t", backend="torch")(lambda a, b: a + b)
        """))
    with pytest.raises(RegistryError) as exc:
        load("u_impl2")
    assert "ValueError: op 'u2': implementation 't' registered twice (u_impl2.py:15)" in \
        _one_line(exc)


@pytest.mark.parametrize("impl, expected", [
    ("def one(a):\n    return a", "impl 'bad': one(a) cannot take the op's inputs as its "
                                   "reference reference(a, b) does: too many positional"),
    ("def no_out(a, b):\n    return a + b", "(and out=, accepts_out=True): got an unexpected "
                                            "keyword argument 'out'"),
])
def test_an_impl_whose_signature_cannot_take_the_inputs(user_modules, impl, expected):
    write, load = user_modules
    accepts = "accepts_out=True" if "no_out" in impl else "accepts_out=False"
    write("u_sig", OP_HEAD.format(name="u3") + textwrap.dedent(f"""
        op.impl("good", backend="torch")(lambda a, b, *, out=None: a + b)
        """) + f"\n\n@op.impl('bad', backend='torch', {accepts})\n{impl}\n")
    with pytest.raises(RegistryError) as exc:
        load("u_sig")
    msg = _one_line(exc)
    assert msg.startswith("HARNESS_OPS: u_sig: op 'u3': ") and expected in msg, msg


def test_the_cli_says_it_in_one_line_with_exit_2_and_writes_nothing(user_modules, tmp_path,
                                                                     capsys):
    from harness.cli import main

    write, load = user_modules
    path = write("u_cli", "import torch\nraise RuntimeError('no GPU kernels here')\n")
    exp = tmp_path / "e.yaml"
    exp.write_text("name: e\nop: u\nbaseline: torch\nsweep: {N: [8]}\n")
    store = tmp_path / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_OPS", str(path))
        mp.setattr(reg, "_REGISTRY", None)
        assert main(["run", str(exp), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: HARNESS_OPS: {path}: module 'u_cli' "
                                               "failed to import: RuntimeError: no GPU")
    assert err[0].endswith("(u_cli.py:2)") and not store.exists()


def test_every_op_in_this_repository_passes_the_checks():
    from harness.op_checks import op_problem

    r = reg.registry()
    assert not r.broken
    assert all(op_problem(op) is None for op in r.ops.values())
