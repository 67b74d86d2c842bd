"""Who is measuring what: MPI rank, batch job, host id, file names and output directories.

Files are named as hpcrun names them (formats.md §0.1):
``<exe>-<rank:06d>-<thread:03d>-<hostid:08x>-<pid>-<gen>.hpcrun``. The MPI rank comes from the
launcher's environment (Slurm, PMI, PMIx, Open MPI, MPICH, MVAPICH, Cray PALS) or, once the
program has initialised it, from mpi4py. Every function takes the environment as an argument so
tests can simulate launchers. Imported into every measured process: standard library only.
"""

from __future__ import annotations

import os
import sys
import zlib

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Environment variables holding the MPI rank, in the order they are trusted.
RANK_VARIABLES: tuple[str, ...] = (
    "OMPI_COMM_WORLD_RANK",  # Open MPI
    "PMIX_RANK",  # PMIx (Open MPI 5, Slurm --mpi=pmix)
    "PMI_RANK",  # PMI-1/2: MPICH hydra, Intel MPI, Slurm --mpi=pmi2
    "MV2_COMM_WORLD_RANK",  # MVAPICH
    "PALS_RANKID",  # Cray PALS
    "SLURM_PROCID",  # srun, with or without MPI
    "FLUX_TASK_RANK",  # Flux
)

#: Environment variables holding the batch job id (hpcrun's ``job-id`` header nv-pair).
JOB_VARIABLES: tuple[str, ...] = (
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "COBALT_JOBID",
    "FLUX_JOB_ID",
    "JOB_ID",  # Grid Engine
)

#: Variables that name one launch of many ranks (shared by every rank of that launch).
LAUNCH_VARIABLES: tuple[str, ...] = (
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "PMI_KVSNAME",
)


def rank_from_env(env: Mapping[str, str]) -> int | None:
    """The MPI rank the launcher gave this process, or None outside a parallel launch."""
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def rank_from_mpi4py() -> int | None:
    """The rank mpi4py reports, when the program imported it and MPI is initialised."""
    module = sys.modules.get("mpi4py.MPI")
    if module is None:
        return None
    try:
        mpi: object = module
        if not mpi.Is_initialized() or mpi.Is_finalized():  # type: ignore[attr-defined]
            return None
        rank = mpi.COMM_WORLD.Get_rank()  # type: ignore[attr-defined]
    except Exception:  # mpi4py in a strange state: the environment is the fallback
        return None
    return int(rank)


def job_id_from_env(env: Mapping[str, str]) -> str:
    """The batch job id (``""`` outside a batch system), as hpcrun's ``job-id`` nv-pair."""
    for name in JOB_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value
    return ""


def launch_key(env: Mapping[str, str]) -> str:
    """A name shared by every rank of one parallel launch and by no other launch, or ``""``.

    Under Slurm it is ``JOBID.STEPID`` (two ``srun`` steps of one job are two runs); under other
    launchers the PMIx namespace or Open MPI job id; under a rank-setting launcher with none of
    those (MPICH's hydra) the id of the launcher's proxy, our parent.
    """
    job = env.get("SLURM_JOB_ID", "").strip()
    if job and env.get("SLURM_STEP_ID", "").strip():
        return f"{job}.{env['SLURM_STEP_ID'].strip()}"
    for name in LAUNCH_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return "".join(c if c.isalnum() or c in "._-" else "_" for c in value)
    if rank_from_env(env) is not None:
        job = job_id_from_env(env)
        return f"{job}.{os.getppid()}" if job else f"launch{os.getppid()}"
    return ""


def launch_key_is_per_node(env: Mapping[str, str]) -> bool:
    """Whether :func:`launch_key` had to name the launch after this node's launcher proxy.

    MPICH's hydra exports no launch id, so its ranks on different nodes get different keys.
    """
    if env.get("SLURM_JOB_ID", "").strip() and env.get("SLURM_STEP_ID", "").strip():
        return False
    if any(env.get(name, "").strip() for name in LAUNCH_VARIABLES):
        return False
    return rank_from_env(env) is not None


def host_id() -> int:
    """A 32-bit id of this host (hpcrun's ``host-id``).

    hpcrun calls ``gethostid()``; glibc's version may resolve the host name over DNS, which must
    never stall a measured program, so pyrun reads ``/etc/hostid`` like glibc and otherwise hashes
    the host name.
    """
    try:
        with open("/etc/hostid", "rb") as stream:
            raw = stream.read(4)
        if len(raw) == 4:
            return int.from_bytes(raw, sys.byteorder)
    except OSError:
        pass
    return zlib.crc32(os.uname().nodename.encode("utf-8", "replace")) & 0xFFFFFFFF


def file_stem(exe: str, rank: int, thread: int, hostid: int, pid: int, generation: int) -> str:
    """``<exe>-<rank>-<thread>-<hostid>-<pid>-<gen>`` (formats.md §0.1)."""
    return f"{exe}-{rank:06d}-{thread:03d}-{hostid:08x}-{pid}-{generation}"


def program_name(command: list[str] | tuple[str, ...]) -> str:
    """The name a measurement directory is named after: a Python script's stem, else the command.

    ``python app.py`` gives ``app``; ``python -m pkg.mod`` gives ``pkg.mod``; ``./run.sh`` gives
    ``run.sh``.
    """
    if not command:
        return "program"
    first = os.path.basename(command[0])
    if first.startswith("python"):
        args = list(command[1:])
        while args:
            arg = args.pop(0)
            if arg == "-m" and args:
                return args[0]
            if arg in ("-c", "-"):
                return first
            if arg.startswith("-"):
                if arg in ("-W", "-X", "--check-hash-based-pycs"):
                    args = args[1:]
                continue
            stem = os.path.basename(arg)
            return stem[:-3] if stem.endswith(".py") else stem
    return first or "program"


def default_output_dir(command: list[str] | tuple[str, ...], env: Mapping[str, str]) -> str:
    """hpcrun's default, ``hpctoolkit-<name>-measurements[-<job>]``, relative to the cwd.

    Under a parallel launch the name carries the launch key so every rank of the launch writes
    into one directory; outside one, :func:`fresh_directory` keeps runs apart.
    """
    name = f"hpctoolkit-{program_name(command)}-measurements"
    key = launch_key(env)
    if key:
        return f"{name}-{key}"
    job = job_id_from_env(env)
    return f"{name}-{job}" if job else name


def fresh_directory(base: str) -> str:
    """Create and return ``base``, or ``base-2``, ``base-3``... whichever does not exist yet.

    ``os.mkdir`` is atomic, so two runs started at once never share a directory.
    """
    candidate = base
    suffix = 1
    while True:
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            suffix += 1
            candidate = f"{base}-{suffix}"
