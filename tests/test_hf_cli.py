"""``engine run --executor hf`` and ``engine verify`` on the tiny models."""

from __future__ import annotations

import io
import json

from typer.testing import CliRunner

from kvsched.cli.app import app

runner = CliRunner()


def test_run_hf_prints_completions_and_summary(tmp_path):
    result = runner.invoke(
        app,
        [
            "run",
            "--executor",
            "hf",
            "--model",
            "tiny-llama",
            "--prompt",
            "Hello",
            "--prompt",
            "queues",
            "--max-tokens",
            "6",
            "--output",
            str(tmp_path),
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    # -q hides progress, not results: the summary of a real run prints as a simulated one's does
    assert "requests (finished / ignored / aborted)" in result.output and "2 / 0 / 0" in result.output
    assert "wall duration" in result.output and "simulated" not in result.output and "loading" not in result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["executor"] == "hf" and summary["finished"] == 2 and summary["leaked_blocks"] == 0


def test_run_hf_streams_one_prompts_text_as_it_is_generated():
    from rich.console import Console

    from kvsched.cli.real import Streamer
    from kvsched.core.request import Request, SamplingParams
    from kvsched.executors.hf import hf_engine
    from kvsched.executors.hf_models import load_model

    loaded = load_model("tiny-llama")
    engine = hf_engine(loaded)
    request = Request(
        request_id="p0", prompt_token_ids=tuple(loaded.encode_prompt("Hello")), sampling=SamplingParams(max_tokens=8)
    )
    out = Console(file=io.StringIO())
    streamer, shown = Streamer(engine, loaded, [request], out), []
    engine.run([request], on_step=lambda report: (streamer(report), shown.append(out.file.getvalue())))
    assert shown[-1] == loaded.tokenizer.decode(engine._groups["p0"].seqs[0].output).strip() + "\n"
    assert len(set(shown)) > 2  # the text grew step by step, not once at the end


def test_an_empty_result_says_why():
    result = runner.invoke(
        app,
        [
            "run",
            "--executor",
            "hf",
            "--model",
            "tiny-llama",
            "--prompt",
            "a prompt too long for two blocks",
            "--max-tokens",
            "4",
            "--set",
            "num_gpu_blocks=2",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "0 / 1 / 0" in result.output
    # it ran, was preempted by recompute, and its prompt with the token it had made needs more than the 2 blocks
    assert (
        "[p0: ignored after 1 generated token(s): prompt can never fit in the GPU KV cache (can_allocate: NEVER); "
        "its prompt has 32 tokens, the GPU KV cache 2 blocks of 16]" in result.output
    )
    assert "warning: 1 of 1 requests ignored: prompt can never fit in the GPU KV cache" in result.output


def test_run_hf_workload_of_real_prompts_through_another_policy():
    """Sarathi chunks long prompts: the real executor runs its mixed chunked steps."""
    result = runner.invoke(
        app,
        [
            "run",
            "--executor",
            "hf",
            "--model",
            "tiny-gpt2",
            "-n",
            "6",
            "--max-tokens",
            "4",
            "--set",
            "num_gpu_blocks=200",
            "--set",
            "block_size=8",
            "--policy",
            "sarathi",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "6 / 0 / 0" in result.output


def test_run_rejects_unknown_executor_and_model():
    result = runner.invoke(app, ["run", "--executor", "gpu"])
    assert result.exit_code == 2 and "unknown executor" in result.output
    result = runner.invoke(app, ["run", "--executor", "hf", "--model", "no-such-model"])
    assert result.exit_code == 2 and "unknown model" in result.output


def test_verify_command():
    result = runner.invoke(
        app, ["verify", "--model", "tiny-llama", "--scenario", "swap", "--scenario", "n3-cow", "--max-tokens", "8"]
    )
    assert result.exit_code == 0, result.output
    assert "equal generate() token for token" in result.output
    assert (
        "loading tiny-llama: " in result.output
    )  # the steps that take time say so (the bar itself draws on a terminal)
    result = runner.invoke(app, ["verify", "--scenario", "nope"])
    assert result.exit_code == 2 and "unknown scenario" in result.output


def test_verify_a_local_model_folder(tmp_path):
    """A user's own model folder (here a saved tiny model, no tokenizer) is checked the same way."""
    from kvsched.executors.hf_models import load_model

    load_model("tiny-qwen2").model.save_pretrained(tmp_path / "my-model")
    result = runner.invoke(
        app, ["verify", "--model", str(tmp_path / "my-model"), "--scenario", "mixed", "--max-tokens", "6"]
    )
    assert result.exit_code == 0, result.output
    assert "equal generate() token for token" in result.output


def test_the_verify_table_fits_80_columns():
    from rich.console import Console

    from kvsched.cli.real import verify_table
    from kvsched.executors.hf_verify import ScenarioResult, SequenceCheck

    ok = ScenarioResult("recompute", [SequenceCheck("r0", 0, [1, 2], [1, 2], 3.2e-6)], (12, 0), 3, 27, 4)
    bad = ScenarioResult("n3-swap", [SequenceCheck("r3", 2, [1, 2], [1, 3], 1.5e-2, 1, 0.0041)], (0, 7), 12, 0, 0)
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(verify_table("smollm2-135m", [ok, bad]))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert sum("recompute" in line for line in lines) == 1 and any("12/0" in line for line in lines)
