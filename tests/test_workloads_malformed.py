"""A malformed workload gets one error naming the file, line and column, via the library and the CLI."""

import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.workloads import TraceWorkload, WorkloadError, build_workload

ENGINE = Path(sys.executable).parent / "engine"

CASES = [
    (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,1\n2023-11-16 18:15:47,ten,1\n",
        r":3: column 'ContextTokens': not an integer: 'ten'",
    ),
    (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,1\nyesterday,10,1\n",
        r":3: column 'TIMESTAMP': not a timestamp",
    ),
    (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,0\n",
        r":2: column 'GeneratedTokens': must be >= 1, got '0'",
    ),
    (
        "arrival_time_s,prompt_tokens,output_tokens\n0,1,1\n-1,1,1\n",
        r":3: column 'arrival_time_s': must be a finite time >= 0",
    ),
    (
        "arrival_time_s,prompt_tokens,output_tokens\n0,1,1\n1,2.5,1\n",
        r":3: column 'prompt_tokens': not an integer: '2.5'",
    ),
    ("arrival_time_s,prompt_tokens,output_tokens\n0,1,1\n1,2\n", r":3: expected 3 fields, got 2"),
    ("arrival_time_s,prompt_tokens,output_tokens\n0,1,1\n\n2,1,1\n", r":3: empty row"),
    ("num_prefill_tokens,num_decode_tokens\n5,x\n", r":2: column 'num_decode_tokens': not an integer: 'x'"),
    ("when,how_long\n1,2\n", r":1: unknown header"),
    ("", r":1: empty file"),
    ("arrival_time_s,prompt_tokens,output_tokens\n", r":2: no requests"),
]


@pytest.mark.parametrize("text,message", CASES)
def test_malformed_rows_name_file_line_and_column(tmp_path, text, message):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(WorkloadError, match="bad\\.csv" + message.replace("(", r"\(").replace(")", r"\)")):
        TraceWorkload(path=p).requests()


def test_workload_option_conflicts(tmp_path):
    with pytest.raises(WorkloadError, match="either --workload or --trace"):
        build_workload("azure-conv", tmp_path / "x.csv")
    with pytest.raises(WorkloadError, match="unknown workload"):
        build_workload("no-such-thing")
    with pytest.raises(WorkloadError, match="arrival process applies only to length-only"):
        build_workload("azure-conv", rate=3.0).requests()


def test_cli_prints_one_line_and_exits_2(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,1,1\n1,1,one\n")
    proc = subprocess.run([str(ENGINE), "run", "--trace", str(p), "-q"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "bad.csv:3: column 'output_tokens': not an integer: 'one'" in lines[0].replace("\n", "")
    assert "Traceback" not in proc.stderr
