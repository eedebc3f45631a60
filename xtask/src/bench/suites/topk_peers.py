# Peer top-k timings for the `topk` bench suite: the same error-feedback step as ours
# (r += g; select the k largest |r|; zero them in r) with numpy.argpartition and torch.topk,
# on the gradient the suite wrote as raw little-endian f32.
#
# argv: path d reps k1,k2,... peer1,peer2,...
# stdout: one JSON object per (peer, k): {"peer", "k", "time_s", "threads"}.
import json
import sys
import time

import numpy as np

path, d, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ks = [int(v) for v in sys.argv[4].split(",")]
peers = sys.argv[5].split(",")
g = np.fromfile(path, dtype=np.float32, count=d)
assert g.size == d, "short gradient file"


# A peer is 10-100x slower than the selectors, so its fastest run settles within far fewer
# runs than theirs: stop after BUDGET_S of timing once AT_LEAST runs are in. With all
# `reps` the peers took most of the suite's time (2^14: 14 of 16.5 s on 2 cores).
BUDGET_S = 1.0
AT_LEAST = 15


def min_time(setup, step):
    """Fastest of up to `reps` timings after a warm-up, like the suite's own timings."""
    setup()
    step()
    best = float("inf")
    start = time.perf_counter()
    for i in range(max(reps, 1)):
        setup()
        t = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t)
        if i + 1 >= AT_LEAST and time.perf_counter() - start > BUDGET_S:
            break
    return best


for k in ks:
    if "numpy" in peers:
        r = np.zeros(d, dtype=np.float32)

        def np_step():
            np.add(r, g, out=r)
            idx = np.argpartition(np.abs(r), d - k)[d - k:]
            vals = r[idx]
            r[idx] = 0.0
            return vals

        t = min_time(lambda: r.fill(0.0), np_step)
        print(json.dumps({"peer": "numpy", "k": k, "time_s": t, "threads": 1}))
    if "torch" in peers:
        import torch

        rt = torch.zeros(d, dtype=torch.float32)
        gt = torch.from_numpy(g)

        def torch_step():
            rt.add_(gt)
            _, idx = torch.topk(rt.abs(), k, sorted=False)
            vals = rt[idx]
            rt[idx] = 0.0
            return vals

        t = min_time(lambda: rt.zero_(), torch_step)
        print(
            json.dumps(
                {"peer": "torch", "k": k, "time_s": t, "threads": torch.get_num_threads()}
            )
        )
    sys.stdout.flush()
