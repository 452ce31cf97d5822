"""Write the tables of docs/performance.md, and the README's results, from the result records.

    python benchmarks/perf_tables.py            # rewrite every table in place
    python benchmarks/perf_tables.py --check    # change nothing; exit 1 naming each table that differs

A table sits between ``<!-- results: FOLDER -->`` and ``<!-- end results -->``, FOLDER being
a folder of benchmarks/results/. What lies between the markers is made from the folder's
latest record (``results.latest``): a line saying where the figures come from (command,
date, commit, machine) and the table its benchmark's renderer draws. Edit the renderer or
run the benchmark again, never the table. The README's ``<!-- results: headline -->`` takes
its ratios from the same records.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Callable

import results

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PAGES = (REPO / "docs" / "performance.md", REPO / "README.md")
BLOCK = re.compile(r"(<!-- results: (?P<folder>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.S)


# -- what every table starts with ------------------------------------------------------------

def shown_command(rec: dict) -> str:
    """The recorded command as one would type it here: ``python`` for the interpreter's path,
    the settings the run had in front, the shared machine's lock left out."""
    words = shlex.split(rec["command"])
    if words[:2] == ["flock", "/tmp/gp-cpu.lock"]:
        words = words[2:]
    if words and (words[0].endswith("/python") or re.fullmatch(r"(.*/)?python3?(\.\d+)?", words[0])):
        words[0] = "python"
    env = [f"{k}={v}" for k, v in rec.get("environment", {}).items()]
    return shlex.join([*env, *words]) if env else shlex.join(words)


def machine_text(m: dict) -> str:
    parts = [m.get("cpu") or "CPU not recorded", f"{m['cores']} cores" if m.get("cores") else None,
             f"{m['memory_gib']:g} GiB" if m.get("memory_gib") else None]
    parts += m.get("gpus") or []
    return ", ".join(p for p in parts if p)


def provenance(rec: dict) -> str:
    commit = (rec.get("commit") or "")[:7]
    if not commit and rec.get("recorded_in_commit"):
        commit = f"not recorded (the figures were committed in {rec['recorded_in_commit'][:7]})"
    elif rec.get("changed_files"):
        commit += " (tree changed)"
    date = rec["date"].replace("T", " ").removesuffix("Z") + (" UTC" if "T" in rec["date"] else "")
    how = "run"
    if rec["source"] == "transcribed":   # copied from where the run reported it, before records existed
        how = ("transcribed from the old page (docs/history)" if "docs/history" in rec.get("transcribed_from", "")
               else "transcribed from the run's output (the record's note says how)")
    return (f"`{shown_command(rec)}`: {date}, commit {commit or 'not recorded'}; "
            f"{machine_text(rec['machine'])}; {how}.")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def f(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


# -- one renderer per benchmark ----------------------------------------------------------------

RATES = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "max": "unshaped"}
MODELS = {"mlp": "MLP", "tfm": "transformer"}
SYSTEM_ORDER = ("gp_none", "gp_none_auth", "gp_none_insecure", "gp_onebit", "gp_topk", "gp_randomk", "gp_auto",
                "gp_auto_lr", "gp_powersgd", "gp_acpsgd", "gp_acpsgd_r4", "ddp", "ddp_powersgd")
BANDWIDTH_KEY = re.compile(r"(?P<rate>max|\d+(?:\.\d+)?[kmg]?bit)_(?P<model>[a-z0-9]+)_(?P<system>.+)_s_per_iter")


def bandwidth_cells(r: dict) -> dict[tuple[str, str], dict[str, float]]:
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for key, value in r.items():
        m = BANDWIDTH_KEY.fullmatch(key)
        if m:
            cells.setdefault((m["rate"], m["model"]), {})[m["system"]] = value
    return cells


def rate_order(rate: str) -> float:
    return float("inf") if rate == "max" else _rate_bits(rate)


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate)
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]] if m else 0.0


