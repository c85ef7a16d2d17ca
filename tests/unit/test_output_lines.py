"""What the cell shows of the ranks' output: bars, warnings and repeats, from lines the libraries
really printed (Lightning 2.6 with rich, transformers 5 with tqdm, PyTorch's DDP, accelerate)."""
import io
import sys
from pathlib import Path

from hvd_magics.job.job_state import JobState
from hvd_magics.job.readings.output_lines import (BAR, NOISE, REPEAT, SHOW, WARNING, WARNING_CHARS,
                                         OutputSorter)
from hvd_magics.job.views.text_view import TextView
from hvd_magics.options import VERBOSITY_DEBUG

SITE = "/work/main/.venv/lib/python3.11/site-packages"
#: Lightning's rich bar redrawn, as the rank's pipe carries it.
RICH_BAR = ["\x1b[2KEpoch 0/1  \x1b[35m━━━━\x1b[0m\x1b[35m╸\x1b[0m\x1b[90m━━━━━━━━━━━━━\x1b[0m 1/4 "
            "\x1b[2m0:00:00 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m \x1b[3mv_num: 0.000 \x1b[0m",
            "\x1b[2K\x1b[1A\x1b[2KEpoch 0/1  \x1b[35m━━━━━━━━━━━━━━━━━\x1b[0m 4/4 \x1b[2m0:00:00 • "
            "0:00:00\x1b[0m \x1b[2;4m122.86it/s\x1b[0m \x1b[3mv_num: 0.000      \x1b[0m",
            "\x1b[?25h"]
DDP_WARNING = ("[rank{r}]:[W1126 07:05:11.166458255 reducer.cpp:1529] Warning: "
               "find_unused_parameters=True was specified in DDP constructor, but did not find any "
               "unused parameters in the forward pass. This flag results in an extra traversal of "
               "the autograd graph every iteration, which can adversely affect performance. "
               "(function operator())")
ACCELERATE_WARNING = [f"{SITE}/accelerate/state.py:279: UserWarning: OMP_NUM_THREADS/"
                      "MKL_NUM_THREADS unset, we set it at 1 to improve oob performance.",
                      "  warnings.warn("]
LIGHTNING_WARNING = (f"{SITE}/pytorch_lightning/utilities/_pytree.py:21: `isinstance(treespec, "
                     "LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and "
                     "treespec.is_leaf()` instead.")


def _sorts(sorter: OutputSorter, rank: int, lines: list[str]) -> list[str]:
    return [sorter.sort(rank, line).sort for line in lines]


def test_bars_drawn_with_cursor_codes_or_by_tqdm_are_live_lines_without_the_codes():
    sorter = OutputSorter()
    assert _sorts(sorter, 0, RICH_BAR) == [BAR, BAR, NOISE]
    assert "\x1b[2K" not in sorter.sort(0, RICH_BAR[1]).text
    assert "4/4" in sorter.sort(0, RICH_BAR[1]).text
    assert "\x1b[35m" in sorter.sort(0, RICH_BAR[1]).text  # its colours stay
    for tqdm in ("100%|██████████| 8/8 [00:00<00:00, 51.69it/s]",
                 "  0%|          | 0/8 [00:00<?, ?it/s]",
                 "Map: 45%|████▌     | 9/20 [00:01<00:01,  8.10 examples/s]",
                 "batches: 120it [00:03, 39.90it/s]"):
        assert sorter.sort(0, tqdm).sort == BAR, tqdm
    for line in ("epoch 3: loss 0.5 | acc 90%", "50% done", "x | 8/8 [a]"):
        assert sorter.sort(0, line).sort == SHOW, line


def test_each_kind_of_warning_is_shown_once_in_one_short_line():
    sorter = OutputSorter()
    first = sorter.sort(0, ACCELERATE_WARNING[0])
    assert first == (WARNING, "UserWarning (accelerate/state.py:279): OMP_NUM_THREADS/"
                              "MKL_NUM_THREADS unset, we set it at 1 to improve oob performance.")
    assert sorter.sort(0, ACCELERATE_WARNING[1]).sort == NOISE  # the source line under it
    assert _sorts(sorter, 1, ACCELERATE_WARNING) == [REPEAT, NOISE]
    # PyTorch's C++ warning, rank 0's after its tqdm bar's unfinished line
    ddp = sorter.sort(0, "  0%|          | 0/8 [00:00<?, ?it/s]" + DDP_WARNING.format(r=0))
    assert ddp.sort == WARNING and ddp.text.startswith("warning (reducer.cpp:1529): find_unused")
    assert len(ddp.text) < WARNING_CHARS + 40 and ddp.text.endswith(" ...")
    assert sorter.sort(1, DDP_WARNING.format(r=1)).sort == REPEAT
    # Lightning's own format has no category (and no source line: the next line is shown)
    assert sorter.sort(0, LIGHTNING_WARNING).text.startswith(
        "warning (pytorch_lightning/utilities/_pytree.py:21): `isinstance")
    assert sorter.sort(0, "  indented output of the user's").sort == SHOW
    assert sorter.warning_copies == 2
    # a path that is not a file's, or a line number that is not one, is not a warning
    for line in ("see notes.py:12: it says so", "/data/x.py:abc: UserWarning: no"):
        assert sorter.sort(0, line).sort == SHOW, line


