"""The commands in README.md and docs/*.md cannot rot.

Every `python -m harness ...` command in a shell code block (```bash, ```sh, ```shell or
```console) of those files is

(a) parsed with the CLI's own argparse parser (harness.cli.build_parser), so an unknown verb or
    option fails;
(b) checked for the files it names: experiment YAMLs, runs (ids under the store it names, or run
    directories), files to import, folders to list;
(c) executed for real on the CPU when it is cheap (EXECUTED), in this process, against a copy of
    the few committed example runs the docs name (runs/examples/), placeholders such as
    <run-id> replaced by a real run id. Anything it writes goes to a temporary folder: the store
    options point there, `report` gets an --out there, and `~` is a temporary home.

Commands that need a GPU or a long run are only parsed and checked (VALIDATED_ONLY says why for
each verb). Also checked here: repository paths written in backticks and relative links (with
their #anchors) resolve, excerpts of committed reports quoted in a ```markdown block are
verbatim, `python -m MODULE` names an importable module, the docs index lists every page, and the
README stays a guide (at most 200 lines, the two set-up commands first).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "runs" / "examples"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
HARNESS = ["python", "-m", "harness"]

pytestmark = pytest.mark.xdist_group("docs")  # one process builds the sandbox once

# Placeholders the docs may write in commands, and the committed example runs they stand for:
# the layernorm backward's last two runs (12 cases each; the second's since block names the
# first), small enough that show / compare / report take a second each.
PLACEHOLDERS = {
    "<run-id>": "20261124T162130Z-layernorm-bwd-db9b",
    "<before-id>": "20261124T071454Z-layernorm-bwd-9489",
    "<after-id>": "20261124T162130Z-layernorm-bwd-db9b",
}

# Verbs run for real (in this process, on the CPU, seconds each).
EXECUTED = {"list", "show", "compare", "report", "picks", "import", "new-op", "doctor"}
# Verbs only parsed and checked, and why.
VALIDATED_ONLY = {
    "run": "a run starts worker processes and takes 10 s to minutes even on the smoke sweep; "
           "the README's flash.yaml smoke run is executed by the cpu_flash_run fixture "
           "(tests/conftest.py), the softmax one by tests/test_cli.py, new-op's experiment by "
           "tests/test_new_op.py",
    "dashboard": "it serves until stopped; tests/dashboard/test_dashboard_browser.py serves it "
                 "and loads it in Chromium",
    "calibrate": "it needs a CUDA device (on the CPU it exits 2 by design)",
    "ab": "it times two versions of the kernels (a run, not a cheap read); tests/test_ab.py "
          "runs it end to end on the CPU",
}
RUN_ID = re.compile(r"\b\d{8}T\d{6}Z-[A-Za-z0-9_.-]+-[0-9a-f]{4}\b")


# -- reading the docs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    doc: Path
    line: int          # 1-based line of the opening fence
    info: str
    lines: tuple[str, ...]
    before: str        # the paragraph just above the fence


@dataclass(frozen=True)
class Command:
    block: Block
    line: int          # 1-based line where the command starts
    tokens: tuple[str, ...]  # python -m harness VERB ... (shell comments removed)

    @property
    def where(self) -> str:
        return f"{self.block.doc.relative_to(ROOT)}:{self.line}"

    @property
    def verb(self) -> str:
        return self.tokens[3] if len(self.tokens) > 3 else ""

    def __str__(self) -> str:
        return shlex.join(self.tokens)


def blocks(doc: Path) -> list[Block]:
    out, lines = [], doc.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(```+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        para = []
        while k >= 0 and lines[k].strip():
            para.insert(0, lines[k])
            k -= 1
        out.append(Block(doc, start + 1, info, tuple(lines[start + 1:j]), "\n".join(para)))
        i = j + 1
    return out


def segments(block: Block) -> list[tuple[int, list[str]]]:
    """(line, tokens) of each simple command in a shell block: continuation lines joined, `$ `
    prompts and comments removed, `&&`, `||`, `;` and `|` lists split."""
    out = []
    i = 0
    while i < len(block.lines):
        line_no, text = block.line + 1 + i, block.lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(block.lines):
            i += 1
            text = text.rstrip()[:-1] + " " + block.lines[i]
        i += 1
        text = re.sub(r"^\s*\$\s+", "", text)
        if not text.strip():
            continue
        cur: list[str] = []
        try:
            toks = shlex.split(text, comments=True)
        except ValueError as exc:
            raise ValueError(f"{block.doc.relative_to(ROOT)}:{line_no}: {exc}: {text}") from None
        for tok in toks:
            if tok in ("&&", "||", ";", "|"):
                out.append((line_no, cur))
                cur = []
            else:
                cur.append(tok)
        out.append((line_no, cur))
    return [(n, t) for n, t in out if t]


def commands() -> list[Command]:
    out = []
    for doc in DOCS:
        for b in blocks(doc):
            if b.info not in SHELL_FENCES:
                continue
            out += [Command(b, n, tuple(t)) for n, t in segments(b) if t[:3] == HARNESS]
    return out


COMMANDS = commands()
BY_ID = {f"{c.where} {c.verb}": c for c in COMMANDS}
EXECUTED_IDS = [k for k, c in BY_ID.items() if c.verb in EXECUTED]


def _substituted(cmd: Command) -> list[str]:
    """argv after `python -m harness`, placeholders replaced by real run ids."""
    argv = []
    for tok in cmd.tokens[3:]:
        for ph, run_id in PLACEHOLDERS.items():
            tok = tok.replace(ph, run_id)
        if re.search(r"<[\w-]+>", tok):
            pytest.fail(f"{cmd.where}: `{cmd}`: unknown placeholder in {tok!r}; add it to "
                        "PLACEHOLDERS in tests/test_docs.py")
        argv.append(tok)
    return argv


def _parser():
    from harness.cli import build_parser

    return build_parser()


def _verbs() -> set[str]:
    import argparse

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def _parse(cmd: Command, argv: list[str] | None = None):
    argv = _substituted(cmd) if argv is None else argv
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{cmd.where}: `{cmd}` does not parse: {err.getvalue().strip()}")


# -- (a) every command parses ----------------------------------------------------------------------

def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20, [str(c) for c in COMMANDS]
    assert len(BY_ID) == len(COMMANDS), "two commands of one verb on one line: split them"
    assert {"run", "show", "compare", "report", "new-op"} <= {c.verb for c in COMMANDS}


def test_commands_are_in_shell_blocks():
    """A command in a block of another kind would escape this test: mark the block ```bash."""
    for doc in DOCS:
        for b in blocks(doc):
            if b.info not in SHELL_FENCES:
                for i, line in enumerate(b.lines):
                    assert not re.match(r"^\s*(\$\s+)?python -m harness ", line), (
                        f"{doc.relative_to(ROOT)}:{b.line + 1 + i}: a command in a "
                        f"```{b.info} block; make it ```bash")


@pytest.mark.parametrize("key", list(BY_ID))
def test_command_parses(key):
    cmd = BY_ID[key]
    assert cmd.verb in EXECUTED or cmd.verb in VALIDATED_ONLY, (
        f"{cmd.where}: `{cmd}`: verb {cmd.verb!r} is neither executed nor listed as validated "
        "only in tests/test_docs.py; decide which")
    _parse(cmd)


# -- (b) the files a command names exist ---------------------------------------------------------

def _run_exists(ref: str, store_dir: str) -> bool:
    from harness import store
    from harness.errors import HarnessError

    try:
        store.resolve_run(ref, ROOT / store_dir)
        return True
    except HarnessError:
        return False


def _named_inputs(cmd: Command, a) -> tuple[str, list[tuple[str, str]]]:
    """(the store, [(kind, value)]) of what a parsed command reads: file, dir, path (either) or
    run.
    Placeholders (<run-id>) and paths in the user's home (~/) are left out."""
    store_dir = getattr(a, "store", None) or "runs"
    if isinstance(store_dir, list):  # dashboard: repeatable
        store_dir = store_dir[0]
    out = []
    revs = cmd.verb == "ab"  # ab's --base/--head are git revisions, not runs
    for attr, kind in (("experiment", "file"), ("path", "path"), ("experiments", "dir"),
                       ("run", "run"), ("base", "rev" if revs else "run"), ("cand", "run"),
                       ("resume", "run")):
        v = getattr(a, attr, None)
        if isinstance(v, str) and v:
            out.append((kind, v))
    against = getattr(a, "against", None)
    if against and against not in ("none", "auto"):
        out.append(("run", against))
    if cmd.verb in ("show", "compare", "report", "picks", "list"):
        out.append(("dir", store_dir))  # a store to read
    return store_dir, [(k, v) for k, v in out if "<" not in v and not v.startswith("~")]


def git_rev_syntax_ok(rev: str) -> bool:
    """HEAD~1, main, a tag or a hash: what `git rev-parse` accepts in a full clone (CI's clone may
    be shallow, so the revision itself is not looked up)."""
    return bool(re.fullmatch(r"[A-Za-z0-9_./@{}-]+([~^][0-9]*)*", rev)) and ".." not in rev


@pytest.mark.parametrize("key", list(BY_ID))
def test_command_names_existing_files(key, sandbox, monkeypatch):
    cmd = BY_ID[key]
    monkeypatch.chdir(ROOT)
    store_dir, named = _named_inputs(cmd, _parse(cmd, list(cmd.tokens[3:])))
    for kind, value in named:
        if kind == "run":
            assert _run_exists(value, store_dir), (
                f"{cmd.where}: `{cmd}`: no run {value!r} under {store_dir}/ nor as a directory")
        elif kind == "rev":  # a revision the user names: only its syntax can be checked
            assert git_rev_syntax_ok(value), f"{cmd.where}: `{cmd}`: {value!r} is no revision"
        elif kind == "dir":
            assert (ROOT / value).is_dir(), f"{cmd.where}: `{cmd}`: no folder {value}"
        elif kind == "file":
            assert (ROOT / value).is_file(), f"{cmd.where}: `{cmd}`: no file {value}"
        else:
            assert (ROOT / value).exists(), f"{cmd.where}: `{cmd}`: no file or folder {value}"
    toks = cmd.tokens[3:]
    for prev, tok in zip(("",) + toks, toks):  # in the user's home: made by a command above
        if tok.startswith("~/") and prev not in ("--dir", "--out"):
            _run_block_before(sandbox, cmd)
            assert (sandbox.home / tok[2:]).exists(), (
                f"{cmd.where}: `{cmd}`: {tok} does not exist after the commands above it ran")


# -- (c) the cheap commands run ------------------------------------------------------------------

@dataclass
class Sandbox:
    root: Path
    store: Path
    home: Path
    results: dict


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    root = tmp_path_factory.mktemp("docs")
    sb = Sandbox(root, root / "runs", root / "home", {})
    sb.store.mkdir()
    sb.home.mkdir()
    needed = set(PLACEHOLDERS.values())
    for c in COMMANDS:
        if c.verb in EXECUTED:
            needed |= set(RUN_ID.findall(" ".join(c.tokens)))
    for run_id in sorted(needed):
        src = EXAMPLES / run_id
        assert (src / "manifest.json").is_file(), f"the docs name {run_id}: not in runs/examples/"
        shutil.copytree(src, sb.store / run_id)
        against = (json.loads((src / "manifest.json").read_text()).get("against") or {})
        prev = against.get("run_id")
        if prev and (EXAMPLES / prev).is_dir() and not (sb.store / prev).exists():
            shutil.copytree(EXAMPLES / prev, sb.store / prev)  # for its since block
    return sb


WRITERS = {"new-op"}  # executed verbs whose files later commands of their block read


def _run_block_before(sb: Sandbox, cmd: Command) -> None:
    """Execute what `cmd`'s block writes above it (new-op before the files it writes)."""
    for c in COMMANDS:
        if c.block == cmd.block and c.line < cmd.line and c.verb in WRITERS:
            execute(sb, c)


def _sandboxed(sb: Sandbox, cmd: Command) -> list[str]:
    """The command's argv with every place it writes or reads a store moved into the sandbox."""
    argv = _substituted(cmd)
    verb, out, i = argv[0], [], 0
    while i < len(argv):
        tok = argv[i]
        opt, eq, val = tok.partition("=")
        if opt in ("--store", "--out", "--dir") and (eq or i + 1 < len(argv)):
            if not eq:
                val, i = argv[i + 1], i + 1
            if opt == "--out" and verb == "report":
                val = str(sb.root / "reports" / Path(val).name)
            elif opt == "--dir":
                val = str(sb.home / val[2:]) if val.startswith("~/") else str(sb.root / val)
            else:
                val = str(sb.store)
            out += [opt, val]
        elif tok.startswith("~/"):
            out.append(str(sb.home / tok[2:]))
        elif tok.startswith("runs/") and RUN_ID.search(tok):
            out.append(str(sb.store / RUN_ID.search(tok).group(0)))
        else:
            out.append(tok)
        i += 1
    a = _parse(cmd, out)
    store_given = "--store" in out or (verb != "report" and "--out" in out)
    if hasattr(a, "store") and not store_given:
        out += ["--store", str(sb.store)]
    if verb == "report":
        if "--out" not in out:
            out += ["--out", str(sb.root / "reports" / Path(a.run).name)]
        out.append("--no-png")  # kaleido starts Chromium per chart; test_report.py covers PNGs
    if verb == "new-op" and "--dir" not in out:
        pytest.fail(f"{cmd.where}: `{cmd}`: new-op without --dir writes into the repository; "
                    "show it with --dir in the docs")
    return out


def execute(sb: Sandbox, cmd: Command) -> tuple[int, str]:
    """Run the command in this process (once per distinct argv): (exit code, stdout + stderr)."""
    argv = _sandboxed(sb, cmd)
    key = tuple(argv)
    if key not in sb.results:
        from harness.cli import main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = main(argv)
        sb.results[key] = (rc, buf.getvalue(), argv)
    return sb.results[key][:2]


@pytest.mark.parametrize("key", EXECUTED_IDS)
def test_cheap_command_runs(key, sandbox, monkeypatch):
    cmd = BY_ID[key]
    monkeypatch.chdir(ROOT)
    _run_block_before(sandbox, cmd)
    rc, out = execute(sandbox, cmd)
    assert rc == 0, f"{cmd.where}: `{cmd}` exited {rc}:\n{out[-3000:]}"
    assert out.strip(), f"{cmd.where}: `{cmd}` printed nothing"
    argv = _sandboxed(sandbox, cmd)
    a = _parse(cmd, argv)
    if cmd.verb == "show":
        assert Path(a.run).name in out
    elif cmd.verb == "compare":
        assert "pairs" in out
    elif cmd.verb == "report":
        assert (Path(a.out) / "report.md").is_file()
    elif cmd.verb == "import":
        assert "imported into" in out
    elif cmd.verb == "new-op":
        assert (Path(a.dir) / f"{a.name}.yaml").is_file()
    elif cmd.verb == "picks":
        assert "config" in out


# -- the prose around the commands -----------------------------------------------------------------

TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}


def _outside_fences(doc: Path) -> str:
    text = doc.read_text(encoding="utf-8")
    return re.sub(r"^\s*```.*?^\s*```[^\n]*$", "", text, flags=re.S | re.M)


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]+)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in _expand(path[:m.start()] + alt
                                                                 + path[m.end():])]


def _is_placeholder(path: str) -> bool:
    words = [w for p in path.split("/") for w in re.split(r"[_.-]", Path(p).stem)]
    return (bool(re.search(r"[<>*…]", path))
            or any(re.fullmatch(r"[A-Z]{2,}|[A-Z]", w) and w != "README" for w in words))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_in_backticks_exist(doc):
    missing = []
    for span in re.findall(r"`([^`\n]+)`", _outside_fences(doc)):
        first = span.split()[0] if span.split() else ""
        if "/" not in first or first.split("/")[0] not in TOP or _is_placeholder(first):
            continue
        for path in _expand(first.rstrip(".,:;")):
            if not (ROOT / path).exists():
                missing.append(path)
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in _outside_fences(doc).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _outside_fences(doc)):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(target)
    assert not bad, f"{doc.relative_to(ROOT)}: broken links {bad}"


def test_quoted_report_excerpts_are_verbatim():
    checked = 0
    for doc in DOCS:
        for b in blocks(doc):
            if b.info != "markdown":
                continue
            sources = [s for s in re.findall(r"`([^`\s]+\.md)`", b.before)
                       if (ROOT / s).is_file()]
            assert len(sources) == 1, (f"{doc.relative_to(ROOT)}:{b.line}: a ```markdown "
                                       "excerpt names the one committed file it quotes")
            text = set((ROOT / sources[0]).read_text(encoding="utf-8").splitlines())
            for line in b.lines:
                if line.strip() and line.strip() not in ("…", "..."):
                    assert line in text, (f"{doc.relative_to(ROOT)}:{b.line}: not in "
                                          f"{sources[0]}: {line!r}")
            checked += 1
    assert checked >= 1  # the README quotes a report


def test_python_modules_run_by_the_docs_exist():
    import importlib.util

    for doc in DOCS:
        for b in blocks(doc):
            if b.info not in SHELL_FENCES:
                continue
            for line, toks in segments(b):
                if toks[:2] == ["python", "-m"] and toks[2] not in ("harness", "pytest"):
                    assert importlib.util.find_spec(toks[2]) is not None, (
                        f"{doc.relative_to(ROOT)}:{line}: no module {toks[2]}")


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name == "README.md":
            continue
        assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


def test_the_readme_is_a_guide_with_the_two_commands_first():
    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 200
    shell = [b for b in blocks(readme) if b.info in SHELL_FENCES]
    assert [b.lines for b in shell[:2]] == [
        ("pip install torch==2.13.0 && pip install -e . && "
         "python -m harness run experiments/flash.yaml",),
        ("bash tests/run.sh",)]
    assert (ROOT / "docs" / "img" / "dashboard.png").stat().st_size <= 300_000
    assert "](docs/img/dashboard.png)" in readme.read_text(encoding="utf-8")
