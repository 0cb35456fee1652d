"""Where the host time of a tilejit training step of the example model goes: cProfile over a few steps after
warm-up (the model, data and optimizer of benchmarks/llm.py), the functions with the most own time and the most
time below them, and the wall time per step next to the GPU time (events)."""
import cProfile
import pstats
import sys
import time

import torch

from benchmarks.llm import BatchSampler, _fresh_model, load_corpus, make_optimizer, train_step

model = _fresh_model("tilejit")
optimizer = make_optimizer(model, lr=1e-3)
sampler = BatchSampler(load_corpus(), 8, 1024, seed=0)
batches = [sampler.next("cuda") for _ in range(8)]


def step(tokens, targets):
    train_step(model, optimizer, tokens, targets)


for b in batches[:4]:
    step(*b)
torch.cuda.synchronize()
start = time.perf_counter()
for b in batches[4:6]:
    step(*b)
torch.cuda.synchronize()
print(f"{torch.cuda.get_device_name()}: {(time.perf_counter() - start) / 2 * 1e3:.1f} ms a step (wall)")
profiler = cProfile.Profile()
profiler.enable()
for b in batches[6:]:
    step(*b)
torch.cuda.synchronize()
profiler.disable()
stats = pstats.Stats(profiler, stream=sys.stdout).strip_dirs()
stats.sort_stats("tottime").print_stats(35)
stats.sort_stats("cumulative").print_stats(45)
