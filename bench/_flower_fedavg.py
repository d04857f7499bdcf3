"""FedAvg on sklearn digits in Flower's simulation (run from Flower's own venv by bench/bench_federation.py).

argv: clients rounds local_epochs batch_size lr seed. Prints one JSON line: the seconds from the
``run_simulation`` call to each round's end (measured in the server-side evaluation, which Flower
calls after each round's aggregation), the accuracy per round, and the total.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

warnings.filterwarnings("ignore")


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # the project's digits-mlp split: stratified 80/20, random_state=0, standardised on the train split
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    tx, vx, ty, vy = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    mean, std = tx.mean(axis=0), tx.std(axis=0)
    std[std < 1e-6] = 1.0
    return ((tx - mean) / std).astype(np.float32), ty, ((vx - mean) / std).astype(np.float32), vy


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def get(m: nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in m.state_dict().values()]


def put(m: nn.Module, arrays: list[np.ndarray]) -> None:
    state = {k: torch.from_numpy(np.asarray(a)) for k, a in zip(m.state_dict(), arrays, strict=True)}
    m.load_state_dict(state)


def main() -> None:
    clients, rounds, epochs, batch, lr, seed = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                                int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    tx, ty, vx, vy = digits()
    shards = np.array_split(np.random.default_rng(seed).permutation(len(tx)), clients)
    torch.set_num_threads(1)

    class Client(NumPyClient):
        def __init__(self, index: int) -> None:
            self.x = torch.from_numpy(tx[shards[index]])
            self.y = torch.from_numpy(ty[shards[index]])
            self.model = model(seed)

        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            put(self.model, parameters)
            opt = torch.optim.SGD(self.model.parameters(), lr=lr)
            g = torch.Generator().manual_seed(seed)
            for _ in range(epochs):
                order = torch.randperm(len(self.x), generator=g)
                for start in range(0, len(order), batch):
                    idx = order[start:start + batch]
                    opt.zero_grad()
                    nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx]).backward()
                    opt.step()
            return get(self.model), len(self.x), {}

    def client_fn(context: Context):  # type: ignore[no-untyped-def]
        return Client(int(context.node_config["partition-id"])).to_client()

    test_x, test_y = torch.from_numpy(vx), torch.from_numpy(vy)
    evaluator = model(seed)
    ends_s: list[float] = []
    accuracy: list[float] = []
    started = [0.0]

    def evaluate(server_round, parameters, config):  # type: ignore[no-untyped-def]
        put(evaluator, parameters)
        with torch.no_grad():
            acc = float((evaluator(test_x).argmax(1) == test_y).float().mean())
        ends_s.append(time.perf_counter() - started[0])
        accuracy.append(acc)
        return 0.0, {"accuracy": acc}

    def server_fn(context: Context) -> ServerAppComponents:
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=clients,
                          min_available_clients=clients, evaluate_fn=evaluate,
                          initial_parameters=ndarrays_to_parameters(get(model(seed))))
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    started[0] = time.perf_counter()
    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=clients, backend_config={"client_resources": {"num_cpus": 1}},
                   verbose_logging=False)
    total_s = time.perf_counter() - started[0]
    print(json.dumps({"version": __import__("flwr").__version__, "total_s": total_s,
                      "round_end_s": ends_s[1:], "accuracy": accuracy[1:]}))


if __name__ == "__main__":
    main()
