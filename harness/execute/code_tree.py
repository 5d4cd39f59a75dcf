"""Another commit's version of an op, imported beside the working tree's: what `harness ab`
times against the working tree (or against a second commit).

    tree = materialise(op_name, "HEAD~1", store_root)   # a JSON-able record, kept in the run's
                                                        # manifest as `code_tree`
    op = load_op(tree)                                  # that commit's Op, in this process
    op_for(manifest)                                    # a run's op: its tree's, else the
                                                        # registry's (the working tree)

Where the op comes from: the module that registered it (registry.modules: `kernels.softmax`,
or a module of $HARNESS_OPS living in the user's own repository), the git repository that
module's file lives in, and the folders on sys.path inside that repository (the module's own
root first). Of commit REV, `git archive` extracts the importable entries of those folders
(*.py files and packages, never the harness itself) into `<store>/.trees/<repo>-<sha>/`, kept
for later runs of the same commit.

How it is imported: under a package prefix of its own, `_kltree_<sha12>.kernels.softmax`, by a
finder on sys.meta_path that serves that prefix from the extracted folders. Every module of the
tree gets a `__builtins__` whose `__import__` maps the tree's top-level names (`kernels`,
`my_ops`, ...) into the prefix, so `from kernels._common import x` in the commit's code, at
import time or inside a function called later, reaches the commit's own `kernels`, while
`harness`, `torch` and `triton` stay the process's. Both versions then live side by side:
Triton compiles each from its own source (its cache is keyed by source: an unchanged kernel is
a cache hit), the code hash of each is its own source's. What this cannot redirect:
`importlib.import_module("kernels.x")` calls in the commit's code (they get the working tree's).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

from harness import store
from harness.errors import HarnessError

from harness.tuning.provenance import TREE_PREFIX as PREFIX
NEVER = ("harness", "dashboard")  # the harness's own packages: always the running one's
DONE = ".complete"


def _git(repo: Path, *args: str, binary: bool = False):
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                           text=not binary, timeout=120)
    except FileNotFoundError:
        raise HarnessError("ab: git is not installed (the base version comes from git)") \
            from None
    return r


def module_of(op_name: str) -> ModuleType:
    """The module that registered op `op_name` (imported by the registry)."""
    from harness.registry import registry

    reg = registry()
    reg.get_op(op_name)  # RegistryError naming the registered ops
    name = reg.modules.get(op_name)
    mod = sys.modules.get(name or "")
    if mod is None or not getattr(mod, "__file__", None):
        raise HarnessError(f"ab: op {op_name!r} was not registered from a module file")
    return mod


def repo_of(path: Path) -> Path:
    """The toplevel of the git repository holding `path` (HarnessError outside one)."""
    r = _git(path if path.is_dir() else path.parent, "rev-parse", "--show-toplevel")
    if r.returncode != 0:
        raise HarnessError(f"ab: {path} is not in a git repository (ab takes the other version "
                           f"of the op's code from git)")
    return Path(r.stdout.strip()).resolve()


def resolve(repo: Path, rev: str, flag: str = "--base") -> str:
    """The full sha of commit `rev` in `repo` (HarnessError naming the flag if there is none)."""
    r = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if r.returncode != 0 or not r.stdout.strip():
        raise HarnessError(f"ab: {flag} {rev}: not a commit of {repo} (valid: a commit, branch "
                           f"or tag, e.g. HEAD, HEAD~1, main)")
    return r.stdout.strip()


def _module_root(mod: ModuleType) -> Path:
    """The sys.path folder `mod` was imported from."""
    depth = len(mod.__name__.split("."))
    file = Path(mod.__file__).resolve()
    is_pkg = file.name == "__init__.py"
    return file.parents[depth if is_pkg else depth - 1]


def _roots(mod: ModuleType, repo: Path) -> list[str]:
    """The module's root and the other sys.path folders inside `repo`, relative to it."""
    out = [_module_root(mod)]
    for p in sys.path:
        try:
            q = Path(p or os.getcwd()).resolve()
        except OSError:
            continue
        if q.is_dir() and (q == repo or repo in q.parents):
            out.append(q)
    rels = []
    for q in out:
        try:
            rel = q.relative_to(repo).as_posix()
        except ValueError:
            continue
        rels.append("" if rel == "." else rel)
    return list(dict.fromkeys(rels))


def _entries(repo: Path, sha: str, roots: list[str]) -> tuple[list[str], list[str]]:
    """(top-level importable names, the paths to extract) of `roots` at commit `sha`."""
    r = _git(repo, "ls-tree", "-r", "--name-only", sha)
    if r.returncode != 0:
        raise HarnessError(f"ab: git ls-tree {sha[:12]} failed in {repo}: {r.stderr.strip()}")
    files = set(r.stdout.splitlines())
    tops, paths = [], []
    for root in roots:
        lead = f"{root}/" if root else ""
        for f in sorted(files):
            if not f.startswith(lead):
                continue
            rest = f[len(lead):].split("/")
            name = rest[0]
            if len(rest) == 1 and name.endswith(".py"):
                top, path = name[:-3], f
            elif len(rest) == 2 and rest[1] == "__init__.py":
                top, path = name, f"{lead}{name}"
            else:
                continue
            if top.isidentifier() and top not in NEVER and path not in paths:
                tops.append(top)
                paths.append(path)
    return list(dict.fromkeys(tops)), paths


