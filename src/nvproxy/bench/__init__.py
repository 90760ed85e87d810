"""The benchmark suite (`nvproxy bench`): the same CUDA programs natively and through nvproxy, and their ratios
(run.py); checkpoint and restore throughput (ckpt_run.py); where a GPU image goes under DMTCP
(dmtcp_placement.py).  The programs' sources ship with the package and are compiled on first use (build.py)."""
