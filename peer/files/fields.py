"""Every field of a peer's status snapshot: its unit, whether it counts or measures, its meaning.

One table, read by three readers so that none of them can drift from what the daemon
writes: docs/monitoring.md's ``metrics.jsonl`` table (a test compares the two), the Prometheus
collector (``peer.runtime.prometheus``: metric type, help text and unit from here) and
``hivemesh status`` (its words for the gossip machine's gauges).

``kind`` says what a number is: ``counter`` only grows during one start of the peer
(it restarts from 0 when the peer does), ``gauge`` goes up and down, ``text`` is not a
number, ``nested`` holds a table described by its own rows (``neighbours.<name>.step``).
A ``label`` names what the keys of a mapping-valued field are (one number per key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "text", "nested"]


@dataclass(frozen=True)
class Field:
    key: str
    unit: str        # "" for a dimensionless number or a text
    kind: Kind
    meaning: str
    label: str = ""  # a mapping of label -> number (one number per neighbour, reason, ...)
    prometheus: str = ""  # the metric's name when not the key's ("-": not served, see its meaning)


SNAPSHOT_FIELDS: tuple[Field, ...] = (
    Field("name", "", "text", "this peer's member name in the roster"),
    Field("state", "", "text", "what the peer is doing: starting, waiting for neighbours, syncing, training, "
                               "finished, stopped (Ctrl-C / SIGTERM) or stranded (no live neighbour left)"),
    Field("epoch", "", "gauge", "how many times this data folder was started before (0 on the first start); "
                                "a restart is a new epoch"),
    Field("uptime_s", "s", "gauge", "seconds since this start of the peer"),
    Field("step", "steps", "gauge", "local training steps taken (the learning-rate schedule's step)"),
    Field("steps_done", "steps", "gauge", "training steps the gossip schedule has counted"),
    Field("lr", "", "gauge", "learning rate of the last local step, from the schedule (`warmup_steps`, "
                             "`lr_decay`, `total_steps`; null before this start's first step)"),
    Field("loss", "", "gauge", "training loss of the last local step (mean over its batch)"),
    Field("train_s", "s", "gauge", "seconds spent training (from the first round to finishing, or to now)"),
    Field("work_s", "s", "counter", "of `train_s`, seconds in the trainer's steps (the rest: sealing, "
          "sending, waiting, receiving, mixing)"),
    Field("accuracy", "fraction", "gauge", "test-set accuracy (0 to 1) at `eval_step`"),
    Field("test_loss", "", "gauge", "mean test-set loss at `eval_step`"),
    Field("eval_step", "steps", "gauge", "step of the last test-set evaluation (-1: none yet; a gateway's, "
          "which trains nothing: its FedAvg rounds closed then, `federation.round`)"),
    Field("consensus_max_relative", "", "gauge",
          "estimated distance to consensus: max ‖x_i − mean‖ / ‖mean‖ over this peer and its neighbours' "
          "last parameters heard (null before any arrived)"),
    Field("neighbours", "", "nested", "per neighbour, the rows `neighbours.*` below (status.json only)"),
    Field("neighbours.*.up", "", "gauge", "1 while heard within the neighbour timeout, else 0"),
    Field("neighbours.*.presence", "", "text",
          "up, down, never heard or finished (protocols/node/liveness.py)"),
    Field("neighbours.*.finished", "", "gauge", "1 once its heartbeat said it has finished its run"),
    Field("neighbours.*.last_seen_s", "s", "gauge",
          "seconds from its last accepted message to this snapshot"),
    Field("neighbours.*.latency_ms", "ms", "gauge", "one-way latency of its last heartbeat"),
    Field("neighbours.*.step", "steps", "gauge", "its step, from its last heartbeat (-1: none yet)"),
    Field("neighbours.*.dial_down_s", "s", "gauge",
          "how long our socket dialing it has had no connection (0 while it has one)"),
    Field("neighbours.*.dial_reason", "", "text",
          "why our socket dialing it has no connection, in words: dialing, refused, no route, no answer, no "
          "answer to the handshake, handshake refused, connection lost (peer/net/reach.py); empty while "
          "connected"),
    Field("bytes_sent", "bytes", "counter", "bytes of every message sent (gossip, heartbeats, state sync); "
          "the sum of `bytes_sent_to` (Prometheus: `sum(hivemesh_bytes_sent_total)`)", prometheus="-"),
    Field("bytes_received", "bytes", "counter", "bytes of every message received, accepted or not"),
    Field("bytes_sent_to", "bytes", "counter", "bytes sent, by neighbour", label="neighbour",
          prometheus="bytes_sent"),
    Field("bytes_received_from", "bytes", "counter", "bytes of accepted messages, by neighbour",
          label="neighbour", prometheus="accepted_bytes_received"),
    Field("payload_bytes_sent", "bytes", "counter", "tensor bytes in gossip messages sent, times recipients"),
    Field("gossip_wire_bytes_sent", "bytes", "counter",
          "sealed messages sent (heartbeats too), times recipients (payload plus header and signature)"),
    Field("messages_sent", "messages", "counter",
          "messages handed to the transport (heartbeats too), times recipients"),
    Field("messages_sent_by_kind", "messages", "counter",
          "messages handed to the transport, times recipients, by kind (heartbeat, param_push, ...)",
          label="kind"),
    Field("bytes_sent_by_kind", "bytes", "counter",
          "sealed messages handed to the transport, times recipients, by kind", label="kind"),
    Field("messages_accepted", "messages", "counter", "messages received that passed every check"),
    Field("bytes_accepted_by_kind", "bytes", "counter",
          "sealed messages received that passed every check, by kind", label="kind"),
    Field("rejections", "messages", "counter", "messages refused or dropped, by reason", label="reason"),
    Field("internal_errors", "messages", "counter",
          "accepted messages dropped because handling them raised (`internal_error` in `rejections`: a "
          "bug met by this sender's input; the peer lives on), by sender", label="sender"),
    Field("frames_dropped", "frames", "counter",
          "wire frames dropped unread, by reason: unannounced (no header announced it), size_mismatch, "
          "after_rejection (announced by a refused message), multipart (a hostile multipart arrival)",
          label="reason"),
    Field("sync_answers_sent", "messages", "counter", "state-sync answers sent to joining neighbours"),
    Field("state_sync", "syncs", "counter", "what became of this peer's own state syncs, by outcome "
          "(adopted, kept, refused, no_answer)", label="outcome"),
    Field("early_held", "messages", "counter",
          "neighbours' messages held before training started (fed to the machine once it starts)"),
    Field("trainer_steps_set", "steps", "text", "the trainer's step after each catch-up or adopted sync, "
          "in order (a list; status.json only)", prometheus="-"),
    Field("unreachable", "messages", "counter",
          "gossip messages not sent (no route or queue full), by recipient",
          label="neighbour"),
    Field("neighbour_down", "events", "counter", "times each neighbour fell silent past the timeout",
          label="neighbour"),
    Field("neighbour_finished", "events", "counter",
          "times each neighbour fell silent after saying it finished",
          label="neighbour"),
    Field("test_cut_dropped", "messages", "counter", "messages a test hook's cut dropped, sent or received",
          label="direction"),
    Field("stranded", "", "text", "why the peer stopped short of the end (empty: it did not)"),
    Field("checkpoint_step", "steps", "gauge",
          "step of the newest checkpoint this start wrote or resumed from (-1: none yet; a gateway's "
          "checkpoints count its gossip rounds, a FedBuff gateway's those plus its model versions; its "
          "lines say the FedAvg round a checkpoint holds)"),
    Field("checkpoints_written", "checkpoints", "counter", "checkpoints written (periodic, after a jump of "
          "the step by a state sync or a catch-up, and at the end)"),
    Field("checkpoint_failures", "checkpoints", "counter",
          "checkpoints not written, by errno (`ENOSPC`: a full disk); the peer trains on and keeps the "
          "older ones", label="reason"),
    Field("checkpoint_error", "", "text",
          "why the last checkpoint could not be written (empty once one is written again)"),
    Field("checkpoint_nonfinite", "values", "counter",
          "non-finite numbers in checkpoint metadata (an overflow), written as null and read back as "
          "they were, by their path in the manifest", label="path"),
    Field("status_write_failures", "writes", "counter",
          "status.json, metrics.jsonl or TensorBoard writes that failed, by errno", label="reason"),
    Field("status_values_replaced", "values", "counter",
          "status.json or metrics.jsonl values strict JSON cannot hold: an infinity written as null "
          "(`infinite`), anything else as text (`not_json_<type>`); NaN is null, unknown", label="reason"),
    Field("roster_version", "", "gauge", "the latest roster version this peer has read (applied from its "
          "effective round on)"),
    Field("roster_reloads", "reloads", "counter",
          "times the roster file was re-read on SIGHUP (`hivemesh roster reload`)"),
    Field("waiting_for", "", "text",
          "while waiting for neighbours at start: whom (`waiting for p01 (1/2 up)`); an edge client's, "
          "between its rounds: `no connection to gw0 at tcp://10.0.0.5:7001 for 30 s (refused)` (or "
          "`no route`, `no answer`, a refused handshake), `connected to gw0; waiting for its answer`, "
          "`registered; not sampled since round 12 (fraction 0.2)`"),
    Field("absent_at_start", "events", "counter",
          "neighbours not up when training started", label="neighbour"),
    Field("abandoned_sends", "messages", "counter",
          "sends still pending after the send timeout, by neighbour",
          label="neighbour"),
    Field("curve", "", "gauge", "1 while CurveZMQ is on (`[peer] curve`, the default): only the roster's "
                                "transport keys get a connection; 0: anyone who reaches the port reaches the "
                                "message decoder (`hivemesh status` warns)"),
    Field("memory_peak_mib", "MiB", "gauge", "the peer process's peak resident memory (`ru_maxrss`): "
                                             "bounded whatever other peers send (issue 14)"),
    Field("memory_rss_mib", "MiB", "gauge", "the peer process's resident memory now "
                                            "(`/proc/self/statm`): flat after warm-up on a healthy peer; "
                                            "the peak above hides growth behind torch's import"),
    Field("transport_refused", "connections", "counter",
          "connections to the inbox refused before any message, by reason: `not_on_roster`, `cooling_down` "
          "(ZAP), `handshake_<error>`, `handshake_no_detail`, `closed_before_handshake` (bytes that are not "
          "ZeroMQ's); see peer/net/admission.py", label="reason"),
    Field("transport_connections", "connections", "counter",
          "the inbox's connections: `accepted`, `handshake_succeeded`, `closed_after_handshake` (closed, "
          "timed out, or a frame over the size limit: one event for all three), `shed_mid_handshake` (over "
          "`[transport] max_handshaking_connections`), and those this peer shut down, `closed_<reason>` "
          "(`removed_from_roster`, `not_admitted`, `multipart`, `surplus_connection`: a member's oldest "
          "beyond `[transport] max_connections_per_member`)", label="event"),
    Field("redialed", "sockets", "counter",
          "sockets to a neighbour replaced: after a refused handshake's backoff (`handshake_refused`), or "
          "after no connection for `[transport] reconnect_max_ms` (libzmq never retries a refused CurveZMQ "
          "handshake, as when a neighbour had not admitted our key yet)", label="neighbour"),
    Field("handshake_refused", "handshakes", "counter",
          "our CurveZMQ handshakes to neighbours that they refused, by reason: `auth` (its admission did not "
          "take our key: it has not applied the roster version adding us yet, or we were revoked), "
          "`protocol`, `no_detail`; each is redialed after `[transport] reconnect_ms` doubling to "
          "`reconnect_max_ms` (peer/net/handshakes.py)", label="reason"),
    Field("receive_buffers", "", "nested", "the receive buffer pool, the rows `receive_buffers.*` below"),
    Field("receive_buffers.reused", "buffers", "counter", "receive buffers taken from the pool"),
    Field("receive_buffers.fresh", "buffers", "counter", "receive buffers allocated"),
    Field("receive_buffers.held", "buffers", "gauge", "receive buffers in the pool now"),
    Field("metrics", "", "nested", "the gossip machine's own numbers, the rows `metrics.*` below"),
    Field("metrics.round", "rounds", "gauge", "gossip round the machine is in (a gateway's: its gossip "
          "rounds, `gossip_rounds` per FedAvg round; its FedAvg round is `federation.round`)",
          prometheus="gossip_round"),
    Field("metrics.consensus_step", "", "gauge", "CHOCO's consensus step size, as lowered by its guard"),
    Field("metrics.*", "events", "counter",
          "any other key: a count of the machine's events by name (e.g. `stale_message`, `missed_deadline`)"),
    Field("federation", "", "nested", "a gateway's FedAvg rounds and edge clients, the rows `federation.*` "
          "below (empty on a plain peer)"),
    Field("federation.mode", "", "text", "sync (FedAvg rounds) or fedbuff (asynchronous, buffered)"),
    Field("federation.phase", "", "text", "the server's phase: idle, waiting (too few clients registered), "
          "open (a round collects updates), paused (gossip between rounds), finished"),
    Field("federation.round", "rounds", "gauge", "the FedAvg rounds closed (FedBuff: model versions), "
          "restarts included: the 0-based index of the round open now, or of the next one; `rounds` at "
          "the end (`hivemesh status` shows `round 6/10`)"),
    Field("federation.rounds", "rounds", "gauge", "the FedAvg rounds the federation runs "
          "(`[federation] rounds`)"),
    Field("federation.rounds_closed", "rounds", "counter",
          "the same number as `round` (each closed round's report is a line of `rounds.jsonl` in the data "
          "folder, written once the gossip after it is over)"),
    Field("federation.registered", "", "text", "the edge clients registered now (heard within the timeout)"),
    Field("federation.asked", "", "text", "the clients sampled for the open round (over-selection included)"),
    Field("federation.wanted", "clients", "gauge", "updates the open round takes before it closes"),
    Field("federation.taken", "", "text", "the clients whose updates the open round has taken (answered)"),
    Field("federation.last_rounds", "", "text", "the last three closed rounds' reports: asked, taken, "
          "missing, late, refused, closed_by, aggregated, bounds (the influence bounds applied: "
          "samples_cap, norm_bound, bounded by reason) (a list; status.json only)"),
    Field("federation.counters", "events", "counter", "the server's counts: updates_taken, refused_update, "
          "refused_<reason> (not_sampled, wrong_round, late, duplicate, ...), "
          "closed_by_<quota|deadline|answered|left|secagg> "
          "(answered: every asked client that did not leave sent its update), secagg_left (asked "
          "clients that said they leave: no SecAgg phase waits for them), "
          "rounds_aggregated, rounds_failed, bounded_<reason> (updates capped or clipped: samples_median, "
          "samples_max, norm_median, norm_fixed), final_answers (the final model sent again to a client "
          "heard after the end), final_answer_limited (at most one per client per round_timeout_s), "
          "client_metrics_dropped (an update's fit metrics not finite numbers, or past 16: dropped, the "
          "update kept)",
          label="event"),
    Field("federation.privacy", "", "nested", "with `[federation.differential_privacy]`: the rows "
          "`federation.privacy.*` below (absent when off)"),
    Field("federation.privacy.epsilon", "", "gauge", "the privacy spent so far at `delta`, amplified by "
          "sampling (central: dp-accounting's RDP bound over the rounds closed; distributed: an "
          "approximation, not a proven bound: Kairouz et al.'s per-round bound sampled by Zhu and Wang's, "
          "ignoring that an unsampled client adds no noise share; `inf` without noise)"),
    Field("federation.privacy.delta", "", "gauge", "the delta epsilon is stated at"),
    Field("federation.privacy.noise_multiplier", "", "gauge", "z: the noise's standard deviation over the "
          "clip norm"),
    Field("federation.privacy.sampling_rate", "", "gauge", "q: each registered client's chance to be asked "
          "in a round (Poisson sampling)"),
    Field("federation.privacy.clip_norm", "", "gauge", "C: the clip norm of a client's update now "
          "(adaptive clipping moves it)"),
    Field("federation.privacy.rounds_accounted", "rounds", "counter", "rounds the accountant has composed"),
    Field("federation.privacy.mechanism", "", "text", "central (the gateway adds the noise) or distributed "
          "(with `[federation.secure_aggregation]`: each client adds a discrete Gaussian share)"),
    Field("federation.privacy.epsilon_vs_gateway_per_round", "", "gauge", "distributed only: epsilon against "
          "the gateway for each round a client takes part in, a proven bound (not amplified by sampling: "
          "the gateway sees who takes part)"),
    Field("federation.clients", "", "nested", "per edge client, the rows `federation.clients.*` below "
          "(status.json only)"),
    Field("federation.clients.*.up", "", "gauge", "1 while registered (heard within the timeout) on a "
          "known connection", prometheus="-"),
    Field("federation.clients.*.presence", "", "text", "up (registered), down, never heard, left (it "
          "said so as it stopped), or finished (sent the final model: it exits then)"),
    Field("federation.clients.*.last_contact_s", "s", "gauge",
          "seconds since its last update (null: none yet)", prometheus="-"),
    Field("federation.clients.*.bytes_sent", "bytes", "counter",
          "bytes the gateway sent it (round starts, results)", prometheus="-"),
    Field("federation.clients.*.bytes_received", "bytes", "counter",
          "bytes of its accepted messages (updates, heartbeats)", prometheus="-"),
    Field("federation.clients.*.unreachable", "messages", "counter",
          "messages not sent to it: no connection learnt yet, or it closed", prometheus="-"),
    Field("warnings", "", "text", "the machine's and the trainer's warnings (a list of lines; e.g. a "
          "learning rate at 0 before the end)"),
    Field("timeline", "s", "gauge",
          "Unix time of each phase's start: created, assembled, neighbours, synced, "
                                    "finished", label="mark"),
    Field("time", "s", "gauge", "Unix time the line was written (metrics.jsonl only)"),
    Field("pid", "", "text", "the peer's process id (status.json only)"),
    Field("updated_at", "s", "gauge", "Unix time the file was written (status.json only)"),
)

FIELDS_BY_KEY = {field.key: field for field in SNAPSHOT_FIELDS}

# what a person reads for a gauge of the machine; its counters read as their own name in words
MACHINE_GAUGE_WORDS = {"round": "gossip round", "consensus_step": "consensus step size"}


def field_for(path: str) -> Field | None:
    """The row describing ``path`` (``bytes_sent``, ``neighbours.p01.step``, ``metrics.stale_message``)."""
    if path in FIELDS_BY_KEY:
        return FIELDS_BY_KEY[path]
    head, _, rest = path.partition(".")
    if head == "neighbours" and rest:
        return FIELDS_BY_KEY.get(f"neighbours.*.{rest.rpartition('.')[2]}")
    if head == "metrics" and rest:
        return FIELDS_BY_KEY["metrics.*"]
    if head == "federation" and rest:
        sub, _, tail = rest.partition(".")
        if sub == "clients" and tail:
            return FIELDS_BY_KEY.get(f"federation.clients.*.{tail.rpartition('.')[2]}")
        found = FIELDS_BY_KEY.get(f"federation.{sub}")
        return found if found is not None and tail and found.label else None
    labelled = FIELDS_BY_KEY.get(head)
    return labelled if labelled is not None and labelled.label and rest else None


def machine_words(name: str) -> str:
    """A gossip machine metric in words: ``round`` -> "gossip round", ``stale_message`` -> "stale message"."""
    return MACHINE_GAUGE_WORDS.get(name, name.replace("_", " "))


def markdown_table() -> str:
    """docs/monitoring.md's table of these fields (``python -m peer.files.fields`` prints it)."""
    rows = ["| field | unit | kind | meaning |", "|---|---|---|---|"]
    for field in SNAPSHOT_FIELDS:
        by = f" (`{{{field.label}: number}}`)" if field.label else ""
        rows.append(f"| `{field.key}` | {field.unit or '-'} | {field.kind} | {field.meaning}{by} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
