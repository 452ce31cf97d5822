"""Who may talk to a job: keys derived from the job secret, and a ZAP handler.

Every member of a job knows one secret (``GRADPRESS_JOB_SECRET`` or the file
``GRADPRESS_JOB_SECRET_FILE`` names). From it each process derives the same CURVE
keypair: every bound socket is a CURVE server with it, every connecting socket a
CURVE client with it. A process without the secret cannot complete the handshake
(it does not know the servers' public key), and one that somehow learnt the public
key is still refused by the ZAP handler, which admits only clients presenting the
job's own public key, proof that they hold its secret key. Everything after the
handshake is encrypted (``GRADPRESS_SECURITY=curve``, the default).

``GRADPRESS_SECURITY=auth`` is for a trusted fabric: a connecting process proves it holds
the secret with ZeroMQ's PLAIN mechanism, presenting a token derived from the secret (never
the secret itself), which the ZAP handler checks; the data then travels unencrypted, at no
per-byte cost. It keeps out processes and scanners that can reach the ports but cannot read
the traffic; anyone who can sniff the fabric reads the data and can replay the token.
``GRADPRESS_SECURITY=off`` (or ``GRADPRESS_INSECURE=1``) runs without any of this (plain
TCP, anyone who can reach a port is a member).
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import Mapping

import zmq
from zmq.utils import z85

from .. import logs

log = logging.getLogger(__name__)

# A random secret has at least this many characters (secrets.token_hex(16) has 32). The
# keys come from one hash of it, so a short or guessable secret could be searched for.
MIN_SECRET_CHARS = 32
# Domain separation: the same secret used elsewhere gives unrelated keys here.
KDF_PERSON = b"gradpress-curve1"
TOKEN_PERSON = b"gradpress-auth1"
PLAIN_USER = b"gradpress"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN_PREFIX = b"gradpress:"
PLAIN_DOMAIN = b"plain:"
HOW_TO_SET = ("set GRADPRESS_JOB_SECRET to a random string of at least "
              f"{MIN_SECRET_CHARS} characters, the same in every process of the job "
              "(python -c 'import secrets; print(secrets.token_hex(32))'), or GRADPRESS_JOB_SECRET_FILE "
              "to a file holding it; GRADPRESS_SECURITY=off (or GRADPRESS_INSECURE=1) runs without "
              "authentication or encryption")


class JobSecretError(ValueError):
    """The job secret is missing, unreadable or too short; the message says what to set."""


@dataclass(frozen=True)
class JobKeys:
    """The job's CURVE keypair (Z85-encoded, as ZeroMQ's socket options take them), its
    ``auth`` token, and which of them the sockets use (``mode``: curve or auth)."""
    public: bytes
    secret: bytes = field(repr=False)  # never printed
    token: bytes = field(default=b"", repr=False)
    mode: str = "curve"

    @classmethod
    def from_secret(cls, secret: bytes, mode: str = "curve") -> "JobKeys":
        raw = hashlib.blake2b(secret, digest_size=32, person=KDF_PERSON).digest()
        secret_z85 = z85.encode(raw)
        token = hashlib.blake2b(secret, digest_size=32, person=TOKEN_PERSON).hexdigest().encode()
        return cls(public=zmq.curve_public(secret_z85), secret=secret_z85, token=token, mode=mode)


def secret_env(environ: Mapping[str, str], secret: str | None = None) -> dict[str, str]:
    """What to add to ``environ`` so that the processes it starts form a job: a random
    ``GRADPRESS_JOB_SECRET`` (or ``secret``), unless ``environ`` or the job file it names
    (``GRADPRESS_CONFIG``) sets a secret, a secret file or no security already (the user's
    choice wins: a job file's ``security = "off"`` met a made secret, and its processes
    stopped saying both were set)."""
    insecure = environ.get("GRADPRESS_INSECURE", "").strip().lower() in ("1", "true", "yes", "on") or \
        environ.get("GRADPRESS_SECURITY", "").strip().lower() == "off"
    if insecure or environ.get("GRADPRESS_JOB_SECRET") or environ.get("GRADPRESS_JOB_SECRET_FILE"):
        return {}
    from ..config import Settings
    try:
        chosen = Settings.load(environ)
    except ValueError:  # (each process says what is wrong, as it starts)
        chosen = None
    if chosen is not None and (chosen.security == "off" or chosen.insecure or chosen.job_secret
                               or chosen.job_secret_file):
        return {}
    return {"GRADPRESS_JOB_SECRET": secret or secrets.token_hex(32)}


def job_secret(settings) -> bytes | None:
    """The job secret from the settings, or None when ``GRADPRESS_INSECURE=1``.

    Raises:
        JobSecretError: no secret and not insecure; an unreadable or empty file; a secret
            shorter than MIN_SECRET_CHARS. The message names the variable and what to set.
    """
    if settings.security == "off":
        return None
    if settings.job_secret_file:
        where = f"GRADPRESS_JOB_SECRET_FILE={settings.job_secret_file}"
        try:
            with open(settings.job_secret_file, "rb") as fh:
                secret = fh.read().strip()  # a trailing newline is not part of the secret
        except OSError as e:
            raise JobSecretError(f"{where}: cannot read it: {e.strerror}") from None
    elif settings.job_secret:
        where, secret = "GRADPRESS_JOB_SECRET", settings.job_secret.encode()
    else:
        raise JobSecretError(f"no job secret: {HOW_TO_SET}")
    if len(secret) < MIN_SECRET_CHARS:
        raise JobSecretError(f"{where}: the secret has {len(secret)} characters, fewer than "
                             f"{MIN_SECRET_CHARS}: {HOW_TO_SET}")
    return secret


@functools.lru_cache(maxsize=8)
def job_keys(settings) -> JobKeys | None:
    """The job's keys (None when security is off); derived once per process and settings."""
    secret = job_secret(settings)
    if secret is None:
        log.warning("%s: this job's sockets are neither authenticated nor encrypted; anyone who can reach "
                    "its ports can read, push into or end it",
                    "GRADPRESS_INSECURE=1" if settings.insecure else "GRADPRESS_SECURITY=off")
        return None
    if settings.security == "auth":
        log.info("GRADPRESS_SECURITY=auth: members prove the job secret when they connect; the data travels "
                 "unencrypted (anyone who can read the fabric can read it)")
    return JobKeys.from_secret(secret, settings.security)


