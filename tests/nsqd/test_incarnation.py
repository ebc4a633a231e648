"""A cluster node's incarnation (docs/design.md §14, "Incarnations"): the identity of its data
directory, and the run of it. A start that follows a clean stop goes on in the same run; one
that follows a crash, a kill -9 or a power loss (which may have taken the unsynced tail of
every log) begins a new run of the same identity, so the ISRs count on nothing it holds until
it caught up again."""

from nsqpy.common.cluster_meta import same_disk_identity
from nsqpy.nsqd.data_path import (
    CLEAN_STOP_FILE,
    INCARNATION_FILE,
    data_incarnation,
    mark_clean_stop,
)


def test_a_new_directory_gets_an_identity_kept_across_clean_stops(tmp_path) -> None:
    first = data_incarnation(str(tmp_path), starting=True)
    assert len(first) == 32 and "-" not in first
    for _start in range(3):
        mark_clean_stop(str(tmp_path))
        assert (tmp_path / CLEAN_STOP_FILE).exists()
        assert data_incarnation(str(tmp_path), starting=True) == first
        # The mark is taken as the run starts: a crash from here is not a clean stop.
        assert not (tmp_path / CLEAN_STOP_FILE).exists()


def test_a_start_after_a_stop_that_was_not_clean_is_a_new_run_of_the_same_disk(
    tmp_path,
) -> None:
    identity = data_incarnation(str(tmp_path), starting=True)
    runs = set()
    for _crash in range(3):
        run = data_incarnation(str(tmp_path), starting=True)
        assert run != identity and run not in runs
        assert same_disk_identity(run) == identity
        # One run after another replaces the run; it does not grow.
        assert len(run) == 32 + 1 + 8
        runs.add(run)
    mark_clean_stop(str(tmp_path))
    assert data_incarnation(str(tmp_path), starting=True) == run


def test_only_the_starting_process_begins_a_run(tmp_path) -> None:
    """A `--workers` node's supervisor begins the run; its workers, starting afterwards,
    read the incarnation it left."""
    data_incarnation(str(tmp_path), starting=True)
    run = data_incarnation(str(tmp_path), starting=True)
    assert data_incarnation(str(tmp_path)) == run
    assert data_incarnation(str(tmp_path)) == run


def test_an_unreadable_incarnation_is_a_new_identity(tmp_path) -> None:
    identity = data_incarnation(str(tmp_path), starting=True)
    (tmp_path / INCARNATION_FILE).write_text("not an incarnation\n")
    replaced = data_incarnation(str(tmp_path), starting=True)
    assert same_disk_identity(replaced) != identity