def render_bandwidth(r: dict) -> list[str]:
    cells = bandwidth_cells(r)
    systems = sorted({s for row in cells.values() for s in row},
                     key=lambda s: (SYSTEM_ORDER.index(s) if s in SYSTEM_ORDER else len(SYSTEM_ORDER), s))
    rows = []
    for rate, model in sorted(cells, key=lambda k: (rate_order(k[0]), k[1])):
        row = cells[rate, model]
        fastest = min((v for v in row.values() if v is not None), default=None)
        line = [RATES.get(rate, rate), MODELS.get(model, model)]
        for s in systems:
            v = row.get(s)
            text = "" if s not in row else f(v)
            if v is not None and v == fastest:
                text = f"**{text}**"
            predicted = r.get(f"{rate}_{model}_{s}_predicted_s")
            if predicted is not None:
                text += f" ({f(predicted)})"
            line.append(text)
        rows.append(line)
    out = table(["link", "model", *(f"`{s}`" for s in systems)], rows)
    notes = [f"{MODELS.get(m, m)} {f(r[f'{m}_compute_only_s_per_iter'])}" for m in MODELS
             if f"{m}_compute_only_s_per_iter" in r]
    tail = []
    if notes:
        tail.append("compute only (one process, no communication): " + ", ".join(notes) + " s/iter")
    if r.get("planner_decision_ms_200") is not None:
        tail.append(f"the planner's decision for 200 tensors: {r['planner_decision_ms_200']:g} ms")
    predicted = any(k.endswith("_predicted_s") and v is not None for k, v in r.items())
    what = "Seconds per iteration, the fastest in bold" + (", the planner's prediction in brackets" if predicted
                                                          else "")
    return out + ["", "; ".join([what, *tail]) + "."]


def render_pushpull(r: dict) -> list[str]:
    rows = [(label, r.get(key)) for label, key in (
        ("pyzmq zero-copy, 4 MiB messages, 2 processes", "zmq_GBps"),
        ("gradpress push_pull, shared memory (co-located nodes' default)", "pushpull_GBps"),
        ("gradpress push_pull, loopback TCP (`GRADPRESS_SHM=0`, encrypted)", "pushpull_tcp_GBps"),
        ("torch.distributed gloo all_reduce, 2 processes", "gloo_GBps"))]
    out = table(["what", "GB/s"], [[label, f(v, 2)] for label, v in rows if v is not None])
    if r.get("pushpull_over_gloo") is not None:
        out += ["", f"push_pull / gloo all_reduce: **{r['pushpull_over_gloo']:.2f}x** (goal: at least 1x), "
                    f"a {r.get('tensor_MB', 100):g} MB float32 tensor, 2 workers and 1 server."]
    return out


def render_pushpull_curve(r: dict) -> list[str]:
    rows = []
    for path, label in (("shm", "shared memory"), ("tcp", "loopback TCP (`GRADPRESS_SHM=0`)")):
        curve, clear = r.get(f"pushpull_{path}_curve_GBps"), r.get(f"pushpull_{path}_insecure_GBps")
        if curve is None and clear is None:
            continue
        ratio = r.get(f"{path}_insecure_over_curve")
        rows.append([label, f(curve, 2), f(clear, 2), "n/a" if ratio is None else f"{ratio:.2f}x"])
    return table(["path", "CURVE GB/s", "in the clear GB/s", "clear / CURVE"], rows)


KERNEL_CODECS = ("onebit", "topk", "randomk", "dithering", "fp16", "none")


def render_kernels(r: dict) -> list[str]:
    rows = []
    for c in KERNEL_CODECS:
        if f"{c}_compress_GBps" not in r:
            continue
        fused, bound, generic = (r.get(f"{c}_ef_{k}_GBps") for k in ("compress", "bound", "generic"))
        compress = "zero-copy" if c == "none" else f(r[f"{c}_compress_GBps"], 2)
        rows.append([c, compress, f(r.get(f"{c}_decompress_GBps"), 2),
                     f(r.get(f"{c}_numpy_compress_GBps"), 2), f(r.get(f"{c}_ratio"), 4),
                     f(fused, 2) if fused is not None else "",
                     f"{fused / bound:.2f}x" if fused and bound else "",
                     f"{fused / generic:.1f}x" if fused and generic else "",
                     f(r.get(f"{c}_server_sum_GBps"), 1) if f"{c}_server_sum_GBps" in r else ""])
    out = table(["codec", "compress", "decompress", "numpy compress", "bytes out / in", "with error feedback",
                 "of its memory bound", "of the generic wrapper", "server sum"], rows)
    out += ["", f"GB/s of float32 input, {r.get('elements', 0) / 2 ** 20:g}M elements, medians; memory read "
                f"{f(r.get('read_GBps'), 1)} GB/s, write {f(r.get('write_GBps'), 1)} GB/s; a fresh process loads "
                f"every kernel from Numba's cache in {f(r.get('cache_load_s'), 2)} s."]
    return out


