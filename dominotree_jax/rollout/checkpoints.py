"""The rollout engine's state saved and restored beside tunix's actor checkpoints.

tunix checkpoints the policy and its optimizer (orbax); what ``DominoTreeRollout`` carries
between rollouts (PRNG key, ``budget="auto"`` states, refreshed drafter and its optimizer:
``checkpoint_state()``) it does not know about. ``attach_engine_checkpoints`` wraps the actor
trainer's checkpoint manager so that whenever tunix saves train step ``n`` the engine state
is written as ``<directory>/<n>.npz`` (a ``state_file``: JSON plus arrays, written atomically,
read without running anything it holds); ``restore_engine_state`` puts back the state of the
step tunix restored, its optimizer state in the live engine's own structure. Step ``n`` means
``n`` updates done: the state then holds what the rollouts before update ``n`` left.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from dominotree_jax.rollout.state_file import StateFileError, read_state_file, write_state_file

STATE_FILE = re.compile(r"(\d+)\.npz")
KIND = "engine"   # the ``meta["kind"]`` of an engine state file


def engine_state_path(directory: str, step: int) -> str:
    """Where the engine state of train step ``step`` is kept: ``<directory>/<step>.npz``."""
    return os.path.join(directory, f"{int(step)}.npz")


def saved_engine_steps(directory: str) -> list[int]:
    """The train steps with an engine state file in ``directory``, ascending (none: [])."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(STATE_FILE.fullmatch, os.listdir(directory))
                  if m)


def write_engine_state(directory: str, step: int, engine) -> str:
    """Write ``engine.checkpoint_state()`` for train step ``step`` to
    ``engine_state_path(directory, step)`` atomically (a ``.tmp`` file, then a rename: a crash
    leaves the old file or the new one, never half of one); returns the path. A state holding
    something a state file cannot hold (a function, an unknown class) is refused, naming it."""
    os.makedirs(directory, exist_ok=True)
    return write_state_file(engine_state_path(directory, step), engine.checkpoint_state(),
                            {"kind": KIND, "step": int(step)})


def read_engine_state(directory: str, step: int, like: Any = None) -> dict:
    """The ``checkpoint_state()`` dict saved for train step ``step`` in ``directory``.
    ``like``: the live engine's ``checkpoint_state()``, whose structure its pytrees (the
    refresher's optimizer state) are restored into; without it a state holding one is refused.
    A file that is not an engine state of that step is refused (``StateFileError``)."""
    path = engine_state_path(directory, step)
    if not os.path.exists(path):
        old = os.path.join(directory, f"{int(step)}.pkl")
        if os.path.exists(old):
            raise StateFileError(f"{old} is an engine state of an older version (a .pkl file, "
                                 "which runs code when opened): it is not read; resume from a "
                                 "step saved since, or start afresh")
        have = saved_engine_steps(directory)
        raise FileNotFoundError(f"the engine state of train step {step} ({path}) is missing "
                                f"(steps saved in {directory}: {have or 'none'})")
    meta, state = read_state_file(path, like)
    if meta.get("kind") != KIND or not isinstance(state, dict):
        raise StateFileError(f"{path} is not an engine state file (kind {meta.get('kind')!r}, "
                             f"holding a {type(state).__name__})")
    if meta.get("step") != step:
        raise StateFileError(f"{path} holds the engine state of step {meta.get('step')}, "
                             f"not {step}")
    return state


