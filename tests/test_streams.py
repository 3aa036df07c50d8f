"""--update-stream's ordering, on the CPU: where the trainer and the actor call the stream's events, and which
weights each plan reads. (On a GPU those calls are the only order between the two streams; tests/test_cuda.py
compares a run on two streams with the serial order.)"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from tdmpc.config import Config, validate
from tdmpc.runtime.streams import UpdateStream
from tdmpc.training.setup import trainer_for

from helpers import TINY


class Recording(UpdateStream):
    """The stream's calls in the order made, with the updates the trainer had made at each."""

    def __init__(self, trainer):
        super().__init__(torch.device("cpu"), False)
        self.trainer, self.log = trainer, []

    def _note(self, what: str) -> None:
        c = self.trainer.counters
        self.log.append((what, c.updates, c.updates_queued))

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:  # on the CPU the real one only yields
        self._note("round")
        yield
        self._note("round done")

    def inputs_ready(self) -> None:
        self._note("inputs")

    def before_refresh(self) -> None:
        self._note("refresh")

    def sampled(self) -> None:
        self._note("sampled")

    def before_store(self) -> None:
        self._note("store")

    def join(self) -> None:
        self._note("join")


def test_a_round_waits_for_the_refresh_and_the_rows_and_a_plan_reads_all_rounds_but_the_queued_one(tmp_path: Path):
    cfg = validate(Config(**{**TINY, "seed_steps": 50, "steps": 10**6, "eval_freq": 10**6, "log_every": 10**6,
                             "save_every": 10**6, "overlap_updates": True, "update_stream": True}))
    trainer = trainer_for(cfg, tmp_path / "run", torch.device("cpu"))
    assert trainer.agent.streams.stream is None  # on the CPU the stream changes nothing
    rec = Recording(trainer)
    trainer.agent.streams = trainer.agent.actor.streams = rec
    while trainer.counters.step < 50:  # seeding and the pretraining burst: no rounds
        trainer.step()
    pretrained = trainer.counters.updates
    rec.log.clear()
    for _ in range(20):
        trainer.step()
    trainer.evaluate()
    trainer.close()
    names = [what for what, _, _ in rec.log]
    assert names.count("round") == 20 and names.count("store") == 20  # 19 steps' rounds, then evaluate()'s
    evaluation = names.index("join")
    assert evaluation == evaluate_at(names)  # evaluate() joins the side stream after its round, before it plans
    for i, (what, updates, queued) in enumerate(rec.log):
        before = names[:i]
        if what == "round":  # after this step's refresh and the rows stored last: the inputs mark is later
            marks = [j for j, n in enumerate(before) if n in ("store", "refresh", "inputs")]
            assert before[marks[-1]] == "inputs", rec.log[:i + 1]
        if what == "sampled":  # batches are drawn inside a round
            assert before.count("round") == before.count("round done") + 1, rec.log[:i + 1]
        if what == "refresh":  # never inside a round; reads every update but the round queued after this plan
            assert before.count("round") == before.count("round done"), rec.log[:i + 1]
            assert updates == pretrained + before.count("round"), rec.log[:i + 1]
            if i < evaluation:
                assert queued == (0 if before.count("round") == 0 else 1), rec.log[:i + 1]
            else:  # the evaluation plans after the join, on every update
                assert queued == 0 and updates == pretrained + 20
    assert names[evaluation + 1:].count("refresh") == 1


def evaluate_at(names: list[str]) -> int:
    """Where evaluate() began: its round, the last."""
    return max(i for i, n in enumerate(names) if n == "round done") + 1