def make_server(sock: zmq.Socket, keys: JobKeys | None) -> None:
    """A socket that binds: CURVE (or, for ``auth``, PLAIN) server with the job's keys,
    checked by the context's ZAP handler."""
    if keys is None:
        return
    _zap_handler(sock.context)
    # the domain names what to admit, so one context may serve several jobs (tests do); it
    # stays in this process (ZeroMQ never sends it)
    if keys.mode == "auth":
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN_PREFIX + PLAIN_DOMAIN + keys.token)
        sock.setsockopt(zmq.PLAIN_SERVER, 1)
        return
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN_PREFIX + keys.public)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


def make_client(sock: zmq.Socket, keys: JobKeys | None) -> None:
    """A socket that connects: a CURVE client that proves it holds the job's secret key, or
    for ``auth`` a PLAIN one that presents the job's token."""
    if keys is None:
        return
    if keys.mode == "auth":
        sock.setsockopt(zmq.PLAIN_USERNAME, PLAIN_USER)
        sock.setsockopt(zmq.PLAIN_PASSWORD, keys.token)
        return
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


_handlers: dict[int, "ZapHandler"] = {}
_handlers_lock = threading.Lock()


def _zap_handler(ctx: zmq.Context) -> "ZapHandler":
    """The context's ZAP handler, started before its first CURVE server binds (without
    one, ZeroMQ would admit every client that completes the handshake)."""
    with _handlers_lock:
        handler = _handlers.get(id(ctx))  # the handler holds its context: the id stays unique
        if handler is None or not handler.is_alive():
            handler = _handlers[id(ctx)] = ZapHandler(ctx)
            handler.start()
            if not handler.bound.wait(10):
                raise RuntimeError("the ZAP handler did not start within 10 s")
        return handler


class ZapHandler(threading.Thread):
    """Answers ZeroMQ's authentication requests (ZAP, RFC 27) for one context: a CURVE
    client is admitted only if it presents the job's public key, which the listening
    socket's ZAP domain names. Refusals are logged once per peer address, with counts
    every power of two."""

    def __init__(self, ctx: zmq.Context):
        super().__init__(name="gradpress-zap", daemon=True)
        self.ctx = ctx
        self.bound = threading.Event()
        self.refused: dict[str, int] = {}

    def run(self) -> None:
        sock = self.ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(ZAP_ENDPOINT)
        self.bound.set()
        try:
            while True:
                request = sock.recv_multipart()  # ends with ContextTerminated when the context ends
                try:
                    reply = self._answer(request)
                except Exception:  # a handler that dies would leave every handshake hanging
                    log.exception("ZAP request not understood")
                    reply = [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"internal error", b"", b""]
                sock.send_multipart(reply)
        except zmq.ContextTerminated:  # (a worker's context ends with its job: forget it)
            with _handlers_lock:
                if _handlers.get(id(self.ctx)) is self:
                    del _handlers[id(self.ctx)]
        finally:
            sock.close()

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain, address, _identity, mechanism = request[:6]
        credentials = request[6:]
        if domain.startswith(ZAP_DOMAIN_PREFIX + PLAIN_DOMAIN):
            expected = [PLAIN_USER, domain[len(ZAP_DOMAIN_PREFIX + PLAIN_DOMAIN):]]
            if mechanism == b"PLAIN" and len(credentials) == 2 and \
                    all(hmac.compare_digest(c, e) for c, e in zip(credentials, expected)):
                return [version, request_id, b"200", b"OK", b"member", b""]
        elif mechanism == b"CURVE" and domain.startswith(ZAP_DOMAIN_PREFIX) and \
                credentials == [z85.decode(domain[len(ZAP_DOMAIN_PREFIX):])]:
            return [version, request_id, b"200", b"OK", b"member", b""]
        peer = logs.peer(address.decode(errors="replace"))
        count = self.refused[peer] = self.refused.get(peer, 0) + 1
        if count & (count - 1) == 0:  # 1, 2, 4, 8, ...: an outsider that retries cannot flood the log
            log.warning("refused a connection from %s (%s, not the job's key); %d refusal(s) from there so far",
                        peer, logs.peer(mechanism.decode(errors="replace")), count)
        return [version, request_id, b"400", b"not a member of this job", b"", b""]
