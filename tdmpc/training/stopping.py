"""Stop signals (SIGTERM, SIGINT, SIGUSR1) for the training loop: from its start a signal asks the run to stop at
the next step, after a checkpoint; before it, or at a second Ctrl-C, a command stops at once in one line."""

from __future__ import annotations

import atexit
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from tdmpc.errors import STOP_SIGNALS, Interrupted, in_command
from tdmpc.training.run_dir import checkpoint_path


class StopSignals:
    """The Trainer's handling of stop signals, apart from the loop it stops (tdmpc.training.trainer)."""

    run_dir: Path
    stop_reason: str | None
    stop_signal: int | None
    interrupts: int
    aborted_by: int | None
    looping: bool
    run_ended: bool
    old_handlers: dict[int, Any] | None
    old_unraisable_hook: Any = None

    @property
    def checkpoint_path(self) -> Path:
        return checkpoint_path(self.run_dir)

    @property
    def quoted_run_dir(self) -> str:
        """The run directory as a shell word, for the commands that messages suggest."""
        return shlex.quote(str(self.run_dir))

    def last_checkpoint(self) -> str:
        """Where the run can be taken up again, for an error message."""
        if self.checkpoint_path.is_file():
            return f"the last good checkpoint is {self.checkpoint_path}"
        return "no checkpoint was written yet"

    def install_stop_handlers(self) -> None:
        """Our handlers of the stop signals (SIGTERM, SIGINT, SIGUSR1). From run() on, a stop signal asks the run to
        stop at the next step, after writing a checkpoint. In a command the trainer sets them as soon as it is
        built: a stop signal in the work before its loop (the first start's build of the CPU kernels, the speed
        check) stops the command at once, in one line that says what there is to go on from (exit 128 + the
        signal: 130 for Ctrl-C), instead of a false 'interrupted again', or no word at all."""
        if self.old_handlers is None:
            self.old_handlers = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
            self.old_unraisable_hook, sys.unraisablehook = sys.unraisablehook, self._on_unraisable

    def restore_stop_handlers(self) -> None:
        """The handlers from before run(). In a command, which exits once run() returns, SIGTERM and SIGUSR1 (and
        SIGINT too after a signal's stop) stay with the ended run, which ignores them: a stop signal on the way out
        (a scheduler's TERM after its USR1, a SIGTERM passed on beside a Ctrl-C, one that came as the run finished)
        finds nothing left to stop, instead of killing the process (exit 143) once its work is done. At exit they
        become SIG_IGN (_ignore_at_exit); until then a Python handler, which the processes a command's process
        starts do not inherit (an ignored signal they would: a TERM could not stop them)."""
        if self.old_handlers is None:
            return
        self.run_ended = self.run_ended or self.looping
        for s, h in self.old_handlers.items():
            kept = in_command() and self.looping and (s != signal.SIGINT or self.stop_signal is not None)
            signal.signal(s, _after_the_run if kept else h)
        self.old_handlers = None
        sys.unraisablehook, self.old_unraisable_hook = self.old_unraisable_hook, None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.run_ended:  # the stop's checkpoint is written, or the run finished: nothing left to stop
            return
        if not self.looping:  # a command's run before its loop: nothing trained yet, so stop at once
            self.aborted_by = signum  # raised again as the loop would start, if Python drops it (check_aborted)
            raise self._stopped_at_once(signum)
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:  # a second Ctrl-C aborts at once
                self.aborted_by = signum
                raise self._stopped_at_once(signum)
        if self.stop_signal is None:  # a later signal of another kind (a forwarded SIGTERM) changes nothing
            self.stop_reason = f"signal {signal.Signals(signum).name}"
            self.stop_signal = signum

    def _on_unraisable(self, unraisable: Any) -> None:
        """Python prints an exception it drops (one a signal handler raised inside a weakref callback or a __del__)
        as 'Exception ignored in ... Traceback': a stop at once (a second Ctrl-C, a signal before the loop) is raised
        again at the next safe point (check_aborted), so it says nothing here; any other goes to the hook from
        before."""
        if self.aborted_by is not None and isinstance(unraisable.exc_value, (Interrupted, KeyboardInterrupt)):
            return
        self.old_unraisable_hook(unraisable)

    def check_aborted(self, checkpoint_written: bool = False) -> None:
        """Raise a stop at once again at a safe point (the loop's, and as it starts). Python runs a signal handler
        between any two bytecodes, so its exception can land in a weakref callback or a __del__, where Python
        drops it: the run would carry on, write the stop's checkpoint and exit 3 as if Ctrl-C came once, or train
        through a signal that came before its loop. checkpoint_written: the stop's checkpoint was written
        meanwhile (the line says so)."""
        if self.aborted_by is not None:
            raise self._stopped_at_once(self.aborted_by, checkpoint_written)

    def _stopped_at_once(self, signum: int, checkpoint_written: bool = False) -> BaseException:
        """A second Ctrl-C, or a stop signal before a command's loop: KeyboardInterrupt for Python callers
        (tdmpc.fit); in a command, its one line saying what there is to go on from (exit 128 + the signal)."""
        if not in_command():
            return KeyboardInterrupt()
        if self.checkpoint_path.is_file():
            how = f"{self.last_checkpoint()} (resume with --resume {self.quoted_run_dir})"
        else:
            how = "no checkpoint was written yet (the same command starts the run afresh)"
        if not self.looping:
            what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
            return Interrupted(f"{what} before training started, so at once: nothing was trained; {how}",
                               128 + signum)
        if checkpoint_written:  # the stop's checkpoint was written before the second Ctrl-C took effect
            return Interrupted(f"interrupted again, after the stop's checkpoint; {how}")
        return Interrupted(f"interrupted again, so stopped at once without a new checkpoint; {how}")


def _after_the_run(signum: int, frame: Any) -> None:
    """A command's stop signal after its run ended (StopSignals.restore_stop_handlers): nothing left to stop."""


@atexit.register
def _ignore_at_exit() -> None:
    """Python's exit puts Python signal handlers back to the default before it tears the modules down (torch's
    teardown takes seconds), where a TERM after the stop's checkpoint killed the run (143: not requeued). Exit
    handlers run before that, and an ignored signal stays ignored to the end."""
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is _after_the_run:
            signal.signal(s, signal.SIG_IGN)
