"""Autoreset: what happens to an env whose episode ended, one small policy per Gymnasium ``AutoresetMode``.

Read beside ``SyncVectorEnv.step`` (Gymnasium 1.x, ``sync_vector_env.py``), whose
loop over envs is the specification::

    NEXT_STEP   if ended[i]: reset instead of step; reward 0, not terminated, not truncated
                else:        step
    SAME_STEP   step; if it ended: info gets final_obs and final_info, then reset
                (the obs returned is the reset's; reward and flags stay the step's)
    DISABLED    step (an env whose episode ended must be reset by the caller first)
    then        ended = terminated | truncated

A pool sends a whole request per server rather than looping over envs, so a
policy answers two questions about a batch of envs, each with a bool mask
(one entry per env): :meth:`Autoreset.before_step` (which envs about to step
are reset instead) and :attr:`Autoreset.within_step` (whether an episode that
ends is reset within the step that ended it). A failed step counts as an
episode end (``truncated``, with ``info["openenv_error"]``): under SAME_STEP it
is reset within the step, else by the next step.
"""

from __future__ import annotations

import numpy as np
from gymnasium.vector import AutoresetMode

from .._masks import any_true

__all__ = ["Autoreset", "Disabled", "NextStep", "SameStep", "autoreset_policy"]


class Autoreset:
    """How a pool resets envs whose episode ended (see the module docstring).

    Attributes:
        mode: the Gymnasium mode.
        within_step: an episode that ends is reset within the step that ended
            it (its last observation and info go in ``final_obs`` and ``final_info``).
    """

    mode: AutoresetMode
    within_step: bool = False

    def before_step(self, ids: np.ndarray, ended: np.ndarray) -> np.ndarray | None:
        """Of the envs ``ids`` (int64 ``(k,)``) about to step, those reset instead: bool ``(k,)``, or ``None`` for none.

        ``ended``: bool ``(k,)``, the envs whose last step ended their episode
        (or failed) and that no reset has started again since.
        """
        return ended if any_true(ended) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NextStep(Autoreset):
    """``NEXT_STEP``: an env whose episode ended is reset by its next step, whose action is ignored."""

    mode = AutoresetMode.NEXT_STEP


class SameStep(Autoreset):
    """``SAME_STEP``: an env whose episode ends is reset within the same step.

    An env is still reset by its next step where the reset within the step
    could not be made (its server failed it), as under ``NEXT_STEP``.
    """

    mode = AutoresetMode.SAME_STEP
    within_step = True


class Disabled(Autoreset):
    """``DISABLED``: never reset by the pool; stepping an env whose episode ended is an error."""

    mode = AutoresetMode.DISABLED

    def before_step(self, ids: np.ndarray, ended: np.ndarray) -> np.ndarray | None:
        """Refuse to step ended envs.

        Raises:
            ValueError: some of ``ids`` ended; reset them with ``reset(options={"reset_mask": mask})``.
        """
        if any_true(ended):
            raise ValueError(
                f"envs {ids[ended].tolist()} ended; with autoreset_mode=DISABLED, reset them with "
                "reset(options={'reset_mask': mask}) before stepping"
            )
        return None


_POLICIES: dict[AutoresetMode, type[Autoreset]] = {
    AutoresetMode.NEXT_STEP: NextStep,
    AutoresetMode.SAME_STEP: SameStep,
    AutoresetMode.DISABLED: Disabled,
}


def autoreset_policy(mode: AutoresetMode | str) -> Autoreset:
    """The policy of a Gymnasium ``AutoresetMode`` (or its string value).

    Raises:
        ValueError: not a mode.
    """
    return _POLICIES[AutoresetMode(mode)]()