def render_messages(r: dict) -> list[str]:
    rows = [[label, f(1e3 * r[f"engines{n}_step_s"], 1), f(r[f"engines{n}_server_cpu_us_per_message"], 0)]
            for n, label in ((0, "sums on the I/O thread"), (2, "2 engine threads")) if f"engines{n}_step_s" in r]
    out = table(["server", "ms per step", "server CPU us per message"], rows)
    if "step_ratio_engines2_over_inline" in r:
        out += ["", f"2 engine threads / the I/O thread alone: {r['step_ratio_engines2_over_inline']:.2f}x per step."]
    return out


def render_server_round(r: dict) -> list[str]:
    dense, values = r["randomk_server_round_dense_ms"], r["randomk_server_round_values_ms"]
    return table(["random-k key, 4 MB, 2 workers", "ms per round"],
                 [["summed densely over every element", f(dense)], ["summed where its k values live", f(values)],
                  ["ratio", f"{dense / values:.0f}x"]])


def render_half_average(r: dict) -> list[str]:
    rows = table(["float16 push_pull", "ms"], [["average", f(1e3 * r["f16_average_s"], 1)],
                                               ["sum", f(1e3 * r["f16_sum_s"], 1)],
                                               ["average / sum (goal: at most 1.15x)",
                                                f"{r['f16_average_over_sum']:.2f}x"]])
    if "sum_f16_ms" not in r:  # (records before the sum kernels were timed)
        return rows
    f32 = r["sum_f32_ms"]
    return rows + [""] + table(["a round's sum, two pushes of 2M elements", "ms", "against float32"], [
        ["float32", f(f32, 3), "1.00x"],
        ["float16, the CPU's conversions", f(r["sum_f16_ms"], 3), f"{r['sum_f16_ms'] / f32:.2f}x"],
        ["float16, software conversions (before)", f(r["sum_f16_software_ms"], 3),
         f"{r['sum_f16_software_ms'] / f32:.2f}x"]])


def render_compress_host(r: dict) -> list[str]:
    codecs = [k[:-len("_stage_ms")] for k in r if k.endswith("_stage_ms")]
    return table([f"codec, error feedback on ({r['partitions']} partitions)", "host ms a step", "us a partition",
                  "launches a partition"],
                 [[c, f(r[f"{c}_stage_ms"], 2), f(r[f"{c}_us_per_partition"], 1),
                   f"{r[f'{c}_launches_per_partition']:.3g}"] for c in codecs])


def render_fused_copies(r: dict) -> list[str]:
    return table(["the transformer's 102 gradients as one group", "ms"], [
        ["new gradients: copied in, handed back as views", f(r["tfm_fused_new_gradients_ms"], 2)],
        ["gradients still in their views: no copy", f(r["tfm_fused_gradients_in_views_ms"], 2)],
        ["the copy back that the views replace", f(r["tfm_copy_back_ms"], 2)]])


LOWRANK_KEY = re.compile(r"(?P<model>[a-z]+)_r(?P<rank>\d+)_(?P<what>.+?)(_ms)?")


