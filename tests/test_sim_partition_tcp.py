"""A partition of TCP connections in the simulator (sim/network.py ``retransmit_rto_s``): nothing
sent across the cut is lost, and a connection carries again at its sender's next retransmission
after the heal, not at the heal (the multi-host suite's partition, issue 16)."""

from __future__ import annotations

import pytest

from sim.network import LinkSpec, Network, PartitionSpec

LINK = LinkSpec(latency_ms=1.0, bandwidth_mbps=1000.0)


def network(rto_s: float) -> Network:
    split = PartitionSpec(start_s=10.0, end_s=14.0, groups=(("a",), ("b",)), retransmit_rto_s=rto_s)
    return Network({}, default=LINK, seed=0, partitions=(split,))


def test_the_link_carries_again_at_the_first_retransmission_after_the_heal() -> None:
    split = PartitionSpec(start_s=10.0, end_s=14.0, groups=(("a",), ("b",)), retransmit_rto_s=0.2)
    # retransmissions 0.2, 0.6, 1.4, 3.0, 6.2 s after the first message into the cut
    assert split.resume_s(10.0) == pytest.approx(16.2)
    assert split.resume_s(10.5) == pytest.approx(16.7)
    shorter = PartitionSpec(start_s=10.0, end_s=12.0, groups=(("a",), ("b",)), retransmit_rto_s=0.2)
    assert shorter.resume_s(10.0) == pytest.approx(13.0)
    assert PartitionSpec(start_s=10.0, end_s=12.0, groups=(("a",), ("b",))).resume_s(10.0) == 12.0


def test_a_connection_dialled_afresh_carries_once_healed_if_that_is_sooner() -> None:
    def resume(end_s: float) -> float:
        return PartitionSpec(start_s=10.0, end_s=end_s, groups=(("a",), ("b",)), retransmit_rto_s=0.2,
                             reconnect_after_s=5.0).resume_s(10.0)

    assert resume(14.0) == pytest.approx(15.0)     # dialled afresh at 15.0, before the retransmission at 16.2
    assert resume(15.5) == pytest.approx(15.5)     # given up at 15.0, the new connection carries at the heal
    assert resume(12.0) == pytest.approx(13.0)     # the retransmission at 13.0 comes first


def test_what_is_sent_into_the_cut_is_held_not_lost() -> None:
    net = network(0.2)
    assert net.transmit("a", "b", 1000, 9.0).arrival_s == pytest.approx(9.0 + 0.001 + 8e-6)
    into_cut = net.transmit("a", "b", 1000, 10.0).arrival_s
    after_heal = net.transmit("a", "b", 1000, 15.0).arrival_s       # healed, not yet retransmitted
    later = net.transmit("a", "b", 1000, 17.0).arrival_s
    assert into_cut is not None and after_heal is not None and later is not None
    assert 16.2 < into_cut < after_heal < 16.3                      # both at the retransmission, in order
    assert later == pytest.approx(17.001008)
    # b sent nothing into the cut: its connection was never held
    assert net.transmit("b", "a", 1000, 14.5).arrival_s == pytest.approx(14.501008)
    assert net.held == 2 and not net.dropped


def test_without_a_timeout_the_cut_drops_and_the_heal_is_at_once() -> None:
    net = network(0.0)
    assert net.transmit("a", "b", 1000, 10.0).dropped == "partitioned"
    assert net.transmit("a", "b", 1000, 14.0).arrival_s == pytest.approx(14.001008)
    assert net.dropped == {"partitioned": 1} and net.held == 0


def test_a_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="retransmit_rto_s"):
        PartitionSpec(start_s=0.0, end_s=1.0, groups=(("a",),), retransmit_rto_s=-0.1)
    with pytest.raises(ValueError, match="reconnect_after_s"):
        PartitionSpec(start_s=0.0, end_s=1.0, groups=(("a",),), reconnect_after_s=0.0)


def test_the_retransmission_timeout_stops_doubling_at_linux_tcp_rto_max() -> None:
    split = PartitionSpec(start_s=0.0, end_s=1000.0, groups=(("a",), ("b",)), retransmit_rto_s=0.2)
    # 0.2 doubling to 102.4 s (at 204.6 s), then 120 s each: 324.6, 444.6 ... 924.6, 1044.6
    assert split.resume_s(0.0) == pytest.approx(1044.6)


def test_what_a_connection_dialled_afresh_held_is_lost_with_it() -> None:
    split = PartitionSpec(start_s=10.0, end_s=14.0, groups=(("a",), ("b",)), retransmit_rto_s=0.2,
                          reconnect_after_s=5.0)
    net = Network({}, default=LINK, seed=0, partitions=(split,))
    assert net.transmit("a", "b", 1000, 10.0).dropped == "connection_reset"   # given up at 15.0
    assert net.transmit("a", "b", 1000, 14.5).dropped == "connection_reset"   # healed, not yet dialled
    assert net.transmit("a", "b", 1000, 15.0).arrival_s == pytest.approx(15.001008)  # the new connection
    assert net.dropped == {"connection_reset": 2} and net.held == 0


def test_each_connection_redials_somewhere_in_the_spread() -> None:
    split = PartitionSpec(start_s=10.0, end_s=14.0, groups=(("a",), ("b",)), retransmit_rto_s=0.2,
                          reconnect_after_s=5.0, reconnect_spread_s=1.0)
    assert split.resume_s(10.0, 0.0) == pytest.approx(15.0)
    assert split.resume_s(10.0, 0.5) == pytest.approx(15.5)
    assert split.resume_s(10.0, 0.99) == pytest.approx(15.99)
    net = Network({}, default=LINK, seed=0, partitions=(split,))
    assert net.transmit("a", "b", 1000, 10.0).dropped == "connection_reset"
    assert net.transmit("b", "a", 1000, 10.0).dropped == "connection_reset"
    arrivals = [net.transmit(src, dst, 1000, 16.0).arrival_s for src, dst in (("a", "b"), ("b", "a"))]
    assert arrivals == [pytest.approx(16.001008)] * 2    # both redialled by 16.0 (15.0-16.0)
    with pytest.raises(ValueError, match="reconnect_spread_s"):
        PartitionSpec(start_s=0.0, end_s=1.0, groups=(("a",),), reconnect_spread_s=-1.0)
