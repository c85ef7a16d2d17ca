"""What cannot travel is named before anything starts."""
import threading

import cloudpickle
import pytest

from hvd_magics.errors import PayloadError
from hvd_magics.launch.payload import serialize_job, why_not_shippable


def test_a_lock_argument_is_named():
    with pytest.raises(PayloadError, match=r"argument 'guard'.*lock.*create it inside"):
        serialize_job(lambda guard: None, {"guard": threading.Lock()})


def test_an_open_file_used_by_main_is_named(tmp_path):
    handle = open(tmp_path / "f.txt", "w")

    def main():
        return handle.write("x")

    with pytest.raises(PayloadError, match=r"variable 'handle' used by main\(\).*open file"):
        serialize_job(main, {})
    handle.close()


def test_a_generator_is_refused_and_plain_data_is_not():
    assert "generator" in why_not_shippable(x for x in range(3))
    assert why_not_shippable({"a": [1, 2]}) is None


def test_round_trip_and_large_payload_warning():
    big = b"x" * (11 * 1024 * 1024)
    with pytest.warns(UserWarning, match=r"ships 11\.\d MB"):
        payload = serialize_job(len, {"obj": big})
    assert len(payload.sources) == 0  # no DataFrame: the stage runs over spark.range
    fn, kwargs = cloudpickle.loads(payload.blob)
    assert fn(kwargs["obj"]) == len(big)


def test_main_must_be_callable():
    with pytest.raises(PayloadError, match="must be a function"):
        serialize_job(42, {})


def test_a_rank_reads_its_late_environment_then_its_job():
    import io

    from hvd_magics.protocol import decode_job, encode_job

    stream = io.BytesIO(encode_job(b"\x80job bytes", {"HOROVOD_GLOO_RENDEZVOUS_PORT": "4242"}))
    assert decode_job(stream) == ({"HOROVOD_GLOO_RENDEZVOUS_PORT": "4242"}, b"\x80job bytes")


def test_a_function_pickled_by_value_keeps_its_file_and_source():
    """cloudpickle 3.1.3 names it <dynamic-code>: the rank's stacks, tracebacks and AutoGraph
    then cannot find the user's source."""
    import inspect
    import pickle

    from hvd_magics.launch.payload import dumps
    from tests import jobs

    restored = pickle.loads(dumps(jobs.fail_on_rank))
    assert restored.__code__.co_filename == jobs.fail_on_rank.__code__.co_filename
    assert inspect.getsource(restored) == inspect.getsource(jobs.fail_on_rank)
