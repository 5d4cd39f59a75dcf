"""The Source lines page (ncu warp stalls per Triton source line) under streamlit's AppTest,
over runs imported from the REAL captures in tests/fixtures/ncu_source/."""
from __future__ import annotations

from pathlib import Path

from dash_helpers import APP
from streamlit.testing.v1 import AppTest

from dashboard import data, source_data
from harness.profilers.importer import import_path

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def _source_page(monkeypatch, root: Path, run: Path) -> AppTest:
    monkeypatch.setenv(data.ENV_STORES, str(root))
    monkeypatch.setenv(data.ENV_NO_EXAMPLES, "1")
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = run.name
    at.run()
    at.switch_page("views/source.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Source lines"
    return at


def _kernel_file_here(run: Path, tmp_path: Path) -> Path:
    """Point the capture's flash_fwd.py (a path on the GPU box) at a file here holding the
    profiled code: the sampled lines' stored text at their line numbers, comments between."""
    import pandas as pd

    path = run / "source_lines.parquet"
    lines = pd.read_parquet(path)
    own = lines.file.str.endswith("flash_fwd.py")
    texts = dict(zip(lines[own].line, lines[own].text))
    src = tmp_path / "flash_fwd.py"
    src.write_text("\n".join(texts.get(n, f"# line {n}") for n in range(1, max(texts) + 11)))
    lines.loc[own, "file"] = str(src)
    lines.to_parquet(path, index=False)
    return src


def test_source_page_renders_heat(monkeypatch, tmp_path):
    root = tmp_path / "runs"
    run = import_path(FIX / "ncu_source" / "src_flash.ncu-rep", root)
    _kernel_file_here(run, tmp_path)
    at = _source_page(monkeypatch, root, run)
    hot = at.dataframe[0].value
    assert list(hot["where"][:3]) == ["flash_fwd.py:55", "standard.py:263", "flash_fwd.py:99"]
    assert hot["share %"].iloc[0] == 29.8 and hot["triton lib"].iloc[1]
    assert hot["top stalls"].iloc[0].startswith("barrier 64 %")
    listing = at.dataframe[1].value
    sampled = listing[listing["share %"] != ""]  # text: blank on lines without samples
    assert 0 < len(sampled) < len(listing) and sampled["share %"].iloc[0].count(".") == 1
    assert not listing.isin(["None", "nan"]).any().any()
    assert 55 in set(sampled.line) and 99 in set(sampled.line)  # the kernel's own file first
    assert "tl.exp2(qk)" in sampled[sampled.line == 99].source.iloc[0]
    # switch to Triton's library file
    lib = [o for o in at.selectbox(key="source_file").options if "triton/language" in o][0]
    at.selectbox(key="source_file").set_value(lib).run()
    assert not at.exception
    assert 263 in set(at.dataframe[1].value.line)


def test_heat_style_and_listing_without_the_file():
    import pandas as pd

    from harness.profilers.ncu_source import parse_report_lines

    lines = parse_report_lines(FIX / "ncu_source" / "src_softmax.ncu-rep")
    lines = lines.assign(file="/nowhere/" + lines.file.str.split("/").str[-1])
    case, kernel = source_data.source_kernels(lines)[0]
    files = source_data.source_files(lines, case, kernel)
    assert files[0].endswith("triton_softmax.py")
    listing = source_data.source_listing(lines, case, kernel, files[0])
    assert list(listing.line) == sorted(listing.line) and listing["share %"].notna().all()
    html = source_data.heat_style(listing).to_html()
    assert "rgba(230, 80, 0, 0.80)" in html  # the hottest line (31: the load) at full heat
    assert isinstance(listing, pd.DataFrame)


def test_source_page_without_lines(monkeypatch, tmp_path):
    root = tmp_path / "runs"
    run = import_path(FIX / "ncu" / "sections_only_softmax.ncu-rep", root)
    at = _source_page(monkeypatch, root, run)
    assert "no source lines" in at.info[0].value


def test_listing_ignores_a_file_changed_since_the_capture(tmp_path):
    """Line numbers of an edited file point at other code: only the stored lines are shown."""
    from harness.profilers.ncu_source import parse_report_lines

    lines = parse_report_lines(FIX / "ncu_source" / "src_flash.ncu-rep")
    own = lines.file.str.endswith("flash_fwd.py")
    texts = dict(zip(lines[own].line, lines[own].text))
    src = tmp_path / "flash_fwd.py"
    src.write_text("\n".join(texts.get(n, f"# line {n}") for n in range(1, max(texts) + 11)))
    lines.loc[own, "file"] = str(src)
    case, kernel = source_data.source_kernels(lines)[0]
    fresh = source_data.source_listing(lines, case, kernel, str(src))
    assert len(fresh) > own.sum()  # contiguous: the file matches the capture
    src.write_text("\n".join(["# a line inserted above the kernel"] +
                             [texts.get(n, f"# line {n}") for n in range(1, max(texts) + 11)]))
    stale = source_data.source_listing(lines, case, kernel, str(src))
    assert list(stale.line) == sorted(texts)
    assert "tl.exp2(qk)" in stale[stale.line == 99].source.iloc[0]