def test_a_warning_of_ours_at_the_cell_s_line_is_shown_whole_once():
    """The Trainer's FSDP-on-CPU warning (355 characters) was cut in the cell at its fix
    (``...It runs as FSDP on ...``); a library's long warning still is."""
    from hvd_magics.rank.integrations.hugging_face import FSDP_ON_CPU

    sorter = OutputSorter(ranks=2)
    line = f"<%%horovod cell>:7: HorovodMagicsWarning: {FSDP_ON_CPU}"
    assert len(FSDP_ON_CPU) > WARNING_CHARS
    assert sorter.sort(0, line) == (WARNING,
                                    f"HorovodMagicsWarning (<%%horovod cell>:7): {FSDP_ON_CPU}")
    assert sorter.sort(1, line).sort == REPEAT
    kept = sorter.sort(0, f"<%%horovod cell 3>:2: HorovodMagicsWarning: {FSDP_ON_CPU}")
    assert kept.sort == WARNING and kept.text.endswith("saves its shards)")
    long = sorter.sort(0, f"{SITE}/lib/mod.py:9: UserWarning: " + "w " * 200)
    assert long.sort == WARNING and long.text.endswith(" ...")


def test_a_line_another_rank_already_showed_is_folded_and_the_end_says_so(tmp_path: Path):
    out = io.StringIO()
    job = JobState(2, tmp_path / "ranks.log", [TextView(stream=out)], "test")
    for rank in (0, 1):
        job.handle({"kind": "output", "rank": rank, "host": "h",
                    "lines": ["Loading data...", f"rank {rank} ready", "Loading data...",
                              *ACCELERATE_WARNING]})
    job.end()
    shown = out.getvalue().splitlines()
    assert shown[:4] == ["[0] Loading data...", "[0] rank 0 ready", "[0] Loading data...",
                         "[0] UserWarning (accelerate/state.py:279): OMP_NUM_THREADS/"
                         "MKL_NUM_THREADS unset, we set it at 1 to improve oob performance."]
    assert shown[4] == "[1] rank 1 ready"  # its own line; its copies of rank 0's are folded
    assert shown[5] == (f"hvd_magics: not shown here, in {tmp_path / 'ranks.log'}: 1 more copy of "
                        "the warnings above and 2 lines another rank had already shown")
    assert len(shown) == 6
    log = (tmp_path / "ranks.log").read_text()
    assert log.count("Loading data...") == 4 and log.count("OMP_NUM_THREADS") == 2
    # an error shows its rank's own lines, those folded here too
    assert list(job.ranks[1].tail)[-2:] == ["Loading data...", ACCELERATE_WARNING[0]]


def test_a_logger_s_record_another_rank_showed_at_another_time_is_folded():
    """DeepSpeed's accelerator warning came once per rank: the records differ in their time."""
    sorter = OutputSorter()
    record = ("[2026-11-29 02:16:43,{ms}] [WARNING] [real_accelerator.py:213:get_accelerator] "
              "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable "
              "to detect it.")
    assert sorter.sort(0, record.format(ms="398")).sort == SHOW
    assert sorter.sort(1, record.format(ms="399")).sort == REPEAT
    assert sorter.sort(1, "2026-11-29T02:16:44.5 epoch 1 done").sort == SHOW
    assert sorter.sort(1, "2026-11-29T02:16:47.1 epoch 1 done").sort == SHOW  # its own, again
    assert sorter.sort(0, "2026-11-29T02:16:45.0 epoch 1 done").sort == REPEAT


def test_debug_verbosity_shows_every_line_and_a_bar_becomes_the_rank_s_live_line(tmp_path):
    out, debug = io.StringIO(), io.StringIO()
    job = JobState(1, tmp_path / "ranks.log", [TextView(stream=out),
                                              TextView(VERBOSITY_DEBUG, stream=debug)], "test")
    job.handle({"kind": "output", "rank": 0, "host": "h", "lines": RICH_BAR[:2]})
    assert "4/4" in job.ranks[0].partial and "\x1b[1A" not in job.ranks[0].partial
    job.end()
    assert "Epoch 0/1" not in out.getvalue()
    assert debug.getvalue().count("Epoch 0/1") == 2