class EngineCheckpoints:
    """A tunix ``CheckpointManager`` (the actor trainer's) that also writes the engine state.

    ``save(step, ...)`` calls the wrapped manager's; when that saved (returns True) it calls
    ``before_engine_save(step)`` (if given: raise there to stop a run whose own bookkeeping
    disagrees with tunix's step), writes ``engine().checkpoint_state()`` as
    ``<directory>/<step>.npz`` and deletes all but the newest ``keep + 1`` state files (orbax
    keeps ``keep`` checkpoints and may still be writing the newest). Every other attribute is
    the wrapped manager's.

    tunix's final forced save (at the end of ``train``, or at ``max_steps``) passes no
    metadata, so a run restored from it would restart its global step at 0; such a save gets
    ``{"global_step": step // train_steps_per_global_step, "role": "actor"}``.
    """

    def __init__(self, inner, directory: str, engine: Callable[[], Any], keep: int, *,
                 before_engine_save: Callable[[int], None] | None = None,
                 train_steps_per_global_step: int = 1):
        if not callable(engine) or hasattr(engine, "checkpoint_state"):
            raise TypeError(f"engine must be a function returning the engine (e.g. ``lambda: "
                            f"cluster.rollout``), got {type(engine).__name__}")
        if int(keep) < 1:
            raise ValueError(f"keep must be >= 1 (checkpoints kept), got {keep}")
        if int(train_steps_per_global_step) < 1:
            raise ValueError(f"train_steps_per_global_step must be >= 1, got "
                             f"{train_steps_per_global_step}")
        self.inner, self.directory, self.engine = inner, directory, engine
        self.keep, self.before_engine_save = int(keep), before_engine_save
        self.train_steps_per_global_step = int(train_steps_per_global_step)
        os.makedirs(directory, exist_ok=True)

    def save(self, step, model, optimizer=None, save_only_lora_params=False, force=False,
             custom_metadata=None):
        if not custom_metadata:
            custom_metadata = {"global_step": int(step) // self.train_steps_per_global_step,
                               "role": "actor"}
        saved = self.inner.save(step, model, optimizer, save_only_lora_params=save_only_lora_params,
                                force=force, custom_metadata=custom_metadata)
        if saved:
            if self.before_engine_save is not None:
                self.before_engine_save(int(step))
            write_engine_state(self.directory, step, self.engine())
            for old in saved_engine_steps(self.directory)[:-(self.keep + 1)]:
                os.remove(engine_state_path(self.directory, old))
        return saved

    def __getattr__(self, name):
        if name == "inner":   # (not set yet: during a copy / before __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)


def attach_engine_checkpoints(cluster, directory: str, keep: int, **options) -> EngineCheckpoints:
    """Wrap ``cluster.actor_trainer.checkpoint_manager`` in an ``EngineCheckpoints`` writing
    ``cluster.rollout``'s state to ``directory`` (``keep``: orbax's ``max_to_keep``;
    ``options``: ``before_engine_save``, ``train_steps_per_global_step``); returns it."""
    trainer = cluster.actor_trainer
    if isinstance(trainer.checkpoint_manager, EngineCheckpoints):
        raise ValueError("the actor trainer's checkpoint manager already writes engine states")
    manager = EngineCheckpoints(trainer.checkpoint_manager, directory, lambda: cluster.rollout,
                                keep, **options)
    trainer.checkpoint_manager = manager
    return manager


def restore_engine_state(cluster, directory: str, step: int | None = None, *,
                         sync_weights: bool) -> int:
    """Put back into ``cluster.rollout`` the engine state of train step ``step`` (None: the
    step tunix restored, ``cluster.actor_trainer.train_steps``) from ``directory``; with
    ``sync_weights`` (the learner's ``should_sync_weights``: the engine holds its own copy of
    the policy) also load the restored policy into it. Returns the step (0: a fresh run,
    nothing restored)."""
    step = cluster.actor_trainer.train_steps if step is None else int(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step == 0:
        return 0
    try:
        state = read_engine_state(directory, step, like=cluster.rollout.checkpoint_state())
    except FileNotFoundError as e:
        raise FileNotFoundError(f"tunix restored train step {step}, but {e}") from None
    cluster.rollout.restore_checkpoint_state(state)
    if sync_weights:   # else the engine reads the trainer's (restored) variables
        from flax import nnx
        cluster.rollout.update_params(nnx.state(cluster.actor_trainer.model))
    return step


def finish_checkpoint_writes(cluster) -> None:
    """Wait until orbax has finished writing the actor checkpoint it has started (call it in a
    ``finally:`` after ``learner.train``: an interrupted run then leaves whole checkpoints)."""
    manager = cluster.actor_trainer.checkpoint_manager
    inner = manager.inner if isinstance(manager, EngineCheckpoints) else manager
    orbax = getattr(inner, "_checkpoint_manager", None)   # tunix 0.1.7 has no public wait
    if orbax is not None:
        orbax.wait_until_finished()
