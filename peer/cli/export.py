"""``hivemesh export``: a peer's trained model, or the average of several, as safetensors."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write a peer's model (or the average of several) as safetensors",
        description="Write the model of the peer(s) given by --config as a safetensors file: its whole "
                    "state dict, parameters and buffers (BatchNorm statistics), keyed by the model's "
                    "names (load it with safetensors.torch.load_file and "
                    "model.load_state_dict(..., strict=True)). The file's metadata is a model card: "
                    "task, its options, parameter count, the peers, their steps (a gateway's: its "
                    "rounds) and last test "
                    "accuracy. Several --config: floating tensors are averaged, integer buffers take "
                    "the maximum. Reads each peer's latest checkpoint, so it works on a running or "
                    "stopped peer.")
    parser.add_argument("--config", action="append", required=True, metavar="PEER.toml",
                        help="a peer's config file (repeat to average several peers)")
    parser.add_argument("--out", required=True, help="the safetensors file to write")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peer.runtime.export import export_model

    written = export_model(args.config, args.out)
    print(f"wrote {written.tensors} tensors ({written.parameters:,} parameters, "
          f"{written.buffer_values:,} buffer values, averaged over "
          f"{written.peers} peer{'s' if written.peers > 1 else ''}: {', '.join(written.progress)}) "
          f"to {args.out}")
    return 0
