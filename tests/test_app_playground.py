"""The Playground page through AppTest, answering prompts with the real tiny model on the shared runner."""

import pytest
from app_under_test import APP, shown
from streamlit.testing.v1 import AppTest

from bench_core.store.history import RESULTS_ENV
from dashboard.state import get_runner

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

TINY = "builtin:tiny-llama"


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch, tiny_model_path, fresh_dashboard):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))


def open_playground() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at = at.switch_page("app_pages/playground.py").run()
    at.selectbox(key="pg_model_choice").select(TINY)
    at.number_input(key="pg_max_new").set_value(6)
    return at


def run_prompts(at: AppTest) -> AppTest:
    at.button(key="pg_run").click().run()
    job = get_runner().get_playground(at.query_params["job"])
    assert job.wait(60), job.state
    return at.run()


def test_two_typed_prompts_give_two_answers_with_counts_reasons_and_downloads(tmp_path):
    at = open_playground()
    at.text_area(key="pg_prompts").input("Hello there\n\nWhat is 2 + 2?").run()
    at = run_prompts(at)
    assert not at.exception and not at.error
    results = at.dataframe[0].value
    assert list(results["prompt"]) == ["Hello there", "What is 2 + 2?"]
    assert (results["input_tokens"] > 0).all()
    assert (results["output_tokens"].between(1, 6)).all()
    assert set(results["finish_reason"]) <= {"stop", "length"}
    assert (results["ttft_s"] <= results["total_s"]).all()
    # Timings before the long text columns, so they stay on screen; every answer in full, wrapped, below.
    assert list(at.dataframe[0].proto.column_order[:3]) == ["index", "ttft_s", "total_s"]
    assert [shown(expander.label) for expander in at.expander] == [
        f"#{i} {prompt}" for i, prompt in zip(results["index"], results["prompt"])
    ]
    assert [block.value.strip() for block in at.code] == [text.strip() for text in results["text"]]
    assert [b.label for b in at.download_button] == ["Download results (CSV)", "Download results (JSONL)"]
    assert "finished: 2 of 2" in at.get("progress")[0].proto.text
    assert not (tmp_path / "results" / "history.csv").exists()  # playground jobs are not benchmark runs


def test_after_a_reload_the_prompt_box_holds_the_prompts_that_ran_and_its_placeholder_reads_as_an_example():
    at = open_playground()
    box = at.text_area(key="pg_prompts")
    assert box.value == "" and box.placeholder.startswith("e.g. ") and "\n" not in box.placeholder
    at = run_prompts(box.input("Hello there\n\nWhat is 2 + 2?").run())
    job_id = at.query_params["job"]

    reloaded = AppTest.from_file(APP, default_timeout=60).run().switch_page("app_pages/playground.py")
    reloaded.query_params["job"] = job_id  # a new session opened on the job's link
    reloaded.run()
    assert not reloaded.exception
    assert reloaded.text_area(key="pg_prompts").value == "Hello there\nWhat is 2 + 2?"
    assert [shown(c.value) for c in reloaded.caption if job_id in c.value] == [
        f"The prompts of job {job_id}, as it ran them; its answers are below."
    ]
    assert list(reloaded.dataframe[0].value["prompt"]) == ["Hello there", "What is 2 + 2?"]


def test_an_uploaded_jsonl_file_is_used_instead_of_typed_prompts():
    at = open_playground()
    at.text_area(key="pg_prompts").input("ignored").run()
    data = b'{"prompt": "one"}\n{"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "two"}]}\n'
    at.file_uploader(key="pg_file").set_value(("prompts.jsonl", data, "application/jsonl")).run()
    at = run_prompts(at)
    assert list(at.dataframe[0].value["prompt"]) == ["one", "two"]


def test_a_bad_prompt_file_is_one_error_and_nothing_runs():
    at = open_playground()
    at.file_uploader(key="pg_file").set_value(("prompts.csv", b"question\nwhat?\n", "text/csv")).run()
    assert not at.exception
    assert len(at.error) == 1 and "'prompt' column" in at.error[0].value
    assert "pg_run" not in [button.key for button in at.button]


def test_a_model_that_cannot_load_fails_the_job_with_one_message():
    at = open_playground()
    at.selectbox(key="pg_model_choice").select("Local path or hub id").run()
    at.text_input(key="pg_model_path").input("/no/such/model").run()
    at.text_area(key="pg_prompts").input("Hello").run()
    at = run_prompts(at)
    assert not at.exception
    assert len(at.error) == 1 and "/no/such/model" in at.error[0].value


def test_running_with_no_prompt_says_so():
    at = open_playground()
    at.button(key="pg_run").click().run()
    assert len(at.error) == 1 and "no prompt" in at.error[0].value
    assert "job" not in at.query_params


def test_the_model_picker_is_the_run_sidebars():
    """The same built-in models, help and path input as on the Run page; the Playground's own keys and values."""
    run_page = AppTest.from_file(APP, default_timeout=60).run()
    at = open_playground()
    mine, sidebars = at.selectbox(key="pg_model_choice"), run_page.sidebar.selectbox(key="model_choice")
    assert (mine.options, mine.help) == (sidebars.options, sidebars.help) and mine.value == TINY
    at = mine.select("Local path or hub id").run()
    run_page = sidebars.select("Local path or hub id").run()
    assert at.text_input(key="pg_model_path").placeholder == run_page.sidebar.text_input(key="model_path").placeholder
