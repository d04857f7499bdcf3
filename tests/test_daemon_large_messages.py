"""Two peers exchanging a 240 MB model message every round get both messages whole (issue 29).

Before the fix each peer blocked waiting for its own send (before training, before mixing) without
reading its inbox: once a message outgrew what the receiving side's ZeroMQ queue and the kernel's
buffers hold (about 200 MB with the defaults), each peer's frames waited for the other to read, the
stall timeout (the round deadline) abandoned them, the receiver released the half-assembled message
as ``incomplete`` and the round closed alone. Real processes on 127.0.0.1, D-PSGD, the round
deadline and the transport at their defaults; the model is wide, not deep (tests/_wide_task.py), so a
step is cheap and the exchange is what is tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon_support import make_network, no_neighbour_lost, run_to_end

pytestmark = [pytest.mark.processes, pytest.mark.slow]

TASK = str(Path(__file__).with_name("_wide_task.py")) + ":wide_digits"
HIDDEN = 800_000        # 60M float32 parameters: a 240 MB message, beyond the ~200 MB that used to pass
STEPS = 3


def test_every_round_mixes_both_members_whole_240_mb_messages(tmp_path: Path) -> None:
    # Prepare: two peers (a ring of two: each the other's only neighbour), a small batch
    files = make_network(tmp_path / "net", peers=2, steps=STEPS, task=TASK, task_options={"hidden": HIDDEN},
                         trainer={"batch_size": 8})
    # Execute
    found = run_to_end(files)
    # Assert: no message cut short, no send given up, no round closed without the other's message
    for name, peer in found.items():
        assert "incomplete" not in peer["rejections"], f"{name}: {peer['rejections']}"
        assert peer["abandoned_sends"] == {}, f"{name}: {peer['abandoned_sends']}"
        assert peer["metrics"].get("rounds_alone", 0) == 0, f"{name}: {peer['metrics']}"
    no_neighbour_lost(files)
    # ... and every model byte one sent, the other accepted (heartbeats aside: the last ones of a
    # finishing peer may meet a neighbour that has exited)
    a, b = found["p00"], found["p01"]
    for sender, receiver in ((a, b), (b, a)):
        assert sender["messages_sent_by_kind"]["param_push"] >= STEPS
        assert sender["bytes_sent_by_kind"]["param_push"] == receiver["bytes_accepted_by_kind"]["param_push"]
        assert sender["bytes_sent_by_kind"]["param_push"] >= STEPS * 4 * 75 * HIDDEN