def test_a_line_longer_than_any_bar_or_warning_is_shown_without_being_searched():
    sorter = OutputSorter()
    line = "/x.py:1: UserWarning: " + "w" * 1_000_000
    assert sorter.sort(0, line).sort == SHOW and sorter.sort(1, line).sort == SHOW


def test_a_bar_s_count_moves_the_rank_s_steps_unless_it_reports_its_own(tmp_path):
    job = JobState(2, tmp_path / "ranks.log", [], "test")
    job.handle({"kind": "output", "rank": 0, "host": "h", "lines": [RICH_BAR[0]]})
    job.handle({"kind": "output_partial", "rank": 1, "host": "h",
                "text": "\r 45%|####      | 9/20 [00:01<00:01,  8.10it/s]"})
    assert (job.ranks[0].step, job.ranks[0].steps) == (1, 4)
    assert (job.ranks[1].step, job.ranks[1].steps) == (9, 20)
    job.handle({"kind": "epoch_begin", "rank": 1, "host": "h", "epoch": 1, "epochs": 2,
                "steps": 50})
    job.handle({"kind": "output_partial", "rank": 1, "host": "h", "text": "\r 10/20 [00:01"})
    assert (job.ranks[1].step, job.ranks[1].steps) == (0, 50)  # its own report wins
    job.end()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_dashboard_a_terminal_shows_each_rank_s_steps_as_its_live_line(
        tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)  # not in a kernel
    shown, piped = _Terminal(), io.StringIO()
    job = JobState(2, tmp_path / "ranks.log", [TextView(stream=shown, epoch_lines=True),
                                              TextView(stream=piped, epoch_lines=True)], "test")
    for rank in (0, 1):
        job.handle({"kind": "started", "rank": rank, "host": "h", "pid": 1})
        job.handle({"kind": "epoch_begin", "rank": rank, "host": "h", "epoch": 1, "epochs": 2,
                    "steps": 10})
        job.handle({"kind": "progress", "rank": rank, "host": "h", "epoch": 1, "step": 3 + rank,
                    "metrics": {"loss": 0.5}})
    job.tick()
    assert "\r[0] epoch 1/2 step 3/10 loss 0.5  [1] epoch 1/2 step 4/10 loss 0.5" in \
        shown.getvalue(), shown.getvalue()
    job.end()
    assert "step 3/10" not in piped.getvalue()  # a file would pile the redraws up


def test_lines_alike_but_for_their_numbers_are_one_line_of_what_differs_past_a_few_ranks():
    """A 16-rank job of 3 epochs printed 66 lines, a line per rank per epoch: past a few
    ranks, the cell shows rank 0's and then one line of what differs between the others."""
    from hvd_magics.job.readings.output_lines import ALIKE, FEW_RANKS, OutputSorter

    sorter = OutputSorter(16)
    shown = []
    for epoch in (1, 2, 3):
        for rank in range(16):
            for line in (f"Epoch {epoch}/3",
                         f"32/32 - 1s - loss: {0.3 + 0.001 * rank:.4f} - accuracy: 0.9000"):
                sort, text = sorter.sort(rank, line)
                if sort not in (ALIKE, "repeat"):
                    shown.append(text)
    assert len(shown) == 9, shown  # 3 x (Epoch, rank 0's line, the others' line)
    assert shown[2] == ("ranks 1-15 alike: 32/32 - 1s - loss: 0.3010 to 0.3150 - accuracy: "
                        "0.9000")
    assert "lines alike to another rank's but for their numbers" in sorter.left_out("the log")
    few = OutputSorter(FEW_RANKS)  # a few ranks: each rank's own line, as before
    assert [few.sort(r, f"loss {r}.5").sort for r in range(FEW_RANKS)] == ["show"] * FEW_RANKS


def test_alike_lines_of_a_rank_ahead_join_their_own_round_and_a_hash_is_text():
    """A rank that printed its next line before the others printed this one's reset the
    round (the others' held lines were never said, and rounds mixed: 'step 1 to 2'); a '#'
    in a line shifted every value."""
    from hvd_magics.job.readings.output_lines import ALIKE, OutputSorter

    sorter = OutputSorter(6)
    order = [(0, 1), (1, 1), (2, 1), (0, 2), (3, 1), (4, 1), (5, 1), (1, 2), (2, 2), (3, 2),
             (4, 2), (5, 2)]
    said = [text for rank, k in order
            for sort, text in [sorter.sort(rank, f"batch #{k}: loss {k + 0.01 * rank:.2f}")]
            if sort != ALIKE]
    assert said == ["batch #1: loss 1.00", "batch #2: loss 2.00",
                    "ranks 1-5 alike: batch #1: loss 1.01 to 1.05",
                    "ranks 1-5 alike: batch #2: loss 2.01 to 2.05"], said
