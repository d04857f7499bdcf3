"""A checkpoint write killed at any instant leaves a complete checkpoint of its step or the one
before, for every ``keep`` (issue 16: a kill between the two renames of a same-step re-save used
to leave both copies in temporary directories, and a keep = 1 peer started from scratch).

A forked child (torch already imported: no 4 s start) writes the checkpoints with the named test
hook ``HIVEMESH_TEST_CHECKPOINT_HOOK`` set, and the hook SIGKILLs it at the chosen point of its
last write; the parent then opens the folder as a restarted peer does (``recover``, then
``load_latest``) and checks what it got against the tensors that were written.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from peer.files.statefiles import CheckpointStore
from peer.runtime.daemon import PeerDaemon
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import (
    SAVE_VARIABLE,
    SaveHook,
    save_hook_json,
    save_point,
    save_point_from_environment,
)
from peer.train import checkpoint
from peer.train.checkpoint import SAVE_POINTS, load_latest
from tests._daemon_support import make_network
from tests.test_daemon_limits import RecordingTransport

torch.set_num_threads(1)

FIRST, SECOND = 4, 8      # the steps written; the last write is of SECOND (new, or again)


def state(step: int, *, final: bool = False) -> dict[str, Any]:
    """A trainer state whose tensors say which step and which copy they are."""
    value = step + (0.5 if final else 0.0)
    return {"tensors": {"weight": torch.full((64, 64), value), "bias": torch.arange(64.0) + value},
            "meta": {"step": step}}


def write_then_die(directory: Path, *, keep: int, hook: SaveHook, again: bool) -> int:
    """Fork a writer: FIRST, then SECOND (and SECOND again, the final copy, when ``again``), the
    hook armed for the last write only. Returns how the child ended (its signal, or 0)."""
    pid = os.fork()
    if pid == 0:    # the child: never returns into pytest
        try:
            store = CheckpointStore(directory, keep=keep)
            store.save(state(FIRST), None, {"copy": "periodic"})
            if again:
                store.save(state(SECOND), None, {"copy": "periodic"})
            os.environ[SAVE_VARIABLE] = save_hook_json(hook)
            store.at_point = save_point_from_environment()
            store.save(state(SECOND, final=again), None, {"copy": "final" if again else "periodic"})
        finally:
            os._exit(0)     # the hook did not fire
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


def expected_step(point: str, *, again: bool) -> set[int]:
    """What a restarted peer may load: the step being written once its copy is complete, else the
    step before; for a re-save, SECOND always (one of its two complete copies)."""
    if again:
        return {SECOND}
    return {FIRST} if point == "temp_data" else {SECOND}


CASES = [(point, again, keep) for again in (False, True) for point in SAVE_POINTS for keep in (1, 2)
         if again or point in ("temp_data", "temp_complete")]    # the renames of a re-save only


@pytest.mark.parametrize(("point", "again", "keep"), CASES)
def test_a_write_killed_at_any_point_leaves_a_complete_checkpoint(tmp_path: Path, point: str, again: bool,
                                                                   keep: int) -> None:
    folder = tmp_path / "data"
    mark = tmp_path / "fired"
    ended = write_then_die(folder, keep=keep, hook=SaveHook(point=point, action="kill", at_step=SECOND,
                                                            mark=str(mark)), again=again)
    assert ended == signal.SIGKILL and mark.exists()

    # read-only, as any reader: a complete temporary is found, a torn one passed over
    found = load_latest(folder / "checkpoints")
    assert found is not None and found.step in expected_step(point, again=again)
    # a restarted peer: recover() first, then the same checkpoint under its own name, nothing left over
    store = CheckpointStore(folder, keep=keep)
    store.recover()
    names = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert not [n for n in names if n.startswith(".")], names
    loaded = store.load_latest()
    assert loaded is not None
    trainer_state, _, extra = loaded
    step = trainer_state["meta"]["step"]
    assert step == found.step and store.step == step
    # complete, and the newest complete copy of that step: the final one once the periodic one of
    # the same step has stepped aside for it (a torn mix of two never verifies)
    newest = "final" if again and point in ("old_moved", "new_placed") else "periodic"
    assert extra["copy"] == newest
    written = state(step, final=newest == "final")
    for name, tensor in written["tensors"].items():
        assert torch.equal(trainer_state["tensors"][name], tensor), name
    # and the next save keeps it until it is itself complete
    assert store.save(state(SECOND + 4), None, {"copy": "periodic"}) == ""
    assert checkpoint.list_checkpoints(folder / "checkpoints")[0][0] == SECOND + 4


def test_a_torn_temporary_is_never_loaded_even_with_a_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    checkpoint.save(folder, state(FIRST), keep=2)
    written = checkpoint.save(folder, state(SECOND), keep=2)
    torn = folder / f"{checkpoint.TEMP_PREFIX}{SECOND + 4:012d}-999999"
    written.rename(torn)        # a complete copy, then one byte of its tensors lost
    data = (torn / checkpoint.TRAINER_FILE).read_bytes()
    (torn / checkpoint.TRAINER_FILE).write_bytes(data[:-1])
    found = load_latest(folder)
    assert found is not None and found.step == FIRST and found.skipped == ()   # a torn write is no loss
    assert checkpoint.recover(folder) == [f"removed {torn.name}"]
    assert sorted(p.name for p in folder.iterdir()) == [f"ckpt-{FIRST:012d}"]


def test_a_held_write_can_be_released(tmp_path: Path) -> None:
    gate, mark = tmp_path / "gate", tmp_path / "mark"
    gate.touch()    # already open: the write goes straight on (a test opens it from outside)
    hook = SaveHook(point="old_moved", action="hold", gate=str(gate), mark=str(mark))
    os.environ[SAVE_VARIABLE] = save_hook_json(hook)
    try:
        store = CheckpointStore(tmp_path, keep=1, at_point=save_point_from_environment())
    finally:
        del os.environ[SAVE_VARIABLE]
    assert store.save(state(SECOND), None, {}) == "" and not mark.exists()   # nothing replaced yet
    assert store.save(state(SECOND), None, {}) == "" and mark.exists()
    with pytest.raises(ValueError, match="point"):
        SaveHook(point="halfway", action="kill")


def test_a_peer_killed_between_the_renames_of_its_stop_save_resumes_from_that_step(tmp_path: Path) -> None:
    """The issue's case, through a real daemon's pieces (its transport a recorder): a periodic save,
    then the SIGTERM save of the same step killed between its renames, keep = 1. The restarted
    daemon puts the complete copy back in place before it loads (before: it started from scratch)."""
    network = make_network(tmp_path / "net", peers=4, steps=40,
                           sections={"checkpoint": {"every_steps": 5, "keep": 1}})
    config = load_peer_config(network.configs["p00"])
    first = PeerDaemon(config)
    first.transport = RecordingTransport()  # type: ignore[assignment]
    try:
        first.trainer.run_steps(5)
        assert first._checkpoint(final=False)      # the periodic one
        trained = first.trainer.state_dict()["tensors"]
        pid = os.fork()
        if pid == 0:
            try:
                first.store.at_point = save_point(SaveHook(point="old_moved", action="kill"))
                first._checkpoint(final=True)       # the stop's, of the same step
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        first.parts.lock.release()
    assert checkpoint.list_checkpoints(config.data_dir / "checkpoints") == []     # both copies aside
    again = PeerDaemon(config)
    again.transport = RecordingTransport()  # type: ignore[assignment]
    try:
        assert again._restore() and again.trainer.step == 5
        for name, tensor in again.trainer.state_dict()["tensors"].items():
            assert torch.equal(tensor, trained[name]), name
        assert [s for s, _ in checkpoint.list_checkpoints(config.data_dir / "checkpoints")] == [5]
        assert not [p for p in (config.data_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    finally:
        again.parts.lock.release()
