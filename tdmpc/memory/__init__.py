"""Peak device memory: estimated from a config before a run starts (peak), and a config fitted to a card (fit)."""

from tdmpc.memory.fit import FIT_ORDER, Change, MemoryPlan, assess, assess_run, buffer_storage, dry_run_report, \
    out_of_memory_report, summary_line
from tdmpc.memory.peak import ALLOCATOR_SLACK, CUDA_CONTEXT, EVAL_PARALLEL, POOL_SEGMENTS, SAFETY_MARGIN, MemoryEstimate, Target, \
    cublas_workspace_bytes, cuda_target, detect_target, estimate, eval_sizes, parse_size, plan_activation_bytes, \
    planner_buffer_bytes, replay_buffer_bytes, saved_tensor_bytes, update_dtype
from tdmpc.losses import policy_saved_bytes, update_activation_bytes, world_model_saved_bytes
from tdmpc.runtime.files import GiB, MiB, fmt_bytes

__all__ = ["ALLOCATOR_SLACK", "CUDA_CONTEXT", "EVAL_PARALLEL", "FIT_ORDER", "POOL_SEGMENTS", "SAFETY_MARGIN", "Change", "GiB", "MemoryEstimate",
           "MemoryPlan", "MiB", "Target", "assess", "assess_run", "buffer_storage", "cublas_workspace_bytes", "cuda_target",
           "detect_target", "dry_run_report", "estimate", "eval_sizes", "fmt_bytes", "out_of_memory_report",
           "parse_size", "plan_activation_bytes", "planner_buffer_bytes", "policy_saved_bytes", "replay_buffer_bytes",
           "saved_tensor_bytes", "summary_line", "update_activation_bytes", "update_dtype", "world_model_saved_bytes"]
