"""The installed `bench-studio` command (bench_studio.command). An installed package also holds, in
bench_studio/root, the checkout's root files it needs: app.py, app_pages/, .streamlit/config.toml and the two
requirement files whose pins the install messages name (pyproject.toml maps them there)."""
