"""Real services for the tests, started from Debian's packages in a temporary folder of their own and
stopped after: a PostgreSQL server on 127.0.0.1 (`postgresql`) and a single-node Slurm cluster on
localhost (`slurm-wlm`, `munge`). .ci/run installs the packages; where they are missing (or the tests
do not run as root, which the daemons here need), the tests that use them skip and say why.

Each service takes free ports and a folder of its own, so test files running in parallel (pytest-xdist)
can each start one."""

import contextlib
import glob
import os
import platform
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from running import free_port


def postgresql_missing() -> str | None:
    """Why no PostgreSQL server can be started here, or None."""
    if not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        return "no PostgreSQL server (Debian: apt-get install postgresql)"
    if os.geteuid() != 0:
        return "starting PostgreSQL as its own user needs root"
    return None


@contextlib.contextmanager
def postgresql_server():
    """A PostgreSQL server on 127.0.0.1 with a database `optuna`; yields its URL. The server refuses to run
    as root: it runs as the `postgres` user that Debian's package creates, in a folder that user owns."""
    bin_dir = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(path.split("/")[-2]))[-1]
    user = pwd.getpwnam("postgres")
    folder = tempfile.mkdtemp(prefix="cleanrl-postgresql-")
    os.chown(folder, user.pw_uid, user.pw_gid)
    data, port = os.path.join(folder, "data"), free_port()

    def as_postgres(*command: str):
        subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True, text=True)

    try:
        as_postgres(f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        # fsync off: a test database need not survive a power cut, and it saves seconds per test
        options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        as_postgres(f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l", f"{folder}/server.log", "-w", "start")
        as_postgres(f"{bin_dir}/createdb", "-h", "127.0.0.1", "-p", str(port), "optuna")
        yield f"postgresql://postgres@127.0.0.1:{port}/optuna"
    finally:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)


def slurm_missing() -> str | None:
    """Why no Slurm cluster can be started here, or None."""
    for program in ("slurmctld", "slurmd", "munged", "sbatch"):
        if shutil.which(program, path=f"{os.environ.get('PATH', '')}:/usr/sbin") is None:
            return f"no {program} (Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the single-node Slurm cluster runs its daemons as root"
    return None


def memory_mib() -> int:
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return total_kib // 1024


SLURM_CONF = """\
ClusterName=cleanrl-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={controller_port}
SlurmdPort={node_port}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def slurm_cluster():
    """munged, slurmctld and slurmd on this machine, all in one temporary folder (short: the munge socket's
    path must fit in a Unix socket address); yields the environment that points Slurm's commands at it
    ({"SLURM_CONF": ...}). Slurm runs a job's steps with the environment of its sbatch call."""
    folder = tempfile.mkdtemp(prefix="slurm-", dir="/tmp")
    host = platform.node().split(".")[0]
    for name in ("state", "spool"):
        os.makedirs(os.path.join(folder, name))
    key = os.path.join(folder, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    conf = os.path.join(folder, "slurm.conf")
    with open(conf, "w") as f:
        f.write(
            SLURM_CONF.format(
                host=host,
                folder=folder,
                controller_port=free_port(),
                node_port=free_port(),
                cpus=os.cpu_count(),
                memory=memory_mib() * 3 // 4,
            )
        )
    environment = {**os.environ, "SLURM_CONF": conf}
    sbin = f"{os.environ.get('PATH', '')}:/usr/sbin"
    pid_files = [os.path.join(folder, name) for name in ("slurmd.pid", "slurmctld.pid", "munged.pid")]
    try:
        subprocess.run(
            [
                shutil.which("munged", path=sbin),
                f"--key-file={key}",
                f"--socket={folder}/munge.socket",
                f"--pid-file={folder}/munged.pid",
                f"--log-file={folder}/munged.log",
                f"--seed-file={folder}/munged.seed",
                "--force",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run([shutil.which("slurmctld", path=sbin), "-c"], env=environment, check=True, capture_output=True)
        subprocess.run([shutil.which("slurmd", path=sbin)], env=environment, check=True, capture_output=True)
        deadline = time.time() + 60
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=environment, capture_output=True, text=True)
            if state.stdout.strip() == "idle":
                break
            if time.time() > deadline:
                logs = "".join(
                    open(os.path.join(folder, log)).read()[-2000:]
                    for log in ("slurmctld.log", "slurmd.log")
                    if os.path.exists(os.path.join(folder, log))
                )
                raise RuntimeError(
                    f"the Slurm node is {state.stdout.strip() or state.stderr.strip()!r}, not idle:\n{logs}"
                )
            time.sleep(0.5)
        yield {"SLURM_CONF": conf}
    finally:
        pids = []
        for pid_file in pid_files:  # all at once: each takes a few seconds to save its state and go
            try:
                with open(pid_file) as f:
                    pids.append(int(f.read().strip()))
                os.kill(pids[-1], signal.SIGTERM)
            except (OSError, ValueError):
                pass
        deadline = time.time() + 20
        while time.time() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
            time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_slurm_jobs(environment: dict, timeout: float) -> None:
    """Returns when Slurm has no job left in its queue (every array task has ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%i %T"], env={**os.environ, **environment}, capture_output=True, text=True
        )
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        time.sleep(1)
    raise AssertionError(f"Slurm jobs still queued or running after {timeout} s: {queue.stdout}")
