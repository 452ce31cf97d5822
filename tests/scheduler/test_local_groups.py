"""The roster's say on local reduction: the job agrees on it, and it applies only where
every worker can take part (named machines, several workers each, a synchronous job)."""
from gradpress.scheduler.roster import Roster


def _register(roster: Roster, n: int, worker_id: int, local_rank: int, local_size: int = 2,
              local_reduce: bool = True) -> str:
    h = {"role": "worker", "host": "127.0.0.1", "port": 5000 + n, "worker_id": worker_id,
         "local_rank": local_rank, "local_size": local_size, "pid": 100 + n, "local_reduce": local_reduce}
    why = roster.refusal(bytes([n]), h)
    if not why:
        roster.add(bytes([n]), h)
    return why


def test_a_worker_whose_local_reduce_setting_differs_is_refused_naming_it():
    roster = Roster(num_worker=2, num_server=1)
    assert _register(roster, 0, 0, 0) == ""
    why = _register(roster, 1, 0, 1, local_reduce=False)
    assert "GRADPRESS_LOCAL_REDUCE=0" in why and "differs" in why, why


def test_local_groups_apply_only_where_every_worker_can_take_part():
    roster = Roster(num_worker=2, num_server=1)
    for n, (machine, local_rank) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        assert _register(roster, n, machine, local_rank) == ""
    assert roster.local_group_size(async_mode=False) == 2
    assert roster.local_group_size(async_mode=True) == 1, "async pushes are applied alone: nothing to sum first"
    unnamed = Roster(num_worker=1, num_server=1)
    assert _register(unnamed, 0, -1, 0) == "" and _register(unnamed, 1, -1, 1) == ""
    assert unnamed.local_group_size(async_mode=False) == 1, "workers without DMLC_WORKER_ID name no machine"
    off = Roster(num_worker=1, num_server=1)
    assert _register(off, 0, 0, 0, local_reduce=False) == "" and _register(off, 1, 0, 1, local_reduce=False) == ""
    assert off.local_group_size(async_mode=False) == 1
    alone = Roster(num_worker=2, num_server=1)
    assert _register(alone, 0, 0, 0, local_size=1) == "" and _register(alone, 1, 1, 0, local_size=1) == ""
    assert alone.local_group_size(async_mode=False) == 1


def test_the_registration_summary_names_the_worker_slots_missing():
    # a local rank never started: the timeout said how many came, not which slot is missing
    roster = Roster(num_worker=2, num_server=1)
    for n, (machine, local_rank) in enumerate([(0, 0), (0, 1), (1, 1)]):
        assert _register(roster, n, machine, local_rank) == ""
    assert roster.missing_summary() == ("3 worker process(es) of 2 machine(s) and 0 of 1 server(s) registered; "
                                        "missing DMLC_WORKER_ID/BYTEPS_LOCAL_RANK 1/0")
    wide = Roster(num_worker=20, num_server=1)
    assert _register(wide, 0, 3, 0, local_size=1) == ""
    assert wide.missing_summary().endswith("0/0, 1/0, 2/0, 4/0, 5/0, 6/0, 7/0, 8/0 and 11 more")
    unnamed = Roster(num_worker=2, num_server=1)  # ranks by arrival: no slot to name
    assert _register(unnamed, 0, -1, 0, local_size=1) == ""
    assert unnamed.missing_summary().endswith("server(s) registered")
