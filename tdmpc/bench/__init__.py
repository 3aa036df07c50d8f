"""The benchmark command (python -m tdmpc.bench, tdmpc-bench) and the kernel and transfer counters behind its
--kernels: measuring tools on top of the library, which nothing in the library imports.

cli.py (flags, the table, main), timing.py (plan() and update() against the matmul peak), e2e.py (the training
loop end to end, in processes side by side, tensor-native envs), offline.py (the offline sampler's cost),
gpu_profile.py (--profile on CUDA), kernels.py (the counters) and kernel_counts.py (--kernels).
"""
