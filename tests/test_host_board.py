"""The shared-memory board through which the processes of one machine agree before a collective.

Processes are simulated by threads here (the words live in one shared file
either way); tests/test_multiprocess_collective_inputs.py runs the board in
real processes under `hasten launch`, and the all-reduce path beside it.
"""

import os
import threading
import time

import pytest

from hasten.launch.leftovers import empty, shared_directory  # the launcher's side of the board
from hasten.process import board as host_board, futex
from hasten.process.board import Board


def boards(path, world_size, timeout=5.0):
    return [Board(str(path), rank, world_size, timeout) for rank in range(world_size)]


def in_threads(calls):
    """Run one callable per simulated process at once; returns their results by rank."""
    results, errors = [None] * len(calls), []

    def run(rank):
        try:
            results[rank] = calls[rank]()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return results


def test_equal_signatures_agree_and_different_ones_are_seen_by_every_process(tmp_path):
    three = boards(tmp_path / "words", 3)
    assert in_threads([lambda b=b: b.agree(42) for b in three]) == [None, None, None]
    seen = in_threads([lambda b=b, s=s: b.agree(s) for b, s in zip(three, (7, 7, 9))])
    assert seen == [[7, 7, 9]] * 3  # every process gets every signature, so all raise the same error


def test_many_checks_with_processes_arriving_late_in_turn(tmp_path):
    """The two alternating slots: a fast process never overwrites a word a slow one still has to read."""
    two = boards(tmp_path / "words", 2)

    def run(board, rank):
        outcomes = []
        for check in range(300):
            if check % 7 == rank:
                time.sleep(0.001)  # this process arrives late at this check
            signature = check if check != 250 else 1000 + rank  # one real mismatch, at check 250
            outcomes.append(board.agree(signature))
        return outcomes

    first, second = in_threads([lambda: run(two[0], 0), lambda: run(two[1], 1)])
    assert first == second
    assert [i for i, outcome in enumerate(first) if outcome is not None] == [250]
    assert first[250] == [1000, 1001]


