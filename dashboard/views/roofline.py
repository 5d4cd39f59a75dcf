"""Roofline: every impl x case against the GPU's calibrated ceilings."""
import streamlit as st

from dashboard import data, tables
from harness.present import charts

st.title("Roofline")
rd = data.selected_run()
st.caption(rd.title)
intensity = st.radio("Arithmetic intensity", ["analytic", "counted"], horizontal=True,
                     key="intensity",
                     help="analytic: the op's FLOP and byte counts with the CUDA-event time; "
                          "counted: FLOPs and DRAM bytes ncu measured, with ncu's duration")
if rd.calibration is None:
    st.warning(f"No calibration for {rd.gpu or 'this device (CPU run)'}: the ceilings are not "
               "drawn. Measure them on the GPU with `python -m harness calibrate`.")
if intensity == "counted" and not data.has_ncu(rd):
    st.info("Counted intensity needs ncu metrics, and this run has none.")
st.plotly_chart(charts.roofline(rd.summary, rd.calibration, intensity=intensity),
                key="roofline")
points = data.roofline_points(rd.summary, intensity)
if len(points):
    tables.show(points, hide_index=True, width="stretch")
