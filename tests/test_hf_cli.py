"""``engine run --executor hf`` and ``engine verify`` on the tiny models."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvsched.cli.app import app

runner = CliRunner()


def test_run_hf_prints_completions_and_summary(tmp_path):
    result = runner.invoke(app, ["run", "--executor", "hf", "--model", "tiny-llama", "--prompt", "Hello", "--prompt", "queues",
                                 "--max-tokens", "6", "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "requests (finished / ignored / aborted)" in result.output and "2 / 0 / 0" in result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["executor"] == "hf" and summary["finished"] == 2 and summary["leaked_blocks"] == 0


def test_run_hf_workload_of_real_prompts_through_another_policy():
    """Sarathi chunks long prompts: the real executor runs its mixed chunked steps."""
    result = runner.invoke(app, ["run", "--executor", "hf", "--model", "tiny-gpt2", "-n", "6", "--max-tokens", "4",
                                 "--set", "num_gpu_blocks=200", "--set", "block_size=8", "--policy", "sarathi"])
    assert result.exit_code == 0, result.output
    assert "6 / 0 / 0" in result.output


def test_run_rejects_unknown_executor_and_model():
    result = runner.invoke(app, ["run", "--executor", "gpu"])
    assert result.exit_code == 2 and "unknown executor" in result.output
    result = runner.invoke(app, ["run", "--executor", "hf", "--model", "no-such-model"])
    assert result.exit_code == 2 and "unknown model" in result.output


def test_verify_command():
    result = runner.invoke(app, ["verify", "--model", "tiny-llama", "--scenario", "swap", "--scenario", "n3-cow", "--max-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "equal generate() token for token" in result.output
    result = runner.invoke(app, ["verify", "--scenario", "nope"])
    assert result.exit_code == 2 and "unknown scenario" in result.output


def test_verify_a_local_model_folder(tmp_path):
    """A user's own model folder (here a saved tiny model, no tokenizer) is checked the same way."""
    from kvsched.executors.hf_models import load_model

    load_model("tiny-qwen2").model.save_pretrained(tmp_path / "my-model")
    result = runner.invoke(app, ["verify", "--model", str(tmp_path / "my-model"), "--scenario", "mixed", "--max-tokens", "6"])
    assert result.exit_code == 0, result.output
    assert "equal generate() token for token" in result.output