def test_a_process_that_never_comes_times_out_naming_it(tmp_path):
    alone = Board(str(tmp_path / "words"), rank=0, world_size=2, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 0.3 s waiting for rank\(s\) \[1\]"):
        alone.agree(5)
    assert time.monotonic() - start < 5


def test_emptying_the_directory_keeps_a_failed_attempts_words_from_passing_for_the_next_ones(tmp_path):
    old_rank1 = Board(str(tmp_path / "restart-0.words"), rank=1, world_size=2, timeout=0.2)
    with pytest.raises(RuntimeError):
        old_rank1.agree(5)  # the failed attempt left rank 1's word for check #1 behind
    new_rank0 = Board(str(tmp_path / "restart-0.words"), rank=0, world_size=2, timeout=0.2)
    assert new_rank0.agree(6) == [6, 5]  # read as current: what emptying between attempts prevents
    empty(str(tmp_path))
    fresh_rank0 = Board(str(tmp_path / "restart-0.words"), rank=0, world_size=2, timeout=0.2)
    with pytest.raises(RuntimeError, match="timed out"):
        fresh_rank0.agree(6)  # waits for the new rank 1, as it must


def test_a_killed_launchers_directory_is_removed_by_the_next_launch_and_a_live_ones_kept(tmp_path, monkeypatch):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)  # that process has exited: like a SIGKILLed launcher
    from hasten.launch import leftovers

    monkeypatch.setattr(leftovers.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(host_board.os.path, "isdir", lambda path: False if path == "/dev/shm" else os.path.exists(path))
    prefix = leftovers.prefix("board")
    stale, live, foreign = (tmp_path / f"{prefix}{dead_pid}-x1", tmp_path / f"{prefix}{os.getpid()}-x2",
                            tmp_path / f"hasten-board-another-host-{dead_pid}-x3")
    for directory in (stale, live, foreign):
        directory.mkdir()
        (directory / "restart-0.words").write_bytes(b"\0" * 32)
    with shared_directory() as path:
        assert path.startswith(str(tmp_path / f"{prefix}{os.getpid()}-"))
        assert not stale.exists()
        assert live.exists() and foreign.exists()  # a running launcher's, and another machine's (shared /dev/shm)


def test_shared_directory_is_exported_then_removed_and_the_environment_restored(monkeypatch):
    monkeypatch.delenv(host_board.BOARD_DIR_ENV, raising=False)
    with shared_directory() as path:
        assert os.environ[host_board.BOARD_DIR_ENV] == path and os.path.isdir(path)
        Board(os.path.join(path, "restart-0.words"), 0, 1, 1.0).agree(1)
    assert not os.path.exists(path) and host_board.BOARD_DIR_ENV not in os.environ


@pytest.mark.parametrize(("env", "used"), [
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, True),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, False),  # two machines: the all-reduce
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", host_board.BOARD_DIR_ENV: ""}, False),  # not launched by hasten
])
def test_the_board_is_used_only_when_every_process_is_on_this_machine(tmp_path, monkeypatch, env, used):
    import torch.distributed as dist

    monkeypatch.setenv(host_board.BOARD_DIR_ENV, str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(host_board, "_board_for", None)
    monkeypatch.setattr(host_board, "_board", None)
    assert (host_board.board() is not None) is used


def test_check_numbers_wrap_without_zero_and_keep_alternating_slots(tmp_path):
    board = Board(str(tmp_path / "words"), rank=0, world_size=1, timeout=1.0)
    board._number = 0xFFFFFFFE - 1
    numbers = []
    for _ in range(4):
        assert board.agree(3) is None
        numbers.append(board._number)
    assert numbers == [0xFFFFFFFE, 1, 2, 3]
    assert [n & 1 for n in numbers] == [0, 1, 0, 1]


def test_shared_payloads_are_each_processes_own_for_that_check_even_when_one_runs_ahead(tmp_path):
    """A process posts its next payload while a slow one still reads the last: the alternating slots keep both intact."""
    two = boards(tmp_path / "words", 2)

    def run(board, rank):
        seen = []
        for check in range(300):
            if check % 5 == rank:
                time.sleep(0.001)
            differ, payloads = board.share(check, f"{rank}:{check}".encode() * (1 + check % 40))
            assert differ is None
            seen.append(payloads)
        return seen

    first, second = in_threads([lambda: run(two[0], 0), lambda: run(two[1], 1)])
    assert first == second
    assert all(payloads == [f"{r}:{check}".encode() * (1 + check % 40) for r in (0, 1)] for check, payloads in enumerate(first))


def test_a_payload_is_not_read_when_the_signatures_differ_and_one_too_large_is_refused(tmp_path):
    two = boards(tmp_path / "words", 2)
    assert in_threads([lambda: two[0].share(1, b"ab"), lambda: two[1].share(2, b"abcd")]) == [([1, 2], [])] * 2
    with pytest.raises(ValueError, match=f"at most {host_board.PAYLOAD} bytes"):
        two[0].share(3, bytes(host_board.PAYLOAD + 1))


@pytest.mark.skipif(not futex.available, reason="futexes: Linux on x86-64 or arm64")
def test_a_process_waiting_for_a_late_one_sleeps_and_wakes_at_its_post(tmp_path):
    two = boards(tmp_path / "words", 2)
    posted = []

    def waiter():
        cpu = time.thread_time()
        outcome = two[0].agree(1)
        return outcome, time.thread_time() - cpu, time.monotonic()

    def late():
        time.sleep(0.5)
        posted.append(time.monotonic())
        return two[1].agree(1)

    (outcome, cpu, returned), _ = in_threads([waiter, late])
    assert outcome is None
    assert cpu < 0.1, f"the waiting process used {cpu:.3f} s of CPU in 0.5 s: it polled instead of sleeping"
    assert returned - posted[0] < 0.04  # woken by the post, not by its 50 ms sleep running out
