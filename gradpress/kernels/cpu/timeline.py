"""The planner's timeline of one iteration on one worker, as a Numba kernel.

The planner simulates thousands of plans per decision (under 10 ms for 200 tensors),
so the event loop runs compiled, with binary heaps: O(n log n) per plan.
``gradpress/planner/simulate.py`` explains the model and builds the tables; this kernel
only walks them.

Arguments are packed into a few arrays (a call with many arrays costs more to dispatch
than the simulation itself). Per partition p (in declaration order), with its option
o = opt[group[p]]: ``ints[:3, p]`` = group, priority, and the partitions in order of ready
time (``ints[2]``), ``ints[3 + 2 o, p]`` and ``ints[4 + 2 o, p]`` its server and engine
thread as option o's partitions are placed; ``ready[p]`` (s); ``tables[:, o, p]`` = payload (bytes on
the wire), compress and decompress time on the worker, the server's work for the round
(every push summed, the aggregate recompressed), and 1.0 where p is a partition of option o
(0.0: o sends it in the partition before, as one: nothing to do). ``job`` = workers, servers, engine
threads, credit, link bytes/s, link latency (s), the communication thread's time per
message (half when it sends a partition, half when it lands the reply). Workers are symmetric: a server's link
carries every worker's copy.
"""
import numpy as np
from numba import njit


@njit(nogil=True, cache=True, inline="always")
def _less(key, a, b, tie):
    return key[a] < key[b] or (key[a] == key[b] and tie[a] < tie[b])


@njit(nogil=True, cache=True)
def _push(heap, size, item, key, tie):
    """Add ``item`` to a min-heap of indices ordered by (key, tie); returns the new size."""
    i = size
    heap[i] = item
    while i > 0:
        parent = (i - 1) // 2
        if _less(key, heap[i], heap[parent], tie):
            heap[i], heap[parent] = heap[parent], heap[i]
            i = parent
        else:
            break
    return size + 1


@njit(nogil=True, cache=True)
def _pop(heap, size, key, tie):
    """Remove the least item; returns (item, new size)."""
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        left, right, least = 2 * i + 1, 2 * i + 2, i
        if left < size and _less(key, heap[left], heap[least], tie):
            least = left
        if right < size and _less(key, heap[right], heap[least], tie):
            least = right
        if least == i:
            break
        heap[i], heap[least] = heap[least], heap[i]
        i = least
    return top, size


@njit(nogil=True, cache=True)
def simulate_iteration(opt, ints, ready, tables, job, out_land, out_work):
    """Fills ``out_land[p]`` (when partition p has been decompressed) and ``out_work``: the
    communication thread's busy seconds, every server's CPU summed (its work on the
    rounds, and a message's cost per worker and partition), and the bytes one worker
    pushes (as many come back); returns the last landing."""
    group, prio, by_ready = ints[0], ints[1], ints[2]
    payload, comp, decomp, serve, starts = tables[0], tables[1], tables[2], tables[3], tables[4]
    workers, n_servers, n_engines, credit = job[0], int(job[1]), int(job[2]), job[3]
    bytes_per_s, alpha_s, half_message_s = job[4], job[5], job[6] / 2
    n = ready.shape[0]
    order = np.arange(n).astype(np.float64)   # ties in every heap go to the earlier partition
    neg_prio = -prio.astype(np.float64)
    land_at = np.zeros(n)
    acks = np.zeros(n)
    waiting = np.empty(n, np.int64)   # ready, not sent: by priority
    n_waiting = 0
    replies = np.empty(n, np.int64)   # sent, not landed: by arrival
    n_replies = 0
    flight = np.empty(n, np.int64)    # pushes not yet taken by a server: by ack time
    n_flight = 0
    next_ready = 0
    w_out = 0.0
    w_in = 0.0
    s_in = np.zeros(n_servers)
    s_out = np.zeros(n_servers)
    engines = np.zeros((n_servers, n_engines))
    cpu = 0.0
    busy = 0.0
    served = 0.0
    pushed = 0.0
    n_landed = 0
    last = 0.0
    while n_landed < n:
        while next_ready < n and ready[by_ready[next_ready]] <= cpu:
            p = by_ready[next_ready]
            next_ready += 1
            if starts[opt[group[p]], p] == 0.0:   # travels in the partition before it
                out_land[p] = 0.0
                n_landed += 1
            else:
                n_waiting = _push(waiting, n_waiting, p, neg_prio, order)
        while n_flight > 0 and acks[flight[0]] <= cpu:
            _, n_flight = _pop(flight, n_flight, acks, order)
        if n_replies > 0 and land_at[replies[0]] <= cpu:
            # replies first, as the communication thread drains them before dispatching
            p, n_replies = _pop(replies, n_replies, land_at, order)
            work = decomp[opt[group[p]], p] + half_message_s
            cpu += work
            busy += work
            out_land[p] = cpu
            last = max(last, cpu)
            n_landed += 1
            continue
        if n_waiting > 0 and n_flight < credit:
            p, n_waiting = _pop(waiting, n_waiting, neg_prio, order)
            o = opt[group[p]]
            work = comp[o, p] + half_message_s
            cpu += work
            busy += work
            # a server handles each worker's push and pull of it (about a message's CPU each)
            served += serve[o, p] + workers * 2 * half_message_s
            b = payload[o, p]
            pushed += b
            up_start = max(cpu, w_out)
            w_out = up_start + b / bytes_per_s
            s = ints[3 + 2 * o, p]
            s_in[s] = max(s_in[s], up_start) + workers * b / bytes_per_s
            acks[p] = max(w_out, s_in[s]) + alpha_s
            n_flight = _push(flight, n_flight, p, acks, order)
            e = ints[4 + 2 * o, p]
            done = max(acks[p], engines[s, e]) + serve[o, p]
            engines[s, e] = done
            s_out[s] = max(s_out[s], done) + workers * b / bytes_per_s
            w_in = max(w_in, done) + b / bytes_per_s
            land_at[p] = max(s_out[s], w_in) + alpha_s
            n_replies = _push(replies, n_replies, p, land_at, order)
            continue
        # nothing to do now: wait for the next reply, gradient or credit
        nxt = np.inf
        if n_replies > 0:
            nxt = land_at[replies[0]]
        if next_ready < n:
            nxt = min(nxt, ready[by_ready[next_ready]])
        if n_waiting > 0 and n_flight > 0:
            nxt = min(nxt, acks[flight[0]])
        cpu = max(cpu, nxt)
    out_work[0] = busy
    out_work[1] = served
    out_work[2] = pushed
    return last


@njit(nogil=True, cache=True)
def finish_iteration(group_of, land, backward_end_s, out_group_land):
    """When the training thread is done: after backward, and once every group has landed
    (its average is handed back as views of its buffer: nothing to copy out). Fills
    ``out_group_land`` per group."""
    out_group_land[:] = 0.0
    t = backward_end_s
    for p in range(land.shape[0]):
        g = group_of[p]
        out_group_land[g] = max(out_group_land[g], land[p])
        t = max(t, land[p])
    return t


@njit(nogil=True, cache=True)
def place_partitions(sizes, n_servers, n_engines, out_server, out_engine):
    """Servers as the scheduler places partitions and engines as each server pins keys:
    the least loaded by bytes, ties to the lowest index."""
    load = np.zeros(n_servers)
    engine_load = np.zeros((n_servers, n_engines))
    for p in range(sizes.shape[0]):
        s = np.argmin(load)
        e = np.argmin(engine_load[s])
        load[s] += sizes[p]
        engine_load[s, e] += sizes[p]
        out_server[p] = s
        out_engine[p] = e
