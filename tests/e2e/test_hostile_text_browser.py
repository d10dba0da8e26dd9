"""Text from outside the app is shown as text: a benchmarked server's model id and error message and a run's label,
each holding Markdown images and links, neither load an image nor make a link when the run is opened in chromium.

A pixel server on 127.0.0.1 counts every fetch; a server that names its model in Markdown and fails every request
with Markdown in its error is benchmarked by the CLI into the dashboard's own history.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from playwright.sync_api import Page, expect

from tests.openai_server import serving

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def pixel_app(hits: list[str]) -> web.Application:
    async def pixel(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=b"GIF89a", content_type="image/gif")

    app = web.Application()
    app.router.add_get("/{name}", pixel)
    return app


def hostile_server_app(pixels: str) -> web.Application:
    """An OpenAI-compatible server whose model id and every error are Markdown pointing at `pixels`."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": f"![m]({pixels}/from-model-name.png)"}]})

    async def completions(request: web.Request) -> web.Response:
        message = f"overloaded ![e]({pixels}/from-error.png) [details]({pixels}/from-link)"
        return web.json_response({"error": {"message": message}}, status=500)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def test_a_run_whose_model_error_and_label_hold_markdown_fetches_nothing(page: Page, app_server, tiny_model_path):
    hits: list[str] = []
    with serving(pixel_app(hits)) as pixels, serving(hostile_server_app(pixels)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        env.pop("OPENAI_API_KEY", None)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench_core",
                "restful",
                "--backend",
                "vllm",
                "--base-url",
                server,
                "--tokenizer",
                "builtin:tiny-llama",
                "--dataset-path",
                "builtin:sample",
                "--num-prompts",
                "2",
                "--sharegpt-output-len",
                "4",
                "--disable-warmup",
                "--output-file",
                "",
                "--label",
                f"![l]({pixels}/from-label.png)",
                "--results",
                str(app_server.results),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr  # every request failed
        run_id = next(line.split()[1].rstrip(":") for line in done.stderr.splitlines() if line.startswith("run "))
        page.goto(f"/?run={run_id}")
        main = page.get_by_test_id("stMain")
        expect(main.get_by_text("overloaded ![e](", exact=False).first).to_be_visible(timeout=60_000)
        expect(main.get_by_text("![m](", exact=False).first).to_be_visible()
        page.wait_for_timeout(2000)  # the time a browser takes to fetch an image it was given
        assert main.locator(f'img[src^="{pixels}"]').count() == 0
        links = main.locator(f'a[href^="{pixels}"]')
        assert links.count() == 0, [
            links.nth(i).evaluate("a => a.parentElement.outerHTML.slice(0, 400)") for i in range(links.count())
        ]
    assert hits == []
