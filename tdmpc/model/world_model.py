"""The TD-MPC2 world model: encoder, latent dynamics, reward, termination, Q-ensemble, policy prior.

Continuous actions are vectors in [-1, 1]^A and the prior a squashed Gaussian, as in the reference. Discrete
actions (Discrete(n) envs) are one-hot rows of n wherever a network reads an action, and the prior is a
categorical distribution over the n actions; action_input() and env_action() convert at the boundary.

Module names (`_encoder`, `_dynamics`, `_reward`, `_termination`, `_pi`, `_Qs`,
`_target_Qs`) follow the reference implementation so checkpoints map across by name.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Union, cast

import torch
from torch import Tensor, nn

from tdmpc.config import SIZE_FIELDS, Config, NetworkSettings
from tdmpc.model.fused import ln_act
from tdmpc.model.policy import PolicyOutput as Policy
from tdmpc.model.policy import one_hot_argmax
from tdmpc.model.random import TORCH, RandomSource
from tdmpc.model.layers import (ChosenHeads, Ensemble, EnsembleLinear, Heads, NormedLinear, PixelEncoder,
                                 batched_linear, init_weights, linear, mlp)
from tdmpc.model.twohot import TwoHot


@dataclass(kw_only=True)
class ModelDims(NetworkSettings):
    """Everything that fixes the shapes of the networks (and so of a checkpoint).

    The task gives obs_shape, action_dim and episodic; the network settings are inherited (NetworkSettings, as
    Config inherits them), and the sizes are Config's size fields resolved (there None means the model_size
    preset's). A multi-task model also has its task set: one embedding row of task_dim per task (the id is the
    index in `tasks`), obs zero-padded to obs_shape and actions to action_dim, each task's own action dims
    masked."""

    obs_shape: tuple[int, ...]
    action_dim: int
    episodic: bool
    latent_dim: int
    mlp_dim: int
    enc_dim: int
    num_enc_layers: int
    num_q: int
    tasks: tuple[str, ...] = ()  # a multi-task model's task set; () for a single-task model
    task_dim: int = 0
    action_dims: tuple[int, ...] = ()  # each task's own action dims (the rest are masked)
    discrete: bool = False  # Discrete(action_dim) actions, one-hot inside the model; else continuous in [-1, 1]

    @property
    def pixels(self) -> bool:
        return len(self.obs_shape) == 3

    @property
    def multitask(self) -> bool:
        return bool(self.tasks)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """One action as the envs take it and the replay buffer stores it: () for an integer, else (action_dim,)."""
        return () if self.discrete else (self.action_dim,)

    @property
    def pad_to(self) -> tuple[int, int] | None:
        """A multi-task model's (obs dim, action dim), to which every task's envs are padded; None for one task."""
        return (self.obs_shape[0], self.action_dim) if self.multitask else None

    @classmethod
    def from_config(cls, cfg: Config, obs_shape: tuple[int, ...], action_dim: int, episodic: bool,
                    tasks: tuple[str, ...] = (), action_dims: tuple[int, ...] = (), discrete: bool = False) -> "ModelDims":
        """From a config and the task's dims; a multi-task model's task set and each task's action dims too."""
        values = {**cfg.to_dict(), **cfg.sizes()}
        return cls(obs_shape=tuple(obs_shape), action_dim=action_dim, episodic=episodic,
                   **{name: values[name] for name in CONFIG_DIMS},
                   tasks=tuple(tasks), task_dim=cfg.embedding_dim(len(tasks)) if tasks else 0,
                   action_dims=tuple(action_dims), discrete=discrete)

    def config_values(self) -> dict:
        """The Config fields that reproduce these dims (model_size None: the sizes are explicit)."""
        return {"model_size": None, "episodic": self.episodic, "obs": "rgb" if self.pixels else "state",
                "task_set": self.tasks, "task_dim": self.task_dim or None,
                **{name: getattr(self, name) for name in CONFIG_DIMS}}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["obs_shape"], d["tasks"], d["action_dims"] = list(self.obs_shape), list(self.tasks), list(self.action_dims)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelDims":
        return cls(**{**d, "obs_shape": tuple(d["obs_shape"]), "tasks": tuple(d.get("tasks", ())),
                      "action_dims": tuple(d.get("action_dims", ()))})


