"""Two peer daemons training on one CUDA device and gossiping over ZeroMQ (skipped without CUDA).

bench/gpu_two_peers.py does the same on a GPU machine and also times an exchange.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon_support import consensus_max_relative, describe, final_params, make_network, peers, status

pytestmark = [pytest.mark.gpu, pytest.mark.processes]


def test_two_peers_train_and_gossip_on_one_gpu(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=2, topology="complete", steps=200,
                         trainer={"device": "cuda"})
    with peers(files) as processes:
        processes.start_all()
        finished = processes.wait(300)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    for name in files.configs:
        found = status(files, name)
        assert found["state"] == "finished" and found["step"] == 200
        assert found["accuracy"] >= 0.90, describe(files)
        assert found["rejections"] == {}
    assert consensus_max_relative(final_params(files)) < 1e-2
