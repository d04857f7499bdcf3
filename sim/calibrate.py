"""``hivemesh sim calibrate``: time the real trainer once and write ``step_time_ms`` into a scenario.

This is the only place the simulator reads a clock for modelling, and it
runs before (never during) a simulation: the figure goes into the scenario
file, so every later run of that file is reproducible.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from pathlib import Path

import numpy as np

from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from sim.scenario import load_scenario

CHUNKS = 5  # time several chunks and take the median: robust to a busy neighbour process


def measure_step_ms(path: Path, *, task_name: str | None = None, batch_size: int = 0,
                    steps: int = 200) -> float:
    """Median milliseconds per local step of the scenario's task and trainer (or the options given)."""
    config = TrainerConfig()
    task_options: dict[str, object] = {}
    scenario_task = "digits-mlp"
    if path.exists():
        scenario = load_scenario(path)
        config = scenario.trainer_config()   # the trainer the simulation models, by the same rules
        scenario_task = scenario.task.name
        task_options = dict(scenario.task.options)
    if task_name and task_name != scenario_task:
        task_options = {}
    task = get_task(task_name or scenario_task, **task_options)
    if batch_size:
        config = dataclasses.replace(config, batch_size=batch_size)
    trainer = Trainer(task, config, np.arange(task.n_train), seed=0, member_index=0)
    trainer.run_steps(max(1, steps // 10))  # warm-up: allocator, first-call costs
    chunk = max(1, steps // CHUNKS)
    times_ms = []
    for _ in range(CHUNKS):
        started = time.perf_counter()
        trainer.run_steps(chunk)
        times_ms.append((time.perf_counter() - started) * 1000.0 / chunk)
    return float(statistics.median(times_ms))


_TABLE = re.compile(r"^\s*\[\[?([^\]]+)\]\]?\s*(#.*)?$")
_STEP = re.compile(r"^\s*step_time_ms\s*=")


def write_step_time(path: Path, step_ms: float, *, task_name: str | None = None) -> None:
    """Set ``[nodes] step_time_ms`` in the file, keeping everything else (comments included)."""
    value = f"step_time_ms = {step_ms:.3f}  # measured by hivemesh sim calibrate"
    if not path.exists():
        task = task_name or "digits-mlp"
        path.write_text(f'[graph]\nspec = "ring:8"\n\n[nodes]\n{value}\n\n[task]\nname = "{task}"\n')
        return
    lines = path.read_text().splitlines()
    section = ""
    nodes_at = None
    for index, line in enumerate(lines):
        table = _TABLE.match(line)
        if table:
            section = table.group(1).strip()
            if section == "nodes":
                nodes_at = index
            continue
        if section == "nodes" and _STEP.match(line):
            lines[index] = value
            break
    else:
        if nodes_at is None:
            lines += ["", "[nodes]", value]
        else:
            lines.insert(nodes_at + 1, value)
    path.write_text("\n".join(lines) + "\n")
    load_scenario(path)  # the file must still be a valid scenario
