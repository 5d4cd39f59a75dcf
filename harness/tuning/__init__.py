"""Launch configurations between the harness and the kernels' Tuners (kernels/_tuner.py).

The worker tells a Tuner which configuration to use and learns which one it used through this
module's state alone (nothing here imports kernels/):

    with forcing({"attention.flash_fwd": {"BLOCK_M": 64}}), recording() as log:
        fn()                      # Tuner.pick returns a config with BLOCK_M=64 and logs it
    log.configs()                 # {"attention.flash_fwd": {"BLOCK_M": 64, "BLOCK_N": ...}}
    log.source()                  # "forced"

Picks timed by one worker are persisted in the run directory (store.save_tuner_picks) and
loaded by the next (`load_picks`), so the time, ncu and nsys passes reuse the check pass's
choice without timing again: `stored_pick` answers before a Tuner times anything.

config_source of a pick (SOURCES, strongest first; a case's source is the strongest of its
picks): forced (the YAML fixed it, wholly or in part) | tuned (timed on the GPU) | autotune (a
`triton.autotune` kernel's choice: harness.tuning.autotune) | single (one candidate) |
interpreter (the CPU interpreter's untimed default). A pick made while the call is set up,
outside the measured region (`setup()`), is not the case's: it is not logged.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Generic, Iterator, TypeVar

SOURCES = ("forced", "tuned", "autotune", "single", "interpreter")

T = TypeVar("T")


class _ProcessVar(Generic[T]):
    """A ContextVar's get/set/reset with one value for the whole process, seen from every thread.

    A worker runs one case at a time, but not all of a case on its own thread: autograd runs a
    CUDA backward on its device thread (`pt_autograd_<device>`), which never saw a ContextVar set
    by the worker's thread. With ContextVars, a YAML config forced on the flash backward's
    Tuners was silently ignored there (all 60 variants of a dK/dV and dQ grid timed the Tuner's
    own pick), its picks went unrecorded (no provenance) and compile-ahead workers timed."""

    def __init__(self, default: T):
        self._value = default

    def get(self) -> T:
        return self._value

    def set(self, value: T) -> T:
        old, self._value = self._value, value
        return old

    def reset(self, token: T) -> None:
        self._value = token

    @contextmanager
    def holding(self, value: T) -> Iterator[T]:
        """`value` for the block, the earlier one again after it."""
        token = self.set(value)
        try:
            yield value
        finally:
            self.reset(token)


_FORCED: _ProcessVar[dict | None] = _ProcessVar(None)
_COMPILE_ONLY: _ProcessVar[bool] = _ProcessVar(False)
_SETUP: _ProcessVar[bool] = _ProcessVar(False)
_LOG: _ProcessVar["PickLog | None"] = _ProcessVar(None)
_UNLOGGED: _ProcessVar[bool] = _ProcessVar(False)  # picks kept out of the log (unlogged())

# tuner name -> repr(key) -> {"config": {field: value}, "source": str}
_STORED: dict[str, dict[str, dict]] = {}
_NEW: dict[str, dict[str, dict]] = {}


# -- forced configurations ---------------------------------------------------------------------

@contextmanager
def forcing(configs: dict[str, dict[str, Any]] | None) -> Iterator[None]:
    """Within the block, `Tuner.pick` of tuner `name` returns a config with the fields of
    `configs[name]` (all of them: that config; some: the best candidate matching them)."""
    with _FORCED.holding({k: dict(v) for k, v in (configs or {}).items() if v} or None):
        yield


def forced(tuner: str) -> dict[str, Any] | None:
    """The fields forced for `tuner` in this context, or None."""
    d = _FORCED.get()
    return d.get(tuner) if d else None


# -- compile-ahead -----------------------------------------------------------------------------

@contextmanager
def compile_only() -> Iterator[None]:
    """Within the block a Tuner that would time its candidates compiles them all instead (in
    set-up, `setup()`, only the first that launches) and answers the first that launched,
    remembering nothing: the harness's compile-ahead workers fill the on-disk kernel caches
    this way, and the check pass's Tuner then times warm."""
    with _COMPILE_ONLY.holding(True):
        yield


def compiling_only() -> bool:
    return _COMPILE_ONLY.get()


# -- set-up outside the measured region --------------------------------------------------------

@contextmanager
def setup() -> Iterator[None]:
    """Within the block a call is being set up, not measured (an op's binder running the
    forward whose backward is timed): a Tuner or autotuner that would time its candidates
    (or, partly forced, the matching ones) takes the first that launches instead, keeps it
    for later set-up calls only, never for a measured call, and logs nothing: the case's
    config is that of its measured call. The set-up's configuration changes nothing the case
    measures; timing it cost flash_bwd.yaml's cold check pass 17 of its 101 s on an H100."""
    with _SETUP.holding(True):
        yield


def in_setup() -> bool:
    return _SETUP.get()


# -- the per-call log of picks -----------------------------------------------------------------

