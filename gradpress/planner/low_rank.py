"""A low-rank option (powersgd, acpsgd) in a plan: the job as the simulator sees it then.

Matrices that travel as factors leave the backward timeline: ``torch/lowrank.py`` reduces
them all together once backward has ended, on the training thread. So the plan is
simulated on a derived profile: the other tensors as profiled; the factor work of every
chosen matrix added to the end of backward (and to the host's training CPU); one raw tensor of all their factors, ready
then, with the lowest priority (it travels alone and uncompressed: servers sum factors
exactly); and the reconstruction of the averages added to the optimizer's step.
PowerSGD's two rounds per step are counted as one tensor of both factors (its second
round's latency is left out).
"""
from __future__ import annotations

from dataclasses import replace

from .profile import Profile, TensorProfile

FACTORS = "(low-rank factors)"


def eligible(profile: Profile, option: str, min_compress_bytes: int) -> tuple[int, ...]:
    """Indices of the tensors ``option`` would send as factors."""
    cost = profile.codecs[option]
    return tuple(i for i, t in enumerate(profile.tensors)
                 if t.nbytes >= min_compress_bytes and cost.factors(t.rows, t.cols))


def derived(profile: Profile, option: str, chosen: tuple[int, ...]) -> tuple[Profile, list[int]]:
    """The profile without the ``chosen`` matrices and with their factors as one last tensor,
    and for each of its tensors but the last, its index in ``profile``."""
    cost = profile.codecs[option]
    picked = set(chosen)
    kept = [i for i in range(len(profile.tensors)) if i not in picked]
    matrices = [profile.tensors[i] for i in chosen]
    work = sum(cost.compress(t.nbytes) for t in matrices)
    rebuild = sum(cost.decompress(t.nbytes) for t in matrices)
    factor_bytes = 4 * round(sum(cost.factor_bytes(t.rows, t.cols) for t in matrices) / 4)
    end = profile.backward_end_s + work
    lowest = min(t.priority for t in profile.tensors) - 1
    tensors = tuple(profile.tensors[i] for i in kept) + (TensorProfile(FACTORS, factor_bytes, end, lowest),)
    # the factor work and the reconstruction are the training thread's CPU too
    host = profile.host and replace(profile.host, train_cpu_s=profile.host.train_cpu_s + work + rebuild)
    return replace(profile, tensors=tensors, backward_end_s=end, step_s=profile.step_s + rebuild, host=host), kept


def measured(profile: Profile, option: str, chosen: tuple[int, ...], work_s: float, rebuild_s: float) -> Profile:
    """The profile with ``option``'s costs scaled so that the ``chosen`` matrices' factor
    work and reconstruction take what a job measured (``work_s``, ``rebuild_s`` per step):
    the calibration ran them alone, the job runs them beside the other workers and servers."""
    cost = profile.codecs[option]
    matrices = [profile.tensors[i] for i in chosen]
    work = sum(cost.compress(t.nbytes) for t in matrices)
    rebuild = sum(cost.decompress(t.nbytes) for t in matrices)
    if work <= 0 or rebuild <= 0 or work_s <= 0 or rebuild_s <= 0:
        return profile
    cost = replace(cost, compress=cost.compress.scaled(work_s / work),
                   decompress=cost.decompress.scaled(rebuild_s / rebuild))
    notes = dict(profile.notes, factor_work_measured_s=work_s, factor_work_calibrated_s=work,
                 rebuild_measured_s=rebuild_s, rebuild_calibrated_s=rebuild)
    return replace(profile, codecs={**profile.codecs, option: cost}, notes=notes)
