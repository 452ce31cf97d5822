"""gradpress/net/auth.py: the job secret, the keys from it, CURVE sockets and the ZAP
handler on real sockets in this process; where nodes listen; logs.peer."""
from __future__ import annotations

import logging

import pytest
import zmq

from gradpress import logs
from gradpress.config import Settings
from gradpress.net import auth, transport
from gradpress.net.protocol import Op

SECRET = "k" * 40


def test_no_secret_is_an_error_saying_what_to_set():
    with pytest.raises(auth.JobSecretError) as e:
        auth.job_secret(Settings())
    for setting in ("GRADPRESS_JOB_SECRET", "GRADPRESS_JOB_SECRET_FILE", "GRADPRESS_INSECURE=1"):
        assert setting in str(e.value)


def test_a_short_secret_is_refused_by_length():
    with pytest.raises(auth.JobSecretError, match="GRADPRESS_JOB_SECRET: the secret has 31 characters"):
        auth.job_secret(Settings(job_secret="k" * 31))


@pytest.mark.parametrize("values, message", [
    (dict(job_secret=SECRET, job_secret_file="/x"), "both set: set only one"),
    (dict(job_secret=SECRET, insecure=True), "GRADPRESS_INSECURE=1 and a job secret"),
    (dict(job_secret=SECRET, security="off"), "GRADPRESS_SECURITY=off and a job secret"),
    (dict(job_secret=SECRET, security="tls"), "GRADPRESS_SECURITY='tls': expected curve, auth or off"),
    (dict(insecure=True, security="auth"), "contradict each other"),
])
def test_contradicting_settings_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        Settings(**values)


def test_insecure_with_curve_asked_for_is_refused_and_the_default_says_nothing():
    # before: GRADPRESS_SECURITY=curve set by hand and GRADPRESS_INSECURE=1 ran the job unencrypted
    with pytest.raises(ValueError, match="GRADPRESS_INSECURE=1 and GRADPRESS_SECURITY=curve contradict"):
        Settings.load({"GRADPRESS_INSECURE": "1", "GRADPRESS_SECURITY": "curve"})
    assert Settings.load({"GRADPRESS_INSECURE": "1"}).security == "off"


def test_the_secret_file_gives_the_same_keys_as_the_variable(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    assert auth.job_keys(Settings(job_secret_file=str(path))) == auth.job_keys(Settings(job_secret=SECRET))
    with pytest.raises(auth.JobSecretError, match=f"GRADPRESS_JOB_SECRET_FILE={tmp_path / 'none'}: cannot read"):
        auth.job_secret(Settings(job_secret_file=str(tmp_path / "none")))


def test_keys_are_derived_per_secret_and_never_printed():
    a, b = auth.JobKeys.from_secret(SECRET.encode()), auth.JobKeys.from_secret(SECRET.upper().encode())
    assert a == auth.JobKeys.from_secret(SECRET.encode()) and a.public != b.public
    assert len(a.public) == len(a.secret) == 40  # Z85 of 32 bytes
    assert zmq.curve_public(a.secret) == a.public
    settings = Settings(job_secret=SECRET)
    assert SECRET not in repr(settings) and a.secret.decode() not in repr(a)


def test_insecure_warns_and_uses_no_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="gradpress.net.auth"):
        assert auth.job_keys(Settings(insecure=True, log_level="INFO")) is None
    assert "neither authenticated nor encrypted" in caplog.text


def _member_router() -> tuple[zmq.Socket, int]:
    return transport.router(transport.context(), Settings(job_secret=SECRET, node_host="127.0.0.1"), 0)


def test_a_member_is_heard_and_outsiders_are_not(caplog):
    router, port = _member_router()
    ctx = transport.context()
    member = transport.dealer(ctx, Settings(job_secret=SECRET), "127.0.0.1", port, b"member")
    plain = ctx.socket(zmq.DEALER)
    wrong = transport.dealer(ctx, Settings(job_secret="w" * 40), "127.0.0.1", port, b"wrong")
    leaked = ctx.socket(zmq.DEALER)
    leaked.setsockopt(zmq.CURVE_SERVERKEY, auth.JobKeys.from_secret(SECRET.encode()).public)
    public, secret = zmq.curve_keypair()
    leaked.setsockopt(zmq.CURVE_PUBLICKEY, public)
    leaked.setsockopt(zmq.CURVE_SECRETKEY, secret)
    try:
        with caplog.at_level(logging.WARNING, logger="gradpress.net.auth"):
            for sock in (plain, leaked):
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(f"tcp://127.0.0.1:{port}")
            for sock in (plain, wrong, leaked):
                transport.send(sock, Op.HEARTBEAT, "outsider")
            transport.send(member, Op.HEARTBEAT, "member")
            assert router.poll(5000), "the member's message never arrived"
            identity, header, _ = transport.recv(router, routed=True)
            assert (identity, header["from"]) == (b"member", "member")
            assert not router.poll(500), f"an outsider got through: {transport.recv(router, routed=True)}"
        assert "refused a connection from 127.0.0.1 (CURVE" in caplog.text, caplog.text
    finally:
        for sock in (router, member, plain, wrong, leaked):
            sock.close(linger=0)


