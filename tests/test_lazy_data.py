"""Tasks of map-style Datasets (issue 29 item 3): shards from the count alone, batches fetched per
step, memory independent of the dataset's size."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from peer.files.schema import NetworkSection, PartitionConfig
from peer.train.build import build_trainers
from peer.train.partition import iid_shard, partition
from peer.train.tasks import Task, TaskError, get_task
from peer.train.trainer import Trainer, TrainerConfig

ROOT = Path(__file__).resolve().parent.parent
NAMES = [f"p{i:02d}" for i in range(16)]


@pytest.mark.parametrize(("n", "members", "chunk"),
                         [(1000, 16, 97), (5000, 3, 4096), (17, 16, 5), (20000, 7, 3)])
def test_iid_shard_is_the_member_s_shard_of_partition(n: int, members: int, chunk: int) -> None:
    names = [f"m{i}" for i in range(members)][::-1]  # any order
    full = partition(np.zeros(n), names, seed=5)
    for name in names:
        assert np.array_equal(iid_shard(n, names, name, seed=5, chunk=chunk), full[name])


def test_a_task_of_datasets_trains_as_the_same_tensors_do() -> None:
    tensors = get_task("digits-mlp")
    lazy = Task(name="digits-lazy", build_model=tensors.build_model,
                train_set=TensorDataset(tensors.train_x, tensors.train_y),
                test_set=TensorDataset(tensors.test_x, tensors.test_y))
    assert lazy.lazy and lazy.n_train == tensors.n_train
    shard = partition(tensors.labels, NAMES[:4], seed=0)["p01"]
    config = TrainerConfig(batch_size=16)
    a = Trainer(tensors, config, shard, seed=0, member_index=1)
    b = Trainer(lazy, config, shard, seed=0, member_index=1)
    for _ in range(3):
        assert a.run_steps(7) == pytest.approx(b.run_steps(7), abs=1e-6)
    assert torch.allclose(a.flat_params, b.flat_params, atol=1e-6)
    assert a.evaluate() == pytest.approx(b.evaluate(), abs=1e-6)
    assert torch.allclose(a.gradient(), b.gradient(), atol=1e-6)


def test_a_lazy_task_is_sharded_by_name_without_reading_its_samples() -> None:
    network = NetworkSection(task="tests._lazy_task:lazy_task", task_options={"n_samples": 3000})
    task, trainers = build_trainers(network, TrainerConfig(), members=NAMES)
    expected = partition(np.zeros(3000), NAMES, seed=0)
    assert task.lazy
    for name, trainer in trainers.items():
        assert np.array_equal(trainer.shard.numpy(), expected[name])


def test_label_skew_on_a_lazy_task_needs_its_labels() -> None:
    unlabelled = NetworkSection(task="tests._lazy_task:lazy_task", task_options={"n_samples": 400},
                                partition=PartitionConfig(scheme="dirichlet"))
    with pytest.raises(TaskError, match=r"needs every training label: give the training Dataset a labels"):
        build_trainers(unlabelled, TrainerConfig(), members=NAMES[:4])
    labelled = NetworkSection(task="tests._lazy_task:lazy_task",
                              task_options={"n_samples": 400, "labelled": True},
                              partition=PartitionConfig(scheme="dirichlet"))
    task, trainers = build_trainers(labelled, TrainerConfig(), members=NAMES[:4])
    expected = partition(task.labels, NAMES[:4], scheme="dirichlet")
    assert all(np.array_equal(trainers[n].shard.numpy(), expected[n]) for n in NAMES[:4])


def test_a_custom_task_mixing_a_dataset_and_tensors_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "mixed.py"
    source.write_text("import torch\nfrom torch.utils.data import TensorDataset\n"
                      "def make():\n    x, y = torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)\n"
                      "    return {'model': lambda s: torch.nn.Linear(2, 2), 'train': TensorDataset(x, y),"
                      " 'test': (x, y)}\n")
    with pytest.raises(TaskError, match="must both be Datasets or both"):
        get_task(f"{source}:make")


@pytest.mark.processes
def test_a_member_s_peak_memory_does_not_grow_with_the_dataset() -> None:
    """Acceptance c: one member of 16 on 10 million generated samples peaks within 50 MiB of the
    same member on 10,000 (each in a fresh process: VmHWM)."""
    runs = {}
    for n in (10_000, 10_000_000):
        done = subprocess.run([sys.executable, "-m", "tests._lazy_task", str(n)], cwd=ROOT, check=True,
                              capture_output=True, text=True, timeout=600)
        runs[n] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs[10_000_000]["shard"] > 600 * runs[10_000]["shard"]  # the big shard is really big
    growth_mib = (runs[10_000_000]["peak_kib"] - runs[10_000]["peak_kib"]) / 1024
    assert growth_mib < 50, f"peak RSS grew by {growth_mib:.1f} MiB"


def test_an_edge_client_s_own_data_file_cannot_replace_a_lazy_task_s_datasets(tmp_path: Path) -> None:
    from peer.runtime.edge import edge_trainer
    from peer.runtime.edgeconfig import load_edge_config
    from peer.runtime.netinit import load_roster
    from protocols.errors import HivemeshError
    from tests._federation_support import init_federation

    files = init_federation(tmp_path / "fed", edges=2, rounds=1)
    config = load_edge_config(files.edge_configs["e000"])
    roster = load_roster(files.network.roster)
    lazy = dataclasses.replace(config.network, task="tests._lazy_task:lazy_task",
                               task_options={"n_samples": 100, "labelled": True})  # init: dirichlet
    with pytest.raises(HivemeshError, match=r"^\[edge\] data: task tests._lazy_task:lazy_task holds Data"):
        edge_trainer(dataclasses.replace(config, network=lazy, data="mydata:load"), roster)
    assert edge_trainer(dataclasses.replace(config, network=lazy), roster).task.lazy
