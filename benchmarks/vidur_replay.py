"""One Vidur replay of the Azure conversation trace, timed; run by ``sim_speed.py --like-vidur``.

Runs under Vidur's own interpreter (see ``vidur_setup.py``) with the Vidur checkout as working
directory, and prints one JSON line: requests, batches, the wall and CPU seconds of ``Simulator.run()``
alone (the event loop: scheduling, the execution-time lookups, metrics collection), simulated
seconds and peak RSS. Building the simulator (reading the trace, loading or training the
execution-time models, precomputing their predictions) is timed apart as ``setup_s``.

The set-up is ``sim_speed.LIKE_VIDUR``'s: one replica of Llama-2-7B on an A100 (Vidur's memory
planner gives 7,424 blocks of 16), the ``vllm`` replica scheduler with at most 128 requests and
4,096 tokens a batch, trace replay with ``max_tokens`` 4,096, no chrome trace and no plots.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

ARGS = [
    "--replica_config_device",
    "a100",
    "--replica_config_model_name",
    "meta-llama/Llama-2-7b-hf",
    "--cluster_config_num_replicas",
    "1",
    "--replica_config_tensor_parallel_size",
    "1",
    "--replica_config_num_pipeline_stages",
    "1",
    "--request_generator_config_type",
    "trace_replay",
    "--trace_request_generator_config_trace_file",
    "./data/processed_traces/splitwise_conv.csv",
    "--trace_request_generator_config_max_tokens",
    "4096",
    "--replica_scheduler_config_type",
    "vllm",
    "--vllm_scheduler_config_batch_size_cap",
    "128",
    "--vllm_scheduler_config_max_tokens_in_batch",
    "4096",
    # a reduced random-forest grid: trained once and cached, it changes only the setup time
    "--random_forrest_execution_time_predictor_config_num_estimators",
    "100",
    "--random_forrest_execution_time_predictor_config_max_depth",
    "16",
    "--random_forrest_execution_time_predictor_config_min_samples_split",
    "2",
    "--random_forrest_execution_time_predictor_config_k_fold_cv_splits",
    "2",
    "--no-metrics_config_store_plots",
    "--no-metrics_config_enable_chrome_trace",
]


def main() -> None:
    sys.path.insert(0, os.getcwd())  # Vidur's source has no __init__.py at its top: import it from the checkout
    from vidur.config import SimulationConfig
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    sys.argv = [sys.argv[0], *ARGS, *sys.argv[1:]]
    t0 = time.perf_counter()
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    simulator = Simulator(config)
    store = simulator.metric_store
    batches = 0
    on_batch_end = store.on_batch_end

    def count(*args, **kwargs):
        nonlocal batches
        batches += 1
        return on_batch_end(*args, **kwargs)

    store.on_batch_end = count
    requests = len(simulator._event_queue)  # one arrival event per request before the run
    num_blocks = simulator.scheduler.get_replica_scheduler(0)._config.num_blocks
    t1, c1 = time.perf_counter(), time.process_time()
    simulator.run()
    t2, c2 = time.perf_counter(), time.process_time()
    print(
        json.dumps(
            {
                "requests": requests,
                "steps": batches,
                "loop_s": t2 - t1,
                "loop_cpu_s": c2 - c1,
                "setup_s": t1 - t0,
                "simulated_s": simulator._time,
                "num_blocks": num_blocks,
                "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