def render_lowrank_kernels(r: dict) -> list[str]:
    cells: dict[tuple[str, int], dict[str, float]] = {}
    for key, value in r.items():
        m = LOWRANK_KEY.fullmatch(key)
        if m:
            cells.setdefault((m["model"], int(m["rank"])), {})[m["what"]] = value
    rows = []
    for (model, rank), c in cells.items():
        pairs = [f"{f(c.get(f'{step}_numba'), 1)} / {f(c.get(f'{step}_torch'), 1)}"
                 + ("" if c.get(f"{step}_torch_ops") is None else f" ({c[f'{step}_torch_ops']:.0f} ops)")
                 for step in ("acpsgd_p_step", "acpsgd_q_step", "powersgd_step")]
        def with_ops(what: str) -> str:   # (older records did not count the ops)
            ops = c.get(f"{what}_ops")
            return f(c.get(what)) + ("" if ops is None else f" ({ops:.0f} ops)")
        rows.append([MODELS.get(model, model), str(rank), f(c.get("numba_batched")),
                     with_ops("torch_gram_schmidt"), with_ops("torch_qr"), *pairs])
    return table(["model", "rank", "orthonormalise: Numba, all matrices", "torch Gram-Schmidt", "torch QR",
                  "ACP-SGD P step: Numba / torch", "ACP-SGD Q step", "PowerSGD step"], rows) + [
        "", "Milliseconds per step, one thread, medians; the steps without communication; with the torch "
        "ops dispatched that are not views (on a GPU, a launch each; Gram-Schmidt's as a GPU batches them)."]


ADAM_KINDS = {"onebit_frozen": "OneBitAdam, frozen", "zero_one_momentum": "ZeroOneAdam, momentum step",
              "zero_one_local": "ZeroOneAdam, local step"}


def render_adam_ops(r: dict) -> list[str]:
    rows = [[label, f"{r[f'{k}_multi_ops']:.0f}", f(r[f"{k}_multi_ms"], 1), f"{r[f'{k}_per_tensor_ops']:.0f}",
             f(r[f"{k}_per_tensor_ms"], 1), f(r[f"{k}_multi_ms"] / r[f"{k}_per_tensor_ms"], 2) + "x"]
            for k, label in ADAM_KINDS.items() if f"{k}_multi_ms" in r]
    return table(["step's arithmetic", "multi-tensor: ops", "ms", "one tensor at a time: ops", "ms",
                  "multi / one at a time"], rows) + [
        "", f"{r['tensors']} tensors, {r['elements'] / 1e6:.1f}M parameters, weight decay on, without the push_pull; "
        "medians, one thread; ops: torch ops dispatched (on a GPU, a launch each)."
        + (f" On {r['device']}." if "device" in r else "")]


def render_sparse_density(r: dict) -> list[str]:
    per = r["per_density"]
    ds = sorted(per, key=float)
    rows = [["dense (ms)", *(f(1e3 * per[d]["dense"], 1) for d in ds)],
            ["rows (ms)", *(f(1e3 * per[d]["rows"], 1) for d in ds)],
            ["rows / dense", *(f(per[d]["rows"] / per[d]["dense"], 2) for d in ds)]]
    out = table(["density (per worker)", *ds], rows)
    out += ["", f"A {r['rows']:,} x {r['width']} float32 gradient, {r['workers']} workers, {r['servers']} server, "
                f"{r['link']}; rows were faster up to a density of {r['break_even_density']}."]
    return out


def render_host_floor(r: dict) -> list[str]:
    whats = list(dict.fromkeys(k.split("_", 1)[1].removesuffix("_s_per_iter") for k in r
                               if k.endswith("_s_per_iter") and k.split("_", 1)[0] in MODELS))
    rows = []
    for m in MODELS:
        base = r.get(f"{m}_compute_only_s_per_iter")
        if base:
            rows.append([MODELS[m], *(f"{f(r[k])} ({r[k] / base:.2f}x)" if (k := f"{m}_{w}_s_per_iter") in r else ""
                                      for w in whats)])
    return table(["model", *(w.replace("_", " ") for w in whats)], rows) + [
        "", "Seconds per iteration, and in brackets over compute only."]


