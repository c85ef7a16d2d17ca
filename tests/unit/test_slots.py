"""Rank planning: contiguous local ranks per host, one rendezvous per job."""
from hvd_magics.task.slots import iface_for_address, plan_ranks, slot_env


def test_ranks_on_one_host_are_contiguous_even_when_tasks_interleave():
    slots = plan_ranks(["a", "b", "a", "b"])
    assert [s.hostname for s in slots] == ["a", "b", "a", "b"]
    by_rank = sorted(slots, key=lambda s: s.rank)
    assert [s.hostname for s in by_rank] == ["a", "a", "b", "b"]
    assert [(s.local_rank, s.cross_rank) for s in by_rank] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert {s.size for s in slots} == {4} and {s.local_size for s in slots} == {2}


def test_slot_env_has_what_gloo_reads():
    slot = plan_ranks(["h", "h"])[1]
    env = slot_env(slot, "127.0.0.1", 4321, "lo")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_LOCAL_RANK"] == "1"
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4321" and env["HOROVOD_CONTROLLER"] == "gloo"


def test_loopback_maps_to_lo_and_names_to_nothing():
    assert iface_for_address("127.0.0.1") == "lo"
    assert iface_for_address("not-an-ip") == ""


def test_a_local_master_tells_its_slots_and_others_do_not():
    import os

    from hvd_magics.launch.spark_slots import local_master_slots

    assert local_master_slots("local") == 1 and local_master_slots("local[2]") == 2
    assert local_master_slots("local[*]") == os.cpu_count()
    assert local_master_slots("local[4, 3]") == 4  # N cores, retries
    assert local_master_slots("local-cluster[2, 3, 1024]") == 6
    assert local_master_slots("local[4]", task_cpus=2) == 2
    assert local_master_slots("spark://host:7077") is None
    assert local_master_slots("yarn") is None


def test_the_driver_fallback_is_offered_only_to_jobs_without_dataframes():
    from hvd_magics.launch.spark_slots import not_enough_slots

    plain = str(not_enough_slots(5, 2, 2, "local[2]", "1"))
    assert plain.endswith("Fix: use np<=2, add executors or cores, or use np=-5 to run all ranks "
                          "on the driver.")
    with_data = str(not_enough_slots(5, 2, 2, "local[2]", "1", reads_data=True))
    assert with_data.endswith("Fix: use np<=2, add executors or cores.") and "np=-5" not in \
        with_data


def test_a_failed_rendezvous_request_is_a_log_line_not_a_traceback_in_the_cell(capsys):
    """Seen in the elastic notebook: socketserver printed a rank's reset connection's traceback
    into the cell."""
    from hvd_magics.task.slots import quiet_request_errors, start_rendezvous, stop_rendezvous

    server, _ = start_rendezvous(plan_ranks(["localhost", "localhost"]))
    try:
        lines: list[str] = []
        for log in (None, lines.append):
            quiet_request_errors(server, log)
            try:
                raise ConnectionResetError("reset by peer")
            except ConnectionResetError:
                server._httpd.handle_error(None, ("10.0.0.7", 4242))
        assert lines == ["rendezvous request from ('10.0.0.7', 4242) failed: "
                         "ConnectionResetError: reset by peer"]
        assert capsys.readouterr().err == ""
    finally:
        stop_rendezvous(server)


def test_no_smaller_np_is_offered_when_no_slot_is_free():
    from hvd_magics.launch.spark_slots import not_enough_slots

    text = str(not_enough_slots(1, 0, 2, "local[2]", "1", held=2))
    assert "Fix: add executors or cores, or use np=-1" in text and "np<=0" not in text
    assert "warm pools and background jobs hold 2 of the slots" in text