class PickLog:
    """The picks made within a `recording()` block, one per (tuner, key), in call order."""

    def __init__(self) -> None:
        self.picks: dict[tuple[str, Any], tuple[dict, str]] = {}
        self.compile_s = 0.0  # Tuner seconds in this block: compiling its candidates
        self.timing_s = 0.0  # and timing them

    def add(self, tuner: str, key: Any, config: dict, source: str) -> None:
        self.picks[(tuner, key)] = (config, source)

    def configs(self) -> dict[str, dict]:
        """{tuner: config}; a tuner picked for several keys in one case (e.g. two GEMMs of
        different shapes through one Tuner) gives `tuner`, `tuner#2`, ... in call order."""
        out: dict[str, dict] = {}
        for (tuner, _), (cfg, _) in self.picks.items():
            name, n = tuner, 1
            while name in out:
                n += 1
                name = f"{tuner}#{n}"
            out[name] = cfg
        return out

    def source(self) -> str | None:
        """The strongest source among the picks (SOURCES order), None without picks."""
        seen = {src for _, src in self.picks.values()}
        return next((s for s in SOURCES if s in seen), None)

    def __len__(self) -> int:
        return len(self.picks)


@contextmanager
def recording() -> Iterator[PickLog]:
    with _LOG.holding(PickLog()) as log:
        yield log


@contextmanager
def unlogged() -> Iterator[None]:
    """Picks made within the block stay out of the case's log (their compile and timing
    seconds still count): for a pick the kernel may not use. The attention backward's dQ Tuner
    picks before its dK/dV Tuner decides whether a dQ kernel runs at all (the one-pass form
    has none); when one runs, it picks again outside the block (stored by then: nothing
    timed)."""
    with _UNLOGGED.holding(True):
        yield


def add_cost(compile_s: float, timing_s: float) -> None:
    """A Tuner's seconds spent compiling and timing candidates (kept by `recording()`)."""
    log = _LOG.get()
    if log is not None:
        log.compile_s += compile_s
        log.timing_s += timing_s


def recording_active() -> bool:
    return _LOG.get() is not None and not _UNLOGGED.get()


def record(tuner: str, key: Any, config: dict, source: str) -> None:
    """Called by a Tuner on every pick (a no-op outside `recording()`); `key` is hashable."""
    log = _LOG.get()
    if log is not None and not _UNLOGGED.get():
        log.add(tuner, key, config, source)


# -- picks persisted across worker processes ---------------------------------------------------

def load_picks(picks: dict[str, dict[str, dict]]) -> None:
    """Install the picks stored in a run dir (store.load_tuner_picks) for `stored_pick`."""
    _STORED.clear()
    for tuner, by_key in (picks or {}).items():
        _STORED[tuner] = dict(by_key)


def stored_pick(tuner: str, key: Any) -> dict | None:
    """{"config": {field: value}, "source": ...} picked earlier for (tuner, key), or None."""
    return _STORED.get(tuner, {}).get(repr(key))


def stored_picks(tuner: str) -> dict[str, dict]:
    """{repr(key): {"config", "source", ...}} of every pick known for `tuner` (stored or
    remembered in this process)."""
    return dict(_STORED.get(tuner, {}))


def remember(tuner: str, key: Any, config: dict, source: str,
             evidence: dict | None = None) -> None:
    """A Tuner timed a new pick: keep it for `stored_pick` and for `take_new_picks`.
    `evidence` ({"candidates": [{"config", "ms", "final_ms" | "error"}], "compile_s",
    "timing_s", "wait_s"}) is what the pick rests on: every candidate's timing, or why it
    was skipped."""
    rec = {"config": dict(config), "source": source}
    if evidence:
        rec["evidence"] = evidence
    _STORED.setdefault(tuner, {})[repr(key)] = rec
    _NEW.setdefault(tuner, {})[repr(key)] = rec


_SCOPES: dict[str, tuple[dict, dict]] = {}


@contextmanager
def scope(name: str) -> Iterator[None]:
    """Within the block, the stored and new picks are scope `name`'s own. `harness ab` runs
    two versions of a kernel in one process, their Tuners under the same names: each version's
    calls run in the scope of its code (one scope when the code is the same: both then use
    one pick, so the same code does not differ by a tuning coin toss)."""
    global _STORED, _NEW
    saved = (_STORED, _NEW)
    _STORED, _NEW = _SCOPES.setdefault(name, ({}, {}))
    try:
        yield
    finally:
        _STORED, _NEW = saved


def merge_picks(picks: dict[str, dict[str, dict]]) -> None:
    """Add stored picks (store.load_tuner_picks) to those of the current scope."""
    for tuner, by_key in (picks or {}).items():
        _STORED.setdefault(tuner, {}).update(by_key)


def take_new_picks() -> dict[str, dict[str, dict]]:
    """The picks remembered since the last call (what a worker persists after a case)."""
    out = {t: dict(v) for t, v in _NEW.items()}
    _NEW.clear()
    return out