def render_sparse(r: dict) -> list[str]:
    rows = [[label, f(r.get(f"{s}_s_per_iter")), "" if s == "gp_sparse" else f"{r.get(f'speedup_vs_{s}', 0):.1f}x"]
            for s, label in (("gp_sparse", "gradpress, the table's gradient as rows"),
                             ("gp_dense", "gradpress, dense gradient"), ("ddp", "torch DDP (gloo), dense"))
            if f"{s}_s_per_iter" in r]
    out = table(["system", "s/iter", "gp_sparse faster by"], rows)
    if "hash_imbalance" in r:
        out += ["", f"Rows per server, the busiest over the mean: {r['hash_imbalance']:.3f} under gradpress's row "
                    f"hash, {r['range_imbalance']:.3f} under contiguous ranges."]
    return out


def render_cross_barrier(r: dict) -> list[str]:
    rows = [[MODELS.get(m, m), f(r[f"{m}_plain_s_per_iter"]), f(r[f"{m}_cross_barrier_s_per_iter"]),
             f"{r[f'{m}_saving_pct']:+.1f}%"] for m in MODELS if f"{m}_plain_s_per_iter" in r]
    return table(["model", "DistributedOptimizer s/iter", "CrossBarrier s/iter", "saving"], rows)


def render_linkrate(r: dict) -> list[str]:
    rates = sorted((k.removesuffix("_Gbit_s") for k in r if k.endswith("_Gbit_s")), key=rate_order)
    return table(["link", "Gbit/s, one TCP stream"],
                 [["unshaped veth (`max`)" if k == "max" else f"tc tbf {k}", f(r[f"{k}_Gbit_s"], 2)] for k in rates])


def render_soak(r: dict) -> list[str]:
    tried = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in r.get("tried", {}).items())
    rss = ", ".join(f"{k} {r['rss_start_mb'][k]:g} MB +{v:g}" for k, v in r.get("rss_growth_mb", {}).items())
    return table(["", ""], [
        ["attack messages", f"{r['messages_tried']:,} in {r['attack_cycles']} cycles ({tried})"],
        ["push_pulls checked", f"{r['push_pulls']:,}"],
        ["wrong sums, hangs, crashes", f"{r['wrong_sums']}, {r['hangs']}, {r['crashes']}"],
        ["peers cut off (log lines)", str(r.get("cut_off_lines", "n/a"))],
        ["resident memory, start and growth", rss]])


GPU_SYSTEMS = ("compute", "gp_none", "gp_none_gil200", "gp_none_apart", "gp_fp16", "gp_onebit", "gp_onebit_gil200",
               "gp_onebit_fused", "gp_topk", "gp_topk_fused", "gp_randomk", "gp_dithering", "gp_powersgd", "gp_acpsgd",
               "gp_auto", "ddp_gloo", "ddp_gloo_powersgd", "ddp_nccl", "ddp_nccl_powersgd")


