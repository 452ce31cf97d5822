"""The server role: a share of the keys, summed round by round."""
from .server import Server, run_server

__all__ = ["Server", "run_server"]