def test_nodes_listen_at_their_own_address_never_everywhere_unless_asked():
    local = Settings(root_uri="127.0.0.1")
    assert transport.listen_host(local) == "127.0.0.1"
    assert transport.listen_host(Settings(node_host="10.1.2.3")) == "10.1.2.3"
    anywhere = Settings(node_host="0.0.0.0", root_uri="127.0.0.1")
    assert transport.listen_host(anywhere) == "*"
    assert transport.announce_host(anywhere) == "127.0.0.1", "0.0.0.0 is not an address peers can reach"


def test_logs_quote_at_most_64_characters_of_a_peer_value():
    assert logs.peer(b"worker-1") == "b'worker-1'"
    assert logs.peer("op") == "op"
    cut = logs.peer(b"x" * 100_000)
    assert cut.endswith("...(100000 bytes)") and cut.count("x") == logs.PEER_TEXT_CHARS - 2
    assert len(logs.peer("y" * 1000)) <= logs.PEER_TEXT_CHARS + len("...(1000 chars)")
    assert logs.peer(memoryview(b"\x00" * 500)).endswith("...(500 bytes)")


def test_a_training_script_without_a_secret_fails_at_init_saying_what_to_set():
    """bps.init() outside gradpress-launch: the worker client refuses before any socket exists."""
    from gradpress.worker import WorkerClient
    with pytest.raises(auth.JobSecretError, match="GRADPRESS_JOB_SECRET"):
        WorkerClient(Settings(role="worker"))


def test_insecure_is_security_off_and_auth_derives_a_token_not_the_secret():
    assert Settings(insecure=True).security == "off"
    keys = auth.job_keys(Settings(job_secret=SECRET, security="auth"))
    assert keys.mode == "auth" and keys.token and SECRET.encode() not in keys.token
    assert keys.token != auth.JobKeys.from_secret(b"w" * 40, "auth").token, "the token depends on the secret"
    assert keys.token not in (keys.public, keys.secret) and keys.token.decode() not in repr(keys)


def test_under_auth_a_member_is_heard_and_outsiders_are_not(caplog):
    """A PLAIN client with the job's token is admitted; no credentials, another secret's
    token, and a curve client are refused (the ZAP handler logs the refusal)."""
    router, port = transport.router(transport.context(),
                                    Settings(job_secret=SECRET, security="auth", node_host="127.0.0.1"), 0)
    ctx = transport.context()
    member = transport.dealer(ctx, Settings(job_secret=SECRET, security="auth"), "127.0.0.1", port, b"member")
    plain = ctx.socket(zmq.DEALER)
    wrong = transport.dealer(ctx, Settings(job_secret="w" * 40, security="auth"), "127.0.0.1", port, b"wrong")
    curve = transport.dealer(ctx, Settings(job_secret=SECRET), "127.0.0.1", port, b"curve")
    try:
        with caplog.at_level(logging.WARNING, logger="gradpress.net.auth"):
            plain.setsockopt(zmq.LINGER, 0)
            plain.connect(f"tcp://127.0.0.1:{port}")
            for sock in (plain, wrong, curve):
                try:
                    sock.send_multipart([b"x"], zmq.NOBLOCK)
                except zmq.Again:
                    pass
            transport.send(member, Op.HEARTBEAT, "member")
            assert router.poll(5000), "the member's message never arrived"
            identity, header, _ = transport.recv(router, routed=True)
            assert (identity, header["from"]) == (b"member", "member")
            assert not router.poll(500), f"an outsider got through: {transport.recv(router, routed=True)}"
        assert "refused a connection from 127.0.0.1 (PLAIN" in caplog.text, caplog.text
    finally:
        for sock in (router, member, plain, wrong, curve):
            sock.close(linger=0)


@pytest.mark.parametrize("line", ['security = "off"', "insecure = true", 'job_secret_file = "/run/secret"'])
def test_a_local_job_makes_no_secret_where_its_job_file_chose_the_security(tmp_path, line):
    """(``gradpress-launch --local --config`` made one all the same, and the processes stopped
    saying that GRADPRESS_SECURITY=off and a job secret were both set.)"""
    path = tmp_path / "job.toml"
    path.write_text(f"[settings]\n{line}\n")
    assert auth.secret_env({"GRADPRESS_CONFIG": str(path)}) == {}
    assert set(auth.secret_env({})) == {"GRADPRESS_JOB_SECRET"}
