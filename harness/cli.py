"""`python -m harness <verb>`: run, ab, list, show, doctor, calibrate, import, compare, report,
picks, new-op, dashboard (and the internal `worker`). User errors print one line and exit 2."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from harness.errors import HarnessError
from harness.store.option import add_store_argument


def _add_run(sub):
    p = sub.add_parser("run", help="check, time and profile the cases of an experiment")
    p.add_argument("experiment", nargs="?", help="experiment YAML (e.g. experiments/flash.yaml)")
    p.add_argument("--smoke", action="store_true", default=None,
                   help="use the experiment's smoke: overrides (automatic without a GPU)")
    p.add_argument("--cases", default=None, help="comma-separated globs over case ids")
    p.add_argument("--resume", metavar="RUN", default=None, help="finish an interrupted run")
    add_store_argument(p, out_alias=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="force a device (default: cuda when a GPU is present)")
    p.add_argument("--gpus", default=None, metavar="all|N|0,2",
                   help="one worker per GPU of this host; the cases are sharded over them")
    p.add_argument("--ray", default=None, metavar="ADDRESS|local",
                   help="run the cases as Ray tasks (pip install -e '.[ray]')")
    p.add_argument("--against", default=None, metavar="RUN|none|auto",
                   help="the run the since-last-run block compares with (default auto: the "
                        "latest earlier comparable run in --out; none: no block)")
    p.add_argument("--profile-harness", action="store_true",
                   help="run the driver and every worker under cProfile: "
                        "raw/harness_profile/<process>.pstats and .txt (where the harness's "
                        "own time goes; the run is slower, do not compare its numbers)")
    p.add_argument("--retune", action="store_true",
                   help="time the Tuners' candidates again even where the previous run of "
                        "unchanged code picked them (default: its picks are kept)")
    p.add_argument("--reprofile", action="store_true",
                   help="profile every case again (default: a case whose code, config and "
                        "compiled kernels are those of the previous run keeps its profile)")


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # a job scheduler's SIGTERM stops a run like Ctrl-C: partial, resumable


def _cmd_run(a, console: Console) -> int:
    import signal

    from harness.present import show

    from harness.execute import runner
    from harness.execute.runner import Interrupted

    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    if a.resume and a.experiment:
        raise HarnessError("run: give an experiment file or --resume RUN, not both")
    if not a.resume and not a.experiment:
        raise HarnessError("run: missing experiment file (e.g. experiments/flash.yaml) "
                           "or --resume RUN")
    try:
        if a.resume:
            run_dir = runner.resume(a.resume, out_root=a.store, console=console, gpus=a.gpus,
                                    ray=a.ray, against=a.against,
                                    profile_harness=a.profile_harness)
        else:
            run_dir = runner.start(a.experiment, out_root=a.store, smoke=a.smoke,
                                   cases_filter=a.cases, device=a.device, console=console,
                                   argv=sys.argv[1:], gpus=a.gpus, ray=a.ray,
                                   against=a.against, retune=a.retune, reprofile=a.reprofile,
                                   profile_harness=a.profile_harness)
    except Interrupted as exc:
        run_dir = exc.args[0] if exc.args else None
        console.print("[yellow]interrupted[/]: the partial run is stored; finish it with "
                      f"`python -m harness run --resume {run_dir or 'RUN'}`")
        return 130
    show.render(run_dir, console)
    console.print(f"run stored at [bold]{run_dir}[/]")
    return 0


def _cmd_list(a, console: Console) -> int:
    from rich.table import Table

    from harness.registry import describe, registry

    reg = registry()
    t = Table(title="ops and implementations", header_style="bold")
    cols = ("op", "impl", "backend", "params", "tunables", "description")
    for c in cols:
        t.add_column(c)
    for row in describe(reg):
        t.add_row(*(str(row[c]) for c in cols))
    console.print(t)
    for name, err in reg.broken.items():
        console.print(f"[red]kernels/{name} failed to import:[/] {err}")
    exps = sorted(Path(a.experiments).glob("**/*.yaml"))
    if exps:
        from harness.experiment import spec

        t = Table(title=f"experiments in {a.experiments}/", header_style="bold")
        for c in ("file", "name", "op", "baseline", "candidates", "cases"):
            t.add_column(c)
        for path in exps:
            try:
                exp = spec.load(path)
                n = len(spec.expand(exp))
                t.add_row(str(path), exp.name, exp.op, exp.baseline,
                          ", ".join(exp.impl_names()[1:]), str(n))
            except HarnessError as exc:
                t.add_row(str(path), "[red]invalid[/]", "", "", str(exc), "")
        console.print(t)
    _list_runs(a.store, console)
    return 0


LIST_RUNS = 15  # the newest runs `list` shows


def _list_runs(root: str, console: Console) -> None:
    """The newest runs of the store: the ids that show/compare/report take."""
    from rich.table import Table

    from harness import store

    runs = store.list_runs(root)
    if not runs:
        return
    # the heading on its own line: as a table title it would wrap at the table's width
    console.print(f"runs in {root}/ (newest {min(LIST_RUNS, len(runs))} of {len(runs)})",
                  style="bold", soft_wrap=True, markup=False)
    t = Table(header_style="bold")
    for c in ("run id", "experiment", "device", "status", "created (UTC)"):
        t.add_column(c)
    for r in reversed(runs[-LIST_RUNS:]):
        if r.get("error"):
            t.add_row(r["run_id"], "[red]unreadable[/]", "", "", "")
            continue
        t.add_row(r["run_id"], r.get("experiment") or "-",
                  r.get("gpu") or ("CPU" if r.get("device") == "cpu" else "-"),
                  r.get("status") or "-", (r.get("created") or "")[:19].replace("T", " "))
    console.print(t)


def _cmd_show(a, console: Console) -> int:
    from harness import store
    from harness.present import show

    run_dir = store.resolve_run(a.run, a.store)
    if a.format == "json":
        print(json.dumps(show.to_json(run_dir), indent=2, default=str))
    else:
        show.render(run_dir, console)
    return 0


def _cmd_import(a, console: Console) -> int:
    from harness.present import show
    from harness.profilers.importer import import_path

    run_dir = import_path(a.path, a.store, a.name, argv=["import", a.path])
    show.render(run_dir, console)
    console.print(f"imported into [bold]{run_dir}[/]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="harness", description=__doc__)
    sub = ap.add_subparsers(dest="verb", required=True)
    _add_run(sub)
    p = sub.add_parser("list", help="registered ops/implementations, experiment files and the "
                                    "newest runs of the store")
    p.add_argument("--experiments", default="experiments")
    add_store_argument(p)
    p = sub.add_parser("show", help="the summary of a stored run")
    p.add_argument("run", help="run id (under --store) or run directory")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_store_argument(p, out_alias=True)
    from harness.profilers import importer

    importer.add_arguments(sub.add_parser("import", help=importer.HELP))
    sub.add_parser("worker", help="(internal) the process that runs cases on the device",
                   add_help=False)
    for verb, modname in VERB_MODULES.items():
        mod = _verb_module(modname)
        if mod is None:
            continue
        p = sub.add_parser(verb, help=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return ap


def _verb_module(modname: str):
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec(modname) is None:
            return None
    except ModuleNotFoundError:  # parent package absent
        return None
    return importlib.import_module(modname)


COMMANDS = {"run": _cmd_run, "list": _cmd_list, "show": _cmd_show, "import": _cmd_import}

# Verbs implemented in their own modules. Each module defines
#   HELP: str, add_arguments(parser) -> None, main(args, console) -> int
# and raises HarnessError for user errors.
VERB_MODULES = {
    "ab": "harness.present.ab_show",
    "doctor": "harness.machine.doctor",
    "calibrate": "harness.execute.calibrate",
    "compare": "harness.present.compare_cli",
    "report": "harness.present.report",
    "picks": "harness.present.picks",
    "new-op": "harness.experiment.newop",
    "dashboard": "dashboard.launch",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        from harness.execute import worker_main

        return worker_main.main(argv[1:])
    console = Console(stderr=False, highlight=False)
    if not console.is_terminal:  # logs and CI: wide enough for the summary table
        console = Console(stderr=False, highlight=False, width=230)
    err = Console(stderr=True, highlight=False)
    try:
        a = build_parser().parse_args(argv)
        if getattr(a, "_module", None) is not None:
            return a._module.main(a, console)
        return COMMANDS[a.verb](a, console)
    except HarnessError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
