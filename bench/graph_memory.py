"""What the graph pool holds per frame of budget, and whether capping cuDNN's workspace shrinks it.

For each (cuDNN workspace cap or allocator setting, frame budget) a fresh process (the cap is read from the environment
by torch's cuDNN conv) captures the 25-frame bucket that fills the budget and a 1-frame bucket,
then reports the graph pool, the activations' peak and the replay time. Run on a GPU:
``python3 bench/graph_memory.py`` (workspace caps) or ``python3 bench/graph_memory.py expandable 256 512``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def child(budget: int) -> None:
    import torch

    from code2wav.engine.graphs import GraphRunner
    from code2wav.model.config import DecoderConfig
    from code2wav.model.init import random_decoder
    from code2wav.model.loading import configure_cuda
    from code2wav.stream.pool import StatePool
    from code2wav.stream.runner import EagerRunner

    configure_cuda(torch.bfloat16)
    m = random_decoder(DecoderConfig())
    m = m.to_dtypes(torch.bfloat16, "cuda").channels_last()
    pool = StatePool(m, 256)
    rows = budget // 25
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    codes, slots, n_new = torch.randint(0, 2048, (rows, 16, 25)), torch.arange(rows), torch.full((rows,), 25)
    EagerRunner(m, pool)(codes, slots, n_new)
    torch.cuda.synchronize()
    eager_peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    r = GraphRunner(m, pool, batch_sizes=(1,), frame_sizes=(1, 25), max_batch_frames=budget)
    r.capture()
    for _ in range(3):
        r(codes, slots, n_new)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        r(codes, slots, n_new)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / 10 * 1e3
    pool = r.memory_bytes() / 2**20
    x = rows * 25 / ms * 1e3 / 12.5
    setting = os.environ.get("CUDNN_CONV_WSCAP_DBG") or ("expand" if "expandable" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else "-")
    print(f"{setting:>8}{budget:>7}{rows:>5}{eager_peak:>12.0f}{pool:>10.0f}{pool / budget:>10.2f}{ms:>9.2f}{x:>8.0f}", flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        return 0
    # argv: "expandable B [B ...]" runs only the allocator's expandable segments at budgets B
    if len(sys.argv) > 2 and sys.argv[1] == "expandable":
        settings = [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", int(b)) for b in sys.argv[2:]]
    else:
        settings = [("CUDNN_CONV_WSCAP_DBG", cap, b) for cap in (None, "256", "32") for b in (128, 256, 512)]
    print(f"{'setting':>8}{'budget':>7}{'rows':>5}{'eager MiB':>12}{'pool MiB':>10}{'MiB/frm':>10}{'ms':>9}{'x RT':>8}", flush=True)
    for var, value, budget in settings:
        env = dict(os.environ)
        env.pop(var, None)
        if value is not None:
            env[var] = value
        subprocess.run([sys.executable, __file__, "--child", str(budget)], env=env, timeout=120, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
