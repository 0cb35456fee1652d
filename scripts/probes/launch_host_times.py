"""Host time per launch of the autotuned DESIGN matmul, plain and tuned, with a grid tuple and a grid function
(``benchmarks.matmul.launch_host_times``), printed as the benchmark's table with the GPU name."""
import torch

from benchmarks.common import markdown_table
from benchmarks.matmul import launch_host_times, launch_rows

print(torch.cuda.get_device_name())
print(markdown_table(["launch", "host time", "vs plain (same grid form)", "min"], launch_rows(launch_host_times())))
