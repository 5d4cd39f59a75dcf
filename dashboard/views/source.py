"""Source lines: where in the Triton kernel's Python source the warps stalled (ncu PC samples)."""
import streamlit as st

from dashboard import data, source_data, tables

st.title("Source lines")
rd = data.selected_run()
st.caption(rd.title)
lines = source_data.source_lines(rd.path)
if lines.empty:
    st.info("This run has no source lines: ncu's PC samples were not collected "
            "(profile.ncu.source_lines is on by default for Triton impls; `harness import` a "
            ".ncu-rep made with `--section SourceCounters --import-source yes`).")
    st.stop()
pairs = source_data.source_kernels(lines)
pick = st.selectbox("Case · kernel", pairs, key="source_kernel",
                    format_func=lambda p: f"{p[0]} · {p[1]}")
case_id, kernel = pick
st.caption("share = the line's part of the kernel's warp PC samples (`selected` = issuing); "
           "top stalls = the line's largest warp states; `triton lib` = a line inside Triton's "
           "own library (e.g. `tl.max` lives in triton/language/standard.py).")
st.subheader("Hottest lines")
tables.show(source_data.hot_lines_table(lines, case_id, kernel), hide_index=True, width="stretch")
files = source_data.source_files(lines, case_id, kernel)
file = st.selectbox("File", files, key="source_file")
listing = source_data.source_listing(lines, case_id, kernel, file)
st.subheader(file.split("/")[-1])
st.caption(file)
st.dataframe(source_data.heat_style(listing), hide_index=True, width="stretch",
             height=min(900, 38 + 35 * len(listing)),
             column_config={"source": st.column_config.TextColumn(width="large")})
