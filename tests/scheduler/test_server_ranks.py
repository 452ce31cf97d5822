"""A server's rank: the one it asks for (GRADPRESS_SERVER_ID, which gradpress-launch --local and
the Kubernetes pod index set), else the next free one in registration order. Before, servers
were ranked in registration order only, so the process the launcher's lines call server 0 was
the job's server 1 in every log about half the time."""
import pytest

from gradpress.scheduler.roster import Roster


def _register(roster: Roster, n: int, role: str = "server", **ids) -> str:
    h = {"role": role, "host": "127.0.0.1", "port": 5000 + n, "worker_id": ids.pop("worker_id", -1),
         "local_rank": 0, "local_size": 1, "pid": 100 + n, **ids}
    why = roster.refusal(bytes([n]), h)
    if not why:
        roster.add(bytes([n]), h)
    return why


def _server_ranks(roster: Roster) -> dict[int, int]:
    return {m.pid - 100: m.rank for m in roster.servers()}


def test_servers_take_the_ranks_they_ask_for_whatever_order_they_register_in():
    roster = Roster(num_worker=1, num_server=3)
    for n, asked in ((0, 2), (1, 0), (2, 1)):
        assert _register(roster, n, server_id=asked) == ""
    assert _register(roster, 3, "worker", worker_id=0) == ""
    roster.assign_ranks()
    assert _server_ranks(roster) == {0: 2, 1: 0, 2: 1}


def test_servers_that_ask_for_none_take_the_ranks_left_in_registration_order():
    roster = Roster(num_worker=1, num_server=3)
    assert _register(roster, 0) == "" and _register(roster, 1, server_id=0) == "" and _register(roster, 2) == ""
    assert _register(roster, 3, "worker") == ""
    roster.assign_ranks()
    assert _server_ranks(roster) == {0: 1, 1: 0, 2: 2}


@pytest.mark.parametrize("asked, why", [(1, "GRADPRESS_SERVER_ID=1 is already taken"),
                                        (2, "GRADPRESS_SERVER_ID=2 >= DMLC_NUM_SERVER=2")])
def test_a_rank_taken_or_out_of_range_is_refused_naming_it(asked, why):
    roster = Roster(num_worker=1, num_server=2)
    assert _register(roster, 0, server_id=1) == ""
    assert _register(roster, 1, server_id=asked) == why


@pytest.mark.parametrize("role, ids, why", [
    ("server", {"server_id": -5}, "server_id -5: a server's GRADPRESS_SERVER_ID is a rank, or -1 for any"),
    ("worker", {"server_id": 1}, "server_id 1: a server's GRADPRESS_SERVER_ID is a rank, or -1 for any")])
def test_a_server_id_below_minus_one_or_from_a_worker_is_refused(role, ids, why):
    # before, -5 read as "any rank" and a worker's was kept and ignored
    assert _register(Roster(num_worker=1, num_server=2), 0, role, **ids) == why


def test_a_node_past_the_jobs_count_is_refused_where_it_would_never_let_the_job_start():
    # before, a third server of two (asking for no rank, or a free one) was kept: the job could
    # never be complete and waited out GRADPRESS_CONNECT_TIMEOUT_S ("3 of 2 server(s) registered")
    roster = Roster(num_worker=1, num_server=2)
    assert _register(roster, 0) == "" and _register(roster, 1, server_id=1) == ""
    assert _register(roster, 2).startswith("DMLC_NUM_SERVER=2: all 2 server processes registered already (and none")
    assert _register(roster, 3, "worker") == ""
    assert _register(roster, 4, "worker").startswith("DMLC_NUM_WORKER=1 x BYTEPS_LOCAL_SIZE=1: all 1 worker "
                                                     "processes registered already")
    assert roster.complete()
