"""Networking: the message format (protocol), sockets (transport), shared memory between
processes on one host (shm), and a node's link to the scheduler (node)."""