def render_gpu(r: dict) -> list[str]:
    out = []
    compute = r.get("tfm_compute_s_per_iter")
    rows = []
    # records from 2026-11-28 on: worker 0's backward pass, the call's span on the host and
    # the device's span between events around it (the host far over: kernels queued late)
    backward = any(k.endswith("_backward_host_s") for k in r)
    for system in GPU_SYSTEMS:
        s = r.get(f"tfm_{system}_s_per_iter")
        if s is None:
            continue
        predicted = r.get(f"tfm_{system}_predicted_s")
        rows.append([f"`{system}`", f(s, 4), f"{s / compute:.1f}x" if compute else "n/a",
                     f(predicted, 4) if predicted is not None else ""] +
                    ([f(r.get(f"tfm_{system}_backward_host_s"), 4), f(r.get(f"tfm_{system}_backward_device_s"), 4)]
                     if backward else []))
    if rows:
        out += table(["transformer, 2 workers on one GPU", "s/step", "of compute only", "planner's prediction"] +
                     (["backward, host s", "backward, device s"] if backward else []), rows)
    codecs = [c for c in ("onebit", "topk", "randomk", "fp16") if f"{c}_GBps" in r]
    if codecs:
        if out:
            out.append("")
        out += table(["encoder, error feedback on, payload to host", "GB/s of input", "of the card's read",
                      "torch's own, GB/s", "against torch's"],
                     [[c, f(r[f"{c}_GBps"], 1), f(r.get(f"{c}_over_card_read"), 4), f(r.get(f"{c}_torch_GBps"), 1),
                       f"{r[f'{c}_over_torch']:.3f}x"] for c in codecs])
    kinds = [k for k in ("pageable", "torch_pinned", "own_chunk", "peer_chunk", "peer_chunk_unregistered")
             if f"d2h_{k}_GBps" in r]
    if kinds:
        out += ([""] if out else []) + table(
            [f"a {r.get('copies_MB', 0):.0f} MB partition, GB/s", "device to host", "host to device"],
            [[k.replace("_", " "), f(r[f"d2h_{k}_GBps"], 1), f(r[f"h2d_{k}_GBps"], 1)] for k in kinds])
    stages = [c for c in ("onebit", "topk", "randomk", "fp16") if f"{c}_compress_stage_ms" in r]
    if stages:
        header = [f"compress stage of the {r.get('tfm_tensors', 102)} gradients, error feedback on", "ms per step"]
        if "tfm_job_partitions" in r:  # records from 2026-11-27 on: what the job itself compresses
            header.append(f"as the job: its {r['tfm_job_partitions']} partitions of the {r['tfm_job_tensors']} "
                          f"gradients of {r['tfm_job_min_compress_bytes']} bytes or more, ms")
        rows = [[c, f(r[f"{c}_compress_stage_ms"], 1)] + ([f(r.get(f"{c}_job_compress_stage_ms"), 1)]
                                                          if len(header) > 2 else []) for c in stages]
        if "dithering_job_compress_stage_ms" in r:
            rows.append(["dithering", "", f(r["dithering_job_compress_stage_ms"], 1)])
        for c in ("onebit", "topk", "randomk", "fp16", "dithering"):  # each gradient's partitions at once
            if f"{c}_job_together_compress_stage_ms" in r:
                rows.append([f"{c}, partitions together", "", f(r[f"{c}_job_together_compress_stage_ms"], 1)])
        for c in ("onebit", "topk", "randomk", "fp16", "dithering"):  # GRADPRESS_FUSE_COMPRESSED_BYTES
            if f"{c}_job_fused_compress_stage_ms" in r:
                rows.append([f"{c}, gradients fused ({r['tfm_job_fused_buckets']} buckets)", "",
                             f(r[f"{c}_job_fused_compress_stage_ms"], 1)])
        out += ([""] if out else []) + table(header, rows)
    notes = [f"{r.get('card', 'GPU not recorded')}, {r.get('gpus', 1)} GPU(s)"]
    if "card_read_GBps" in r:
        notes.append(f"read {f(r['card_read_GBps'], 0)} GB/s and a pinned device-to-host copy "
                     f"{f(r.get('card_d2h_pinned_GBps'), 1)} GB/s in the same run")
    if "fastest_gp_over_ddp_gloo" in r:
        notes.append(f"fastest gradpress setting / DDP over gloo: {r['fastest_gp_over_ddp_gloo']:.2f}x")
    return out + ["", "; ".join(notes) + "."]


def render_gpu_encoders(r: dict) -> list[str]:
    """A GPU record's encoders and copies alone (its jobs are another block's)."""
    parts = ("card", "gpus", "card_", "onebit_", "topk_", "randomk_", "fp16_", "copies_MB", "d2h_", "h2d_")
    return render_gpu({k: v for k, v in r.items() if k.startswith(parts) and not k.endswith("_compress_stage_ms")})


