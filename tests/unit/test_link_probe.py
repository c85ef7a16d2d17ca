"""The hosts' links as the driver measures them (no hosts: a stand-in channel answers the probe
orders after a delay per host, the one thing faked), and the verdict drawn from them."""
import threading
import time

from hvd_magics.job import link_probe
from hvd_magics.job.link_probe import LinkProbe, LinkSpeed, verdict
from hvd_magics.protocol import PROBE_LINK


def test_the_host_whose_link_moved_least_is_named_with_both_ways():
    text = verdict([LinkSpeed("10.0.0.2", 900.0, 950.0), LinkSpeed("10.0.0.3", 12.0, 300.0),
                    LinkSpeed("10.0.0.4", 1000.0, 800.0)], 0.94)
    assert text == ("every rank waits in communication for most of its step (at least 94% of "
                    "its latest steps); the link of host 10.0.0.3 is the slowest: 12 Mbit/s to "
                    "it and 300 Mbit/s from it, against 850 Mbit/s for the other hosts "
                    "(measured from the driver while the job ran)")


def test_links_that_moved_alike_or_did_not_answer_name_no_host():
    alike = verdict([LinkSpeed("a", 400.0, 500.0), LinkSpeed("b", 300.0, 520.0)], 0.6)
    assert alike.endswith("the hosts' links measured alike from the driver (300 to 400 Mbit/s): "
                          "no one host's link holds the others back")
    silent = verdict([LinkSpeed("a", None, None), LinkSpeed("b", 300.0, 520.0)], 0.6)
    assert silent.endswith("the hosts' links could not be measured")


def test_the_probe_times_each_host_one_way_then_the_other_through_the_orders(monkeypatch):
    monkeypatch.setattr(link_probe, "PROBE_BYTES", 3 * 100_000)
    delays = {0: 0.01, 2: 1.0}  # rank 2's host answers a hundred times slower
    sent = []

    def send(rank, order):
        assert order["kind"] == PROBE_LINK
        sent.append((rank, len(order["data"]), order["answer_bytes"]))

        def answer():
            time.sleep(delays[rank])
            probe.answer({"request": order["request"], "recv": time.monotonic()})

        threading.Thread(target=answer).start()
        return True

    probe = LinkProbe({"h1": 0, "h2": 2}, send)
    probe.start()
    assert probe.done.wait(10)
    assert sent == [(0, 400_000, 0), (0, 0, 300_000), (2, 400_000, 0), (2, 0, 300_000)]
    fast, slow = probe.speeds
    assert fast.host == "h1" and slow.host == "h2"
    # a hundred times slower at most; under a loaded machine's thread scheduling the fast
    # host's 10 ms answers come late (a CI run: 275 ms late, when the slow host answered in
    # 200 ms), so the figure is only known to exceed the verdict's two times
    assert 2 < fast.slower / slow.slower < 120
    assert "the link of host h2 is the slowest" in verdict(probe.speeds, 0.9)
