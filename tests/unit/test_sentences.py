"""Messages composed of another's words end each sentence once (issue 82, item 7): a DeepSpeed
error ended ``... is not currently supported.. It was saved by 2 ranks``, and an elastic job's
error put ``. A rank that loses a peer ...`` after a rank's message ending in a full stop."""
from types import SimpleNamespace

from hvd_magics.errors import HorovodJobError, RankFailure, sentence
from hvd_magics.job.watch.outcome import ELASTIC_RUN_HINT, elastic_failure_of

#: Horovod's words when a peer is lost (they end with a full stop).
SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of the ranks. "
             "If the shutdown was caused by an exception, you should see the exception in the "
             "log before the first shutdown message.")


def test_a_sentence_ends_with_one_full_stop_whatever_it_ended_with():
    assert sentence("not currently supported") == "not currently supported."
    assert sentence("not currently supported.") == "not currently supported."
    assert sentence("not currently supported.  \n") == "not currently supported."
    assert sentence("is it?") == "is it?" and sentence("wait...") == "wait..."
    assert sentence("AssertionError") == "AssertionError." and sentence("") == ""


def test_a_summary_said_after_another_ending_in_a_full_stop_is_one_sentence_more():
    error = HorovodJobError("the job failed.")
    error.add_summary("the pool restarted its ranks")
    assert error.summary == "the job failed. The pool restarted its ranks"
    error = HorovodJobError("the job failed")
    error.add_summary("the pool restarted its ranks")
    assert error.summary == "the job failed. The pool restarted its ranks"


def test_an_elastic_job_s_hint_after_a_rank_s_message_ending_in_a_full_stop():
    failure = RankFailure(rank=1, host="h1", exit_code=1, error="HorovodInternalError",
                          message=SHUT_DOWN)
    rank = SimpleNamespace(has_result=False, exit_code=1, peer_lost=True, failed=True)
    job = SimpleNamespace(ranks=[rank], failures=lambda: [failure], log_path="/tmp/ranks.log")
    backend = SimpleNamespace(describe_failure=lambda: None)
    error = elastic_failure_of(job, backend)  # type: ignore[arg-type]
    assert error is not None
    assert error.summary.endswith(f"before the first shutdown message. {ELASTIC_RUN_HINT}"), \
        error.summary
    assert ".." not in error.summary