# The ModelDims fields that are Config fields of the same name: the sizes and the network settings.
CONFIG_DIMS: tuple[str, ...] = SIZE_FIELDS + tuple(f.name for f in dataclasses.fields(NetworkSettings))

Task = Union[Tensor, int, None]  # one id per row (broadcast against the rows of the input), one id for all, or none


class WorldModel(nn.Module):
    """Every method that takes a latent takes an optional task (multi-task models): its embedding is
    appended to the first input, [x, e], before the action, as the reference does."""

    # buffers (register_buffer)
    _action_masks: Tensor
    log_std_min: Tensor
    log_std_dif: Tensor

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        L, A, M, T = dims.latent_dim, dims.action_dim, dims.mlp_dim, dims.task_dim
        if dims.multitask and (dims.episodic or dims.pixels or dims.discrete):
            raise ValueError("multi-task models are for state observations, continuous actions and tasks without "
                             "terminations (as the reference's)")
        if dims.multitask:
            # Given its weight, so that torch's N(0, 1) initialisation does not run: init_weights draws it anew,
            # and on the meta device (the memory estimate) normal_ imports torch._dynamo (a second a start).
            self._task_emb = nn.Embedding(len(dims.tasks), T, max_norm=1, _weight=torch.empty(len(dims.tasks), T))
            masks = torch.zeros(len(dims.tasks), A)
            for i, n in enumerate(dims.action_dims):
                masks[i, :n] = 1
            self.register_buffer("_action_masks", masks)
        if dims.pixels:
            if L != dims.num_channels * 16:
                raise ValueError(f"pixel observations need latent_dim = 16 x num_channels "
                                 f"({16 * dims.num_channels}), got {L}")
            self._encoder: nn.Module = PixelEncoder(dims.obs_shape[0], dims.num_channels, dims.simnorm_dim)
        else:
            self._encoder = mlp(dims.obs_shape[0] + T, max(dims.num_enc_layers - 1, 1) * [dims.enc_dim], L,
                                last="simnorm", simnorm_dim=dims.simnorm_dim)
        self._dynamics = mlp(L + T + A, [M, M], L, last="simnorm", simnorm_dim=dims.simnorm_dim)
        self._reward = mlp(L + T + A, [M, M], dims.num_bins)
        self._termination = mlp(L, [M, M], 1) if dims.episodic else None
        self._pi = mlp(L + T, [M, M], A if dims.discrete else 2 * A)  # logits, or a Gaussian's mean and log std
        self._Qs = Ensemble(dims.num_q, L + T + A, [M, M], dims.num_bins, dropout=dims.dropout)
        init_weights(self)
        nn.init.zeros_(cast(nn.Linear, self._reward[-1]).weight)
        nn.init.zeros_(cast(EnsembleLinear, self._Qs[-1]).weight)
        self._target_Qs = copy.deepcopy(self._Qs).requires_grad_(False)
        self.two_hot = TwoHot(dims.num_bins, dims.vmin, dims.vmax)
        self.register_buffer("log_std_min", torch.tensor(float(dims.log_std_min)))
        self.register_buffer("log_std_dif", torch.tensor(float(dims.log_std_max - dims.log_std_min)))
        self._fused_first_layers: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # set in planning copies
        self._fused_second_layers: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # (2, ...) stacks, likewise
        self.random: RandomSource = TORCH

    def use_random(self, source: RandomSource) -> None:
        """Draw every random number (policy noise, Q-head pairs, dropout, the pixel shift) from `source`."""
        for m in self.modules():
            if hasattr(m, "random"):
                setattr(m, "random", source)

    # --- the interface planners use ---------------------------------------------------
    @property
    def num_q(self) -> int:
        return self.dims.num_q

    @property
    def episodic(self) -> bool:
        return self.dims.episodic

    @property
    def latent_dim(self) -> int:
        return self.dims.latent_dim

    @property
    def discrete(self) -> bool:
        return self.dims.discrete

    @property
    def latent_dtype(self) -> torch.dtype:
        return cast(NormedLinear, self._dynamics[-1]).weight.dtype

    def task_vector(self, task: Task, rows: tuple[int, ...]) -> Tensor | None:
        """The embedding rows of `task`, broadcast to rows + (task_dim,); None for a single-task model.

        A row whose weight has norm > 1 is rescaled in place at the lookup (nn.Embedding's max_norm),
        as in the reference."""
        if not self.dims.multitask:
            return None
        if task is None:
            raise ValueError("a multi-task model needs a task id for every row")
        ids = torch.as_tensor(task, device=self._task_emb.weight.device)
        return self._task_emb(ids).expand(*rows, self.dims.task_dim)

    def _with_task(self, x: Tensor, task: Task) -> Tensor:
        e = self.task_vector(task, x.shape[:-1])
        return x if e is None else torch.cat([x, e.to(x.dtype)], dim=-1)

    def action_mask(self, task: Task) -> Tensor | None:
        """(..., A) ones on each task's own action dims; None for a single-task model."""
        if not self.dims.multitask:
            return None
        return self._action_masks[torch.as_tensor(task, device=self._action_masks.device)]

    def encode(self, obs: Tensor, task: Task = None) -> Tensor:
        """Pixel frames are randomly shifted in every mode, as the reference's encoder shifts them (ShiftAug)."""
        if obs.is_floating_point():  # a reduced-precision planning copy takes its inputs in its dtype
            obs = obs.to(self.latent_dtype)
        if self.dims.pixels:
            return self._encoder(obs)
        return self._encoder(self._with_task(obs, task))

    def next(self, z: Tensor, a: Tensor, task: Task = None) -> Tensor:
        return self._dynamics(torch.cat([self._with_task(z, task), a.to(z.dtype)], dim=-1))

    def reward(self, z: Tensor, a: Tensor, task: Task = None) -> Tensor:
        """Reward logits over the two-hot bins."""
        return self._reward(torch.cat([self._with_task(z, task), a.to(z.dtype)], dim=-1))

    def latent_part(self, z: Tensor, task: Task = None) -> Tensor:
        """[z, e]'s share of step()'s first layers (both biases included), (..., 2M): planning computes it once
        for the latent that every candidate starts from, and step() adds the actions' share to it."""
        w, b, _, _ = self._fused_first_layers or self._concat_first_layers()
        s = self._with_task(z.to(w.dtype), task)
        return linear(s, w[:, :s.shape[-1]], b)

    def step(self, z: Tensor | None, a: Tensor, task: Task = None,
             z_part: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """next(z, a) and the reward's features (reward_logits() of them is reward(z, a)), with one matmul for
        both first layers (they share [z, e, a]). With z_part (latent_part() of the starting latents,
        broadcast against a's rows) z is not read. Planning runs the reward's last layer once over the horizon."""
        w, b, gamma, beta = self._fused_first_layers or self._concat_first_layers()
        if z_part is None and not torch.compiler.is_compiling():  # eager: one matmul over [z, e, a]
            assert z is not None
            h = linear(torch.cat([self._with_task(z.to(w.dtype), task), a.to(w.dtype)], dim=-1), w, b)
        else:  # compiled, no concatenation: 2 kernels a step on a GPU (a cat is one per input)
            if z_part is None:
                assert z is not None
                z_part = self.latent_part(z, task)
            h = (z_part + action_share(a, w[:, w.shape[1] - a.shape[-1]:])).to(w.dtype)
        h = h.unflatten(-1, (2, -1))  # (..., 2, M)
        h = ln_act(h, gamma, beta, "mish")
        if self._fused_second_layers is None:
            hd, hr = self._dynamics[1](h[..., 0, :]), self._reward[1](h[..., 1, :])
            return self._dynamics[2:](hd), torch.stack([hd, hr])
        # A planning copy runs both second layers as one batched matmul, heads first: (2, rows, M).
        w2, b2, gamma2, beta2 = self._fused_second_layers
        lead = h.shape[:-2]
        h = batched_linear(h.reshape(-1, 2, h.shape[-1]).transpose(0, 1), w2.transpose(1, 2), b2.unsqueeze(1))
        h = ln_act(h, gamma2, beta2, "mish", heads_first=True)
        # The features are the whole LayerNorm output, not the reward's half: compiled, inductor writes each
        # step's LayerNorm straight into the stack of whole outputs reward_logits() makes, where halves are copied.
        return self._dynamics[2:](h[0]).view(*lead, -1), h.view(2, *lead, -1)

    def reward_logits(self, features: list[Tensor]) -> Tensor:
        """The reward head's last layer on step()'s features of several steps, (steps, ..., bins). A step's
        features are both second hidden layers, heads first (2, ..., M): the dynamics' and the reward's."""
        hidden = torch.stack(features, dim=1)[1]  # (steps, ..., M), contiguous
        return self._reward[-1](hidden.reshape(-1, hidden.shape[-1])).view(*hidden.shape[:-1], -1)

    def _concat_first_layers(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        d, r = cast(NormedLinear, self._dynamics[0]), cast(NormedLinear, self._reward[0])
        return (torch.cat([d.weight, r.weight]), torch.cat([d.bias, r.bias]),
                torch.stack([d.ln.weight, r.ln.weight]), torch.stack([d.ln.bias, r.ln.bias]))

    def termination(self, z: Tensor, logits: bool = False) -> Tensor:
        """Probability (or logit) that the transition into z ended the episode (single-task models only)."""
        assert self._termination is not None
        out = self._termination(z)
        return out if logits else torch.sigmoid(out)

    def pi(self, z: Tensor, task: Task = None, eps: Tensor | None = None) -> Policy:
        """Squashed Gaussian policy prior; `eps` (the N(0, 1) draw) is sampled unless given.

        A multi-task model masks the raw mean, the log std and eps to the task's own action dims.
        scaled_entropy is the reference's bonus, -(active dims) x the Gaussian log-prob *before* the tanh
        correction, written as it writes it (entropy x scaled_log_prob / log_prob); squash_correction is
        that correction, which the 2023 release added to it (Config.entropy_bonus).

        A discrete model's prior is categorical (_categorical)."""
        if self.dims.discrete:
            return self._categorical(z, task, eps)
        mean, log_std, eps, mask = self._prior(z, task, eps)
        if mask is not None:
            active: Tensor | int = mask.sum(-1, keepdim=True)
        else:
            active = mean.shape[-1]
        gaussian_log_prob = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1, keepdim=True)
        action = torch.tanh(mean + eps * log_std.exp())
        squash = squash_correction(action)
        log_prob = gaussian_log_prob - squash
        scaled_log_prob = gaussian_log_prob * active
        scaled_entropy = -log_prob * (scaled_log_prob / (log_prob + 1e-8))  # the reference's order of operations
        return Policy(action, torch.tanh(mean), log_std, -log_prob, scaled_entropy, squash)

    def pi_action(self, z: Tensor, task: Task = None, eps: Tensor | None = None) -> Tensor:
        """pi(z, task, eps).action alone: what planning reads, without the log-probs it would not use."""
        if self.dims.discrete:
            logits = self._pi(self._with_task(z, task)).float()
            return one_hot_argmax(logits + gumbel(self._eps(logits) if eps is None else eps))
        mean, log_std, eps, _ = self._prior(z, task, eps)
        return torch.tanh(torch.addcmul(mean, eps, log_std.exp()))

    def _categorical(self, z: Tensor, task: Task, eps: Tensor | None) -> Policy:
        """The categorical prior: a sample (Gumbel-max, from eps's N(0, 1) draws) and the most probable action,
        one-hot; log_std holds the log-probabilities and probs the probabilities (the policy loss takes the
        expectation over the n actions, prior_value()); the bonus is the entropy, with nothing to squash."""
        log_probs = self._pi(self._with_task(z, task)).float().log_softmax(-1)
        probs = log_probs.exp()
        action = one_hot_argmax(log_probs + gumbel(self._eps(log_probs) if eps is None else eps))
        entropy = -(probs * log_probs).sum(-1, keepdim=True)
        return Policy(action, one_hot_argmax(log_probs), log_probs, entropy, entropy, torch.zeros_like(entropy), probs)

    def prior_value(self, z: Tensor, policy: Policy, task: Task = None) -> Tensor:
        """What the policy loss maximises, (..., 1), the Q weights detached (2 random heads, averaged): a Gaussian
        prior's Q of its reparameterised sample; a categorical prior's expected Q over its n actions, exact, so
        the gradient reaches the probabilities without a sampling estimator (the form of the reference's
        `discrete` branch and of SAC-Discrete)."""
        if not self.dims.discrete:
            q = self.decode(self.Q(z, policy.action, task, self.sample_heads("pi.q_pair"), detach=True))
            return q.mean(0)
        assert policy.probs is not None
        q = self.action_values(z, task, self.sample_heads("pi.q_pair"), detach=True).mean(0)  # (..., n)
        return (policy.probs * q).sum(-1, keepdim=True)

    def prior_q(self, z: Tensor, task: Task, reduce: Literal["min", "avg"], heads: Heads | None = None,
                eps: Tensor | None = None, target: bool = False, action: Tensor | None = None) -> Tensor:
        """The value of z under the policy prior, (..., 1), over 2 heads (random unless given): what planning
        adds after its horizon and TD targets bootstrap from. A Gaussian prior's is Q at one sample of it (`action`,
        drawn when None), as the reference's; a categorical prior's is its exact expectation over the n actions
        (SAC-Discrete's target), which spares the planner's scores and the targets a sample's noise for n Q
        evaluations (docs/discrete.md: a sampled bootstrap let CartPole's planner drop a pole its prior held).
        eps: the Gaussian prior's N(0, 1) draw for its sample (drawn when None and no action is given)."""
        heads = self.sample_heads("td_target.q_pair") if heads is None else heads
        assert not (target and isinstance(heads, ChosenHeads)), "q_heads() chooses the online heads' parameters"
        if not self.dims.discrete:
            a = self.pi_action(z, task, eps) if action is None else action
            q = self.decode(self.Q(z, a, task, heads, target=target))
            return q.min(0).values if reduce == "min" else q.mean(0)
        q = self.action_values(z, task, heads, target=target)
        q = q.min(0).values if reduce == "min" else q.mean(0)
        probs = self._pi(self._with_task(z, task)).float().softmax(-1)
        return (probs * q).sum(-1, keepdim=True)

    def action_values(self, z: Tensor, task: Task, heads: Heads, target: bool = False,
                      detach: bool = False) -> Tensor:
        """A discrete model's Q of each of its n actions at z (..., L), from the given heads: (heads, ..., n); Q of
        z with each one-hot action, its first layer's product with z computed once (Ensemble's every_action)."""
        net = self._target_Qs if target else self._Qs
        logits = net(self._with_task(z, task), heads, detach, every_action=self.dims.action_dim)
        return self.decode(logits).squeeze(-1)

    def action_input(self, action: Tensor) -> Tensor:
        """Actions as the envs take them (and the replay buffer stores them) -> what the networks read: a discrete
        model's integer actions as one-hot float rows, (...) -> (..., n); a continuous model's unchanged."""
        if not self.dims.discrete:
            return action
        rows = torch.zeros(*action.shape, self.dims.action_dim, device=action.device)
        return rows.scatter_(-1, action.long().unsqueeze(-1), 1.0)

    def env_action(self, action: Tensor) -> Tensor:
        """The inverse of action_input: planned one-hot rows -> (...) integer actions; continuous ones as float32."""
        return action.argmax(-1) if self.dims.discrete else action.float()

    def _prior(self, z: Tensor, task: Task, eps: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The prior's raw mean, bounded log std and N(0, 1) draw (masked to the task's dims), and the mask."""
        mean, log_std = self._pi(self._with_task(z, task)).float().chunk(2, dim=-1)
        log_std = self.log_std_min + 0.5 * self.log_std_dif * (torch.tanh(log_std) + 1)
        eps = self._eps(mean) if eps is None else eps
        mask = self.action_mask(task)
        if mask is not None:
            mean, log_std, eps = mean * mask, log_std * mask, eps * mask
        return mean, log_std, eps, mask

    def Q(self, z: Tensor, a: Tensor, task: Task = None, heads: Heads | None = None, target: bool = False,
          detach: bool = False) -> Tensor:
        """Value logits of the chosen heads (all by default): (heads, ..., num_bins)."""
        net = self._target_Qs if target else self._Qs
        return net(torch.cat([self._with_task(z, task), a.to(z.dtype)], dim=-1), heads, detach)

    def decode(self, logits: Tensor) -> Tensor:
        """Two-hot logits -> scalar values (..., 1)."""
        return self.two_hot.decode(logits)

    # --- helpers -------------------------------------------------------------------
    def q_heads(self, pairs: Tensor) -> list[Heads]:
        """Head pairs (draws, 2) -> what prior_q takes for each draw: a planning copy's parameters of all the
        draws chosen at once (one copy, not one per planner iteration), else the pairs themselves."""
        return list(self._Qs.choose(pairs)) if self._Qs.flattened else list(pairs)

    def sample_heads(self, name: str, draws: int | None = None) -> Tensor:
        """Two distinct random Q heads, chosen on the device (no host sync, CUDA-graph safe): (2,), or (draws, 2)
        for `draws` independent pairs in one draw (RandomSource.head_pairs, under `name`)."""
        heads = self.random.head_pairs(name, self.num_q, draws or 1, self.log_std_min.device)
        return heads if draws else heads[0]

    def _eps(self, like: Tensor) -> Tensor:
        """The prior's N(0, 1) draw where a caller gives none."""
        return self.random.normal("pi.eps", tuple(like.shape), like.device).to(like.dtype)

    @torch.no_grad()
    def soft_update_targets(self, tau: float) -> None:
        torch._foreach_lerp_(list(self._target_Qs.parameters()), list(self._Qs.parameters()), tau)

    def train(self, mode: bool = True) -> "WorldModel":
        super().train(mode)
        self._target_Qs.train(False)
        return self

    def world_model_parameters(self) -> list[nn.Parameter]:
        """The world-model optimiser's parameters: everything learnable but the policy prior's."""
        pi = {id(p) for p in self._pi.parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in pi]

    @property
    def num_learnable_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def action_share(a: Tensor, w: Tensor) -> Tensor:
    """a @ w.T for a first layer's action columns w (M, A). Compiled with few actions: A multiply-adds per output,
    which inductor fuses into the LayerNorm that reads them (a matmul would be a kernel of its own, and a cast of
    the actions another); else one matmul in w's dtype."""
    if torch.compiler.is_compiling() and a.shape[-1] <= 32:
        return sum((a[..., k, None] * w[:, k] for k in range(a.shape[-1])), torch.zeros((), device=a.device))
    return linear(a.to(w.dtype), w)


def gumbel(eps: Tensor) -> Tensor:
    """Gumbel(0, 1) noise from N(0, 1) draws (through the normal CDF), so that every prior samples from the same
    draws: the agent's and the planner's N(0, 1) noise serve the categorical prior as they serve the Gaussian."""
    return -torch.log(-torch.log(torch.special.ndtr(eps)))


def squash_correction(action: Tensor) -> Tensor:
    """sum log(1 - a^2) over the action dims (+1e-6 inside, as the reference): the log-det of tanh, (..., 1).
    Near |a| = 1 it hangs on tanh's last bit (one float32 ulp below 1 moves it by ~0.1)."""
    return torch.log(torch.relu(1 - action.pow(2)) + 1e-6).sum(-1, keepdim=True)
