"""LLM Bench Studio: the dashboard's entry point (placeholder until the dashboard lands)."""

import streamlit as st

st.set_page_config(page_title="LLM Bench Studio", layout="wide")
st.title("LLM Bench Studio")
st.write(
    "The interactive dashboard is on its way. The measurement core already runs headless:"
)
st.code(
    "python -m bench_core pipeline builtin:sharegpt builtin:smollm2-135m "
    "--backend transformers -n 32 -c 8 --stream-output",
    language="bash",
)