def materialise(op_name: str, rev: str, store_root: str | Path, flag: str = "--base") -> dict:
    """Extract the op's code at commit `rev` (see the module docstring); the record a run keeps
    as `code_tree`: repo, rev, sha, path, roots, module, tops."""
    mod = module_of(op_name)
    repo = repo_of(Path(mod.__file__).resolve())
    sha = resolve(repo, rev, flag)
    roots = _roots(mod, repo)
    tops, paths = _entries(repo, sha, roots)
    dest = store.tree_dir(store_root, repo.name, sha)
    if not (dest / DONE).exists():
        _extract(repo, sha, paths, dest)
    rel_mod = mod.__name__
    return {"repo": str(repo), "rev": rev, "sha": sha, "path": str(dest.resolve()),
            "roots": roots, "module": rel_mod, "tops": tops}


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract with tarfile's "data" filter where this Python has it (3.11.4+, 3.12); before
    that, refuse any member that would land outside `dest` (an absolute name, `..`, a link
    out), which is what that filter guards against in a `git archive`."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = Path(dest).resolve()

    def inside(path: Path) -> bool:
        path = path.resolve()
        return path == root or root in path.parents

    for m in tar.getmembers():
        target = root / m.name
        ok = not m.name.startswith("/") and inside(target)
        if m.issym():  # a symlink's target is relative to its folder, a hard link's to the root
            ok = ok and inside(target.parent / m.linkname)
        elif m.islnk():
            ok = ok and inside(root / m.linkname)
        if not ok:
            raise HarnessError(f"ab: refusing archive member {m.name!r} (outside the tree)")
    tar.extractall(dest)


def _extract(repo: Path, sha: str, paths: list[str], dest: Path) -> None:
    r = _git(repo, "archive", "--format=tar", sha, "--", *paths, binary=True)
    if r.returncode != 0:
        raise HarnessError(f"ab: git archive {sha[:12]} failed in {repo}: "
                           f"{r.stderr.decode(errors='replace').strip()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        _safe_extract(tar, tmp)
    (tmp / DONE).write_text(sha + "\n")
    try:
        os.replace(tmp, dest)
    except OSError:  # another process extracted the same commit meanwhile: keep theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# -- importing a tree --------------------------------------------------------------------------

class _Loader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, finder: "_Finder"):
        super().__init__(fullname, path)
        self.finder = finder

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = self.finder.builtins
        super().exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Serves `<prefix>.<top>...` from the tree's root folders."""

    def __init__(self, prefix: str, roots: list[str], tops: list[str]):
        import builtins

        self.prefix, self.roots, self.tops = prefix, roots, set(tops)
        real = builtins.__import__

        def tree_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and name.partition(".")[0] in self.tops:
                mod = real(f"{prefix}.{name}", globals, locals, fromlist, 0)
                return mod if fromlist else sys.modules[f"{prefix}.{name.partition('.')[0]}"]
            return real(name, globals, locals, fromlist, level)

        self.builtins = {**builtins.__dict__, "__import__": tree_import}

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.prefix:
            return importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        if not fullname.startswith(self.prefix + "."):
            return None
        rel = fullname[len(self.prefix) + 1:].split(".")
        if len(rel) == 1:
            if rel[0] not in self.tops:
                return None
            dirs = self.roots
        else:
            parent = sys.modules.get(fullname.rpartition(".")[0])
            dirs = list(getattr(parent, "__path__", None) or [])
        for d in dirs:
            pkg = Path(d) / rel[-1]
            init = pkg / "__init__.py"
            if init.is_file():
                return importlib.util.spec_from_file_location(
                    fullname, init, loader=_Loader(fullname, str(init), self),
                    submodule_search_locations=[str(pkg)])
            src = Path(d) / f"{rel[-1]}.py"
            if src.is_file():
                return importlib.util.spec_from_file_location(
                    fullname, src, loader=_Loader(fullname, str(src), self))
        return None


def prefix_of(tree: dict) -> str:
    return f"{PREFIX}{tree['sha'][:12]}"


def load_module(tree: dict) -> ModuleType:
    """The tree's op module, imported under its own prefix (once per process)."""
    prefix = prefix_of(tree)
    base = Path(tree["path"])
    if not (base / DONE).exists():
        raise HarnessError(f"the code tree of commit {tree['sha'][:12]} is no longer at {base} "
                           f"(run `harness ab` again)")
    if not any(isinstance(f, _Finder) and f.prefix == prefix for f in sys.meta_path):
        roots = [str(base / r) if r else str(base) for r in tree["roots"]]
        sys.meta_path.insert(0, _Finder(prefix, roots, tree["tops"]))
    try:
        return importlib.import_module(f"{prefix}.{tree['module']}")
    except HarnessError:
        raise
    except Exception as exc:
        from harness.errors import exception_line

        raise HarnessError(f"ab: {tree['module']} at {tree['rev']} ({tree['sha'][:12]}) does "
                           f"not import: {exception_line(exc, 300)}") from None


def load_op(tree: dict):
    from harness.registry import Op

    op = getattr(load_module(tree), "op", None)
    if not isinstance(op, Op):
        raise HarnessError(f"ab: {tree['module']} at {tree['rev']} defines no `op` (an "
                           f"harness.registry.Op)")
    return op


def op_for(manifest: dict):
    """The op a run measures: its `code_tree`'s (a version `harness ab` took from git), else
    the registry's."""
    tree = manifest.get("code_tree")
    if tree:
        return load_op(tree)
    from harness.registry import get_op

    return get_op(manifest["experiment"]["op"])
