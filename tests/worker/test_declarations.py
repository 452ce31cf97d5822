"""The declarations under way on a worker's communication thread (declarations.py), without
a job: a declaration the wire cannot carry fails its callers, the thread goes on; one that
gets no answer fails at its deadline; a refused one fails its parked push_pull too."""
import pytest

from gradpress.errors import OpTimeoutError, TensorMismatchError
from gradpress.net.protocol import ProtocolError
from gradpress.worker import commands as cmd
from gradpress.worker.deadlines import Deadlines
from gradpress.worker.declarations import Declarations
from gradpress.worker.future import Future
from gradpress.worker.jobs import PushPull
from gradpress.worker.keys import KeyTable


def declaring(name: str, with_job: bool = True) -> cmd.Declare:
    job = PushPull(None, None, None, 1, Future(f"push_pull of {name!r}"), 1) if with_job else None
    return cmd.Declare(name, 4, "float32", [4], None, Future(f"declare {name!r}"), None,
                       cmd.StartPushPull(job, 0) if job is not None else None)


def test_a_declaration_the_wire_refuses_fails_its_callers_and_nothing_else():
    def send(**fields):
        raise ProtocolError("DECLARE: field 'name' is too long")
    started = []
    d = Declarations(KeyTable(), Deadlines(), 5.0, send, started.append)
    c = declaring("w")
    d.declare(c)
    for future in (c.future, c.start.job.future):
        with pytest.raises(TensorMismatchError, match="'w' cannot be declared: DECLARE: field 'name' is too long"):
            future.result(1)
    assert started == [] and d.futures() == [] and d.parked(["w"]) == []


def test_an_unanswered_declaration_fails_at_its_deadline_and_a_refused_one_fails_its_job():
    sent, deadlines = [], Deadlines()
    d = Declarations(KeyTable(), deadlines, 5.0, lambda **fields: sent.append(fields["name"]), None)
    late, refused, plain = declaring("late"), declaring("refused"), declaring("plain", with_job=False)
    for c in (late, refused, plain):
        d.declare(c)
    assert sent == ["late", "refused", "plain"] and d.parked(["late", "plain", "x"]) == ["late"]
    d.declared(None, "refused", TensorMismatchError("tensor 'refused': worker 1 declared 5"))
    with pytest.raises(TensorMismatchError, match="worker 1 declared 5"):
        refused.start.job.future.result(1)
    deadlines.expire(float("inf"))
    for future in (late.future, late.start.job.future, plain.future):
        with pytest.raises(OpTimeoutError, match="no answer within 5 s"):
            future.result(1)
    assert d.futures() == []
