"""What members may make a server hold (gradpress/server/budget.py): the caps follow what
the job declared for the server, or the settings; a new key past a cap is refused naming
it; released keys give their bytes back."""
from gradpress.config import Settings
from gradpress.server.budget import MARGIN_BYTES, MARGIN_KEYS, KeyBudget


def declared(tensor_id, servers, part_bytes):
    return {"op": "DECLARED", "name": f"t{tensor_id}", "tensor_id": tensor_id, "servers": servers,
            "part_bytes": part_bytes}


def test_the_caps_follow_what_the_job_declared_for_this_server():
    budget = KeyBudget(Settings())
    budget.declared(declared(1, [0, 1, 0], [100, 200, 300]), rank=0)
    budget.declared(declared(2, [1], [5000]), rank=0)
    budget.declared(declared(1, [0, 1, 0], [100, 200, 300]), rank=0)  # a re-declaring worker's answer: once
    assert budget.caps() == (2 * 2 + MARGIN_KEYS, 2 * 400 + MARGIN_BYTES)


def test_a_new_key_past_a_cap_is_refused_naming_it_and_a_release_gives_room_back():
    budget = KeyBudget(Settings(server_max_keys=3, server_max_key_bytes=1000))
    assert budget.refusal(1, 400) == "" and budget.refusal(2, 400) == ""
    over = budget.refusal(3, 400)
    assert "over its cap of 1000 (GRADPRESS_SERVER_MAX_KEY_BYTES)" in over and "key 3" in over
    assert budget.held_bytes == 800
    budget.release(1)
    assert budget.refusal(3, 400) == "" and budget.refusal(4, 10) == ""
    assert "holds 3 keys for the job; its cap is 3 (GRADPRESS_SERVER_MAX_KEYS)" in budget.refusal(5, 10)
