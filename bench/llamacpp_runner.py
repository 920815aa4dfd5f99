"""llama.cpp on the same GGUF and token ids, as an outside reference for bench/kv_speed.py.

Runs inside bench/.venv-llamacpp (llama-cpp-python builds llama.cpp from source; see
bench/README.md). Imports nothing from Halaman:

    bench/.venv-llamacpp/bin/python bench/llamacpp_runner.py TASK.json   # prints one JSON line

TASK.json: {"gguf", "ids", "lengths", "decode_steps", "threads"}. For each length n the context is
reset, the first n ids are evaluated in 512-token batches (prefill, full FP16 KV cache), then
`decode_steps` single tokens are evaluated (median ms/token).
"""

import json
import statistics
import sys
import time


def main() -> None:
    task = json.loads(open(sys.argv[1]).read())
    import llama_cpp

    n_ctx = max(task["lengths"]) + task["decode_steps"] + 8
    llm = llama_cpp.Llama(model_path=task["gguf"], n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                          n_threads=task["threads"], n_threads_batch=task["threads"], verbose=False)
    rows = []
    for n in task["lengths"]:
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
        began = time.perf_counter()
        llm.eval(task["ids"][:n])
        prefill = time.perf_counter() - began
        times = []
        for token in task["ids"][n : n + task["decode_steps"]]:
            t0 = time.perf_counter()
            llm.eval([token])
            times.append(time.perf_counter() - t0)
        rows.append({"tokens": n, "runs": 1, "prefill_tok_s": n / prefill, "decode_ms": 1000 * statistics.median(times)})
    print(json.dumps({"version": f"llama-cpp-python {llama_cpp.__version__}", "rows": rows}))


if __name__ == "__main__":
    main()
