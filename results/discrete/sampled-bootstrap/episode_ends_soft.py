"""diag.py with planning's termination soft: a candidate's later rewards and value are weighted by the predicted
survival prod(1 - p) instead of being cut when p > 0.5 (the hard cut the reference uses)."""
import inspect, textwrap, sys
import tdmpc.planners.mppi as mppi
src = textwrap.dedent(inspect.getsource(mppi.LatentMPPI._rollout))
old = "ok.append(m.termination(z) <= 0.5)"
assert old in src
src = src.replace(old, "ok.append(1 - m.termination(z).float())")
ns = {}
exec(src, mppi.__dict__, ns)
mppi.LatentMPPI._rollout = ns["_rollout"]
exec(open("results/discrete/sampled-bootstrap/episode_ends.py").read())
