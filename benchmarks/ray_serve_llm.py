"""Can Ray Serve LLM's own deployment (``ray.serve.llm``, vLLM inside a Serve replica) serve
SmolLM2-135M on vLLM's CPU backend here? One attempt, bounded; prints one JSON line saying what
happened (the answer docs/cluster.md's Ray section quotes), and stops everything it started.

    .venv/bin/python benchmarks/ray_serve_llm.py                     # one replica, Ray's default router
    .venv/bin/python benchmarks/ray_serve_llm.py --replicas 2 --kvsched-router prefix-affinity
"""

from __future__ import annotations

import argparse
import json
import socket
import time
import traceback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--kvsched-router", default=None, help="a kvsched router as the deployment's request router")
    parser.add_argument("--timeout", type=float, default=480)
    args = parser.parse_args()

    import openai
    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    from kvsched.executors.hf_models import model_folder
    from kvsched.experiments.ray_backend import start_ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    deployment: dict = {"num_replicas": args.replicas}
    if args.kvsched_router:
        deployment["request_router_config"] = {
            "request_router_class": "kvsched.integrations.ray.router:KvschedRequestRouter",
            "request_router_kwargs": {"router": args.kvsched_router},
        }
    config = LLMConfig(
        model_loading_config={"model_id": "smollm2-135m", "model_source": str(model_folder("smollm2-135m"))},
        accelerator_config={"kind": "cpu"},
        deployment_config=deployment,
        engine_kwargs={"dtype": "float32", "enforce_eager": True, "block_size": 32, "max_model_len": 2048},
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}},
    )
    result: dict = {"replicas": args.replicas, "router": args.kvsched_router or "ray default", "ray": ray.__version__}
    start = time.monotonic()
    start_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_openai_app({"llm_configs": [config]}), blocking=False)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30) as client:
            while True:
                try:
                    reply = client.completions.create(
                        model="smollm2-135m", prompt="The capital of France is", max_tokens=8
                    )
                    result.update(
                        served=True,
                        text=reply.choices[0].text,
                        seconds_to_first_answer=round(time.monotonic() - start, 1),
                    )
                    break
                except openai.APIError as exc:
                    status = serve.status().applications
                    states = {name: str(app.status) for name, app in status.items()}
                    if any("DEPLOY_FAILED" in s for s in states.values()) or time.monotonic() - start > args.timeout:
                        details = {
                            name: {d: (str(v.status), v.message[-600:]) for d, v in app.deployments.items()}
                            for name, app in status.items()
                        }
                        result.update(
                            served=False, last_error=f"{type(exc).__name__}: {str(exc)[:200]}", applications=details
                        )
                        break
                    time.sleep(5)
    except Exception as exc:  # noqa: BLE001 - the probe reports what failed
        result.update(
            served=False, error=f"{type(exc).__name__}: {str(exc)[:600]}", where=traceback.format_exc()[-800:]
        )
    finally:
        serve.shutdown()
        ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