def render_curve_threads(r: dict) -> list[str]:
    counts = sorted({int(k[2:].split("_")[0]) for k in r if k.endswith("_server_GBps")})
    rows = [[str(n), f(r[f"io{n}_server_GBps"], 2), f"{r[f'io{n}_over_io{counts[0]}']:.2f}x"] for n in counts]
    mine = r.get("worker_io_threads", "same")  # older runs gave every process the same count
    who = "I/O threads (every process)" if mine == "same" else f"the server's I/O threads (each worker {mine})"
    header = [who, "server GB/s, in and out", f"against {counts[0]}"]
    if any(f"io{n}_busy_cores" in r for n in counts):  # how much of the machine the run used
        header.append(f"cores busy, of {r['cores']}")
        for row, n in zip(rows, counts):
            row.append(f(r.get(f"io{n}_busy_cores"), 1))
    if any(f"io{n}_one_endpoint_server_GBps" in r for n in counts):  # lanes against one endpoint
        header += ["one endpoint, GB/s", "lanes / one endpoint"]
        for row, n in zip(rows, counts):
            one = r.get(f"io{n}_one_endpoint_server_GBps")
            row += [f(one, 2), f"{r[f'io{n}_server_GBps'] / one:.2f}x"] if one else ["", ""]
    # runs before the option sent each tensor as one 64 MiB partition
    parts = f"partitions of {r.get('partition_bytes', 64 << 20) / 1e6:g} MB"
    return table(header, rows) + [
        "", f"{r['workers']} workers and 1 server on {r['cores']} cores, a {r['tensor_MB']:g} MB float32 tensor in "
            f"{parts}, CURVE over loopback TCP."]


def render_hierarchy(r: dict) -> list[str]:
    rows = []
    for model in ("mlp", "tfm"):
        for system in ("gp_none", "gp_onebit", "gp_auto"):
            local, flat = r.get(f"{model}_{system}_local_s_per_iter"), r.get(f"{model}_{system}_flat_s_per_iter")
            if local is None and flat is None:
                continue
            ml, mf = (r.get(f"{model}_{system}_{k}_machine_MB_per_iter") for k in ("local", "flat"))
            rows.append([MODELS[model], f"`{system}`", f(local), f(flat),
                         f"{local / flat:.2f}x" if local and flat else "n/a", f(ml, 1), f(mf, 1),
                         f"{ml / mf:.2f}x" if ml and mf else "n/a"])
        ddp = r.get(f"{model}_ddp_s_per_iter")
        if ddp is not None:
            rows.append([MODELS[model], "`ddp` (gloo, 8 workers)", f(ddp), "", "",
                         f(r.get(f"{model}_ddp_machine_MB_per_iter"), 1), "", ""])
    out = table(["model", "system", "local s/iter", "flat s/iter", "local / flat", "machine MB/iter, local",
                 "flat", "local / flat"], rows)
    compute = [f"{MODELS[m]} {f(r[f'{m}_compute_only_s_per_iter'])}" for m in ("mlp", "tfm")
               if f"{m}_compute_only_s_per_iter" in r]
    return out + ["", f"2 machines of 4 workers, 2 servers, 1 Gbit/s links; compute only (8 processes at once): "
                      f"{', '.join(compute)} s/iter."]


