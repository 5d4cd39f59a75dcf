"""`run --profile-harness`: the driver and every worker process write a cProfile of themselves
under raw/harness_profile/; without the flag nothing is written and nothing is inherited."""
import os
import pstats

from harness import store

from harness.execute import selfprofile
from test_cli import _exp, harness, only_run


def test_profiled_writes_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(selfprofile.ENV, raising=False)
    with selfprofile.profiled("quiet"):
        sum(range(1000))
    assert not list(tmp_path.iterdir())
    folder = selfprofile.enable_for(tmp_path)
    assert os.environ[selfprofile.ENV] == str(folder)
    with selfprofile.profiled("busy"):
        sorted(range(100000), key=lambda x: -x)
    (stats,) = folder.glob("busy-*.pstats")
    assert stats.stem == f"busy-{os.getpid()}"
    assert "test_selfprofile.py" in (folder / f"{stats.stem}.txt").read_text()
    assert pstats.Stats(str(stats)).total_calls > 100000


def test_run_profile_harness_profiles_driver_and_workers(tmp_path):
    exp = _exp(tmp_path, "[tuned]")
    store_dir = tmp_path / "runs"
    harness("run", str(exp), "--store", str(store_dir), "--profile-harness", check=True)
    run = only_run(store_dir)
    assert store.load_manifest(run)["profile_harness"] is True
    names = sorted(p.name.rsplit("-", 1)[0] for p in (run / "raw" / "harness_profile").glob("*.txt"))
    assert names == ["driver", "worker-check-time"]
    text = next((run / "raw" / "harness_profile").glob("worker-check-time-*.txt")).read_text()
    assert "harness/execute/worker.py" in text and "cumulative" in text
    # the next run in the same store, without the flag: no profile
    harness("run", str(exp), "--store", str(store_dir), check=True)
    newest = max((d for d in store_dir.iterdir() if (d / "manifest.json").exists()),
                 key=lambda d: d.name)
    assert not (newest / "raw" / "harness_profile").exists()
    assert store.load_manifest(newest)["profile_harness"] is False