def render_any(r: dict) -> list[str]:
    """Any other benchmark: its RESULT as it is, one figure a row."""
    def flat(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    return table(["figure", "value"], [[f"`{k}`", f"{v:g}" if isinstance(v, float) else str(v)] for k, v in flat(r)])


RENDERERS: dict[str, Callable[[dict], list[str]]] = {
    "bandwidth": render_bandwidth, "pushpull": render_pushpull, "pushpull-curve-cost": render_pushpull_curve,
    "kernels": render_kernels, "messages": render_messages, "server_round": render_server_round,
    "half_average": render_half_average, "fused_copies": render_fused_copies,
    "lowrank_kernels": render_lowrank_kernels, "lowrank_kernels_gpu": render_lowrank_kernels,
    "sparse_density": render_sparse_density, "adam_ops": render_adam_ops, "adam_ops_gpu": render_adam_ops,
    "host_floor": render_host_floor, "sparse": render_sparse, "cross_barrier": render_cross_barrier,
    "linkrate": render_linkrate, "soak": render_soak, "gpu": render_gpu, "curve_threads": render_curve_threads,
    "curve_threads-lanes": render_curve_threads,
    "hierarchy": render_hierarchy, "compress_host": render_compress_host,
}


# a folder whose block shows part of its benchmark's record
FOLDER_RENDERERS: dict[str, Callable[[dict], list[str]]] = {"gpu-encoders": render_gpu_encoders}


# -- the README's headline ratios ----------------------------------------------------------------

def record_of(folder: str) -> dict:
    return results.latest(RESULTS / folder)[1]


def headline_row(what: str, folder: str, mine: str, theirs: str, label: str) -> list[str]:
    """gradpress's figure ``mine`` against the baseline's ``theirs`` in one record: how many
    times faster (seconds: theirs / mine; GB/s: mine / theirs)."""
    rec = record_of(folder)
    r = rec["result"]
    x = r[mine] / r[theirs] if mine.endswith("GBps") else r[theirs] / r[mine]
    digits = 1 if max(x, 1 / x) >= 10 else 2
    text = f"**{x:.{digits}f}x faster**" if x >= 1 else f"**{1 / x:.{digits}f}x slower**"
    return [what, label, text, f"{rec['date'][:10]}, {machine_text(rec['machine'])}"]


HEADLINES = (  # what gradpress ran, the folder, gradpress's key, the baseline's key, the baseline
    ("push_pull of 100 MB, loopback, 2 workers", "pushpull", "pushpull_GBps", "gloo_GBps", "gloo all_reduce"),
    ("MLP at 100 Mbit/s, two-way onebit", "bandwidth-all-rates", "100mbit_mlp_gp_onebit_s_per_iter",
     "100mbit_mlp_ddp_s_per_iter", "DDP"),
    ("MLP at 100 Mbit/s, random-k (333x against fp16)", "bandwidth-all-rates", "100mbit_mlp_gp_randomk_s_per_iter",
     "100mbit_mlp_ddp_powersgd_s_per_iter", "DDP + PowerSGD"),
    ("MLP at 1 Gbit/s, ACP-SGD rank 1", "bandwidth-lowrank-mlp", "1gbit_mlp_gp_acpsgd_s_per_iter",
     "1gbit_mlp_ddp_powersgd_s_per_iter", "DDP + PowerSGD rank 1"),
    ("transformer at 1 Gbit/s, `compressor: auto`", "bandwidth", "1gbit_tfm_gp_auto_s_per_iter",
     "1gbit_tfm_ddp_s_per_iter", "DDP"),
    ("transformer unshaped, uncompressed, `GRADPRESS_SECURITY=auth`", "bandwidth-security",
     "max_tfm_gp_none_auth_s_per_iter", "max_tfm_ddp_s_per_iter", "DDP"),
    ("embedding table of 1M rows, 1 Gbit/s", "sparse", "gp_sparse_s_per_iter", "ddp_s_per_iter", "DDP"),
)


def render_headline() -> list[str]:
    """The README's table: each row within one run, on the machine it names."""
    return table(["gradpress", "against", "result", "measured"], [headline_row(*row) for row in HEADLINES])


# -- the pages -----------------------------------------------------------------------------------

def render_block(folder: str) -> str:
    if folder == "headline":
        return "\n".join(render_headline()) + "\n"
    path, rec = results.latest(RESULTS / folder)
    lines = (FOLDER_RENDERERS.get(folder) or RENDERERS.get(rec["benchmark"], render_any))(rec["result"])
    head = provenance(rec)
    if len(lines) > 2 and lines[-2] == "" and not lines[-1].startswith("|"):  # a note on the table
        head, lines = f"{head} {lines[-1]}", lines[:-2]
    return "\n".join([head, "", *lines]) + "\n"


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda m: m[1] + render_block(m["folder"]) + m[4], text)


def stale(page: Path) -> list[str]:
    """The folders whose table in ``page`` differs from its latest record, or that hold none."""
    def differs(folder: str, body: str) -> bool:
        try:
            return body != render_block(folder)
        except FileNotFoundError:
            return True
    return [m["folder"] for m in BLOCK.finditer(page.read_text()) if differs(m["folder"], m["body"])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table is stale")
    args = p.parse_args()
    bad = 0
    for page in PAGES:
        if args.check:
            for folder in stale(page):
                print(f"{page.relative_to(REPO)}: the table of benchmarks/results/{folder} is stale")
                bad += 1
        else:
            text = page.read_text()
            new = rewrite(text)
            if new != text:
                page.write_text(new)
                print(f"rewrote {page.relative_to(REPO)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
