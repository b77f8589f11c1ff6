"""Real services for the tests, started from Debian's packages in a temporary folder of their own and
stopped after: a PostgreSQL server on 127.0.0.1 (`postgresql`) and a single-node Slurm cluster on
localhost (`slurm-wlm`, `munge`); on the hosts of benchmark/hosts.py, a PostgreSQL server on node1 and a
Slurm cluster of every host (`slurm_on_hosts`). .ci/run installs the packages; where they are missing
(or the tests do not run as root, which the daemons here need), the tests that use them skip and say why.

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
def postgresql_server(cluster=None):
    """A PostgreSQL server with a database `optuna`; yields its URL: on 127.0.0.1, or, given a
    benchmark/hosts.py cluster, inside its host node1, listening on node1's address for every host
    (postgresql://postgres@node1:5432/optuna). The server refuses to run as root: it runs as the `postgres`
    user that Debian's package creates, in a folder that user owns (outside the hosts' disks, whose
    parent folders only root may enter)."""
    bin_dir = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(path.split("/")[-2]))[-1]
    user = pwd.getpwnam("postgres")
    folder = tempfile.mkdtemp(prefix="cleanrl-postgresql-")
    os.chown(folder, user.pw_uid, user.pw_gid)
    data = os.path.join(folder, "data")
    host, port = ("127.0.0.1", free_port()) if cluster is None else (cluster.address(1), 5432)

    def as_postgres(*command: str):
        command = ["runuser", "-u", "postgres", "--", *command]
        if cluster is not None:
            command = cluster.command(1, command)
        subprocess.run(command, check=True, capture_output=True, text=True)

    try:
        as_postgres(f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        if cluster is not None:  # initdb trusts only local connections: let every host in
            with open(os.path.join(data, "pg_hba.conf"), "a") as f:
                f.write(f"host all all {cluster.address(0)}/24 trust\n")
        # fsync off: a test database need not survive a power cut, and it saves seconds per test
        options = f"-p {port} -k {data} -c listen_addresses={host} -c fsync=off -c max_connections=50"
        as_postgres(f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l", f"{folder}/server.log", "-w", "start")
        as_postgres(f"{bin_dir}/createdb", "-h", host, "-p", str(port), "optuna")
        yield f"postgresql://postgres@{host if cluster is None else 'node1'}:{port}/optuna"
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


def slurm_on_hosts_missing() -> str | None:
    """Why no Slurm cluster of benchmark/hosts.py hosts can be started here, or None (the hosts' own reasons
    are make_hosts')."""
    if reason := slurm_missing():
        return reason
    if not os.path.isdir("/sys/fs/cgroup/systemd"):
        return "slurmd inside a host mounts the machine's cgroup-v1 hierarchy name=systemd, and this machine has none"
    return None


def memory_mib() -> int:
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return total_kib // 1024


SLURM_CONF = """\
ClusterName=cleanrl-test
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={controller_port}
SlurmdPort={node_port}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket,cred_expire={cred_expire}
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
{settings}{nodes}PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


def write_slurm_files(folder: str, controller: str, nodes: dict[str, str], cpus: int, ports=(6817, 6818), **options):
    """slurm.conf (see SLURM_CONF), the folders it names and a munge key (1 KiB of random bytes, mode 400) in
    `folder`: nodes {name: address}, each with `cpus` cores and 3/4 of this machine's memory; `options`:
    cred_expire (seconds; also how long a requeued job waits before it starts again, default 120) and other
    slurm.conf settings (SlurmdTimeout=10, ...)."""
    for name in ("state", "spool"):
        os.makedirs(os.path.join(folder, name), exist_ok=True)
    key = os.path.join(folder, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    memory = memory_mib() * 3 // 4
    with open(os.path.join(folder, "slurm.conf"), "w") as f:
        f.write(
            SLURM_CONF.format(
                controller=controller,
                folder=folder,
                controller_port=ports[0],
                node_port=ports[1],
                cred_expire=options.pop("cred_expire", 120),
                settings="".join(f"{name}={value}\n" for name, value in options.items()),
                nodes="".join(
                    f"NodeName={name} NodeAddr={address} CPUs={cpus} RealMemory={memory} State=UNKNOWN\n"
                    for name, address in nodes.items()
                ),
                node_names=",".join(nodes),
            )
        )


def munged_command(folder: str, *options: str) -> list[str]:
    return [
        shutil.which("munged", path=f"{os.environ.get('PATH', '')}:/usr/sbin"),
        f"--key-file={folder}/munge.key",
        f"--socket={folder}/munge.socket",
        f"--pid-file={folder}/munged.pid",
        f"--log-file={folder}/munged.log",
        f"--seed-file={folder}/munged.seed",
        "--force",
        *options,
    ]


def wait_until_idle(sinfo, nodes: int, logs: list[str], timeout: float = 60):
    """Returns once `sinfo(["sinfo", ...])` (a CompletedProcess) shows `nodes` idle nodes; else raises, with the
    logs' ends."""
    deadline = time.time() + timeout
    while True:
        state = sinfo(["sinfo", "-h", "-N", "-o", "%T"])
        if state.stdout.split() == ["idle"] * nodes:
            return
        if time.time() > deadline:
            ends = "".join(f"{log}:\n{open(log).read()[-2000:]}" for log in logs if os.path.exists(log))
            shown = state.stdout.strip() or state.stderr.strip()
            raise RuntimeError(f"the Slurm nodes are {shown!r}, not {nodes} idle:\n{ends}")
        time.sleep(0.5)


@contextlib.contextmanager
def slurm_cluster():
    """munged, slurmctld and slurmd on this machine, all in one temporary folder (short: the munge socket's
    path must fit in a Unix socket address); yields the environment that points Slurm's commands at it
    ({"SLURM_CONF": ...}). Slurm runs a job's steps with the environment of its sbatch call."""
    folder = tempfile.mkdtemp(prefix="slurm-", dir="/tmp")
    host = platform.node().split(".")[0]
    write_slurm_files(
        folder, f"{host}(127.0.0.1)", {host: "127.0.0.1"}, cpus=os.cpu_count(), ports=(free_port(), free_port())
    )
    conf = os.path.join(folder, "slurm.conf")
    environment = {**os.environ, "SLURM_CONF": conf}
    sbin = f"{os.environ.get('PATH', '')}:/usr/sbin"
    pid_files = [os.path.join(folder, name) for name in ("slurmd.pid", "slurmctld.pid", "munged.pid")]
    try:
        subprocess.run(munged_command(folder), check=True, capture_output=True)
        subprocess.run([shutil.which("slurmctld", path=sbin), "-c"], env=environment, check=True, capture_output=True)
        subprocess.run([shutil.which("slurmd", path=sbin)], env=environment, check=True, capture_output=True)
        wait_until_idle(
            lambda argv: subprocess.run(argv, env=environment, capture_output=True, text=True),
            nodes=1,
            logs=[os.path.join(folder, log) for log in ("slurmctld.log", "slurmd.log")],
        )
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


def local_folder(cluster) -> str:
    """A folder at the same path on every host of a benchmark/hosts.py cluster, on each host its own disk
    (ROOT/local, inside host I the folder ROOT/nodeI): what a cluster without a shared filesystem has in
    /home or /scratch, one path and a different disk behind it on every node. Outside the hosts it does
    not exist. Commands see it when started through `on_host`."""
    return os.path.join(cluster.root, "local")


def on_host(cluster, i: int, argv: list[str], cwd: str | None = None) -> list[str]:
    """argv for cluster.run or cluster.popen on host I, with the host's disk also at local_folder(cluster),
    run in cwd (default: that folder). The processes it starts (a daemon's jobs too) see the same."""
    bind = 'mkdir -p "$ROOT/local" && mount --bind "$DISK" "$ROOT/local" && cd "$1" && shift && exec "$@"'
    return ["sh", "-c", bind, "sh", cwd or local_folder(cluster), *argv]


class SlurmOnHosts:
    """What slurm_on_hosts yields: `run(argv)` runs a Slurm command (sbatch, squeue, srun...) on node1."""

    def __init__(self, cluster, environment: dict):
        self.cluster, self.environment = cluster, environment

    def run(self, argv: list[str], cwd=None, host: int = 1, env: dict | None = None, **kwargs):
        """argv on host I (default node1) in cwd (default: local_folder), with Slurm's environment and `env`;
        a job submitted from there runs with that environment too. Returns the CompletedProcess (text)."""
        command = on_host(self.cluster, host, argv, None if cwd is None else str(cwd))
        kwargs = {"capture_output": True, "text": True, "timeout": 60, **kwargs}
        return self.cluster.run(host, command, env={**os.environ, **self.environment, **(env or {})}, **kwargs)

    def log(self, host: int, daemon: str = "slurmd") -> str:
        """The end of a daemon's log (slurmd, slurmctld, munged) on host I, read from outside."""
        path = os.path.join(self.cluster.disk(host), "slurm", f"{daemon}.log")
        return open(path).read()[-3000:] if os.path.exists(path) else f"(no {path})"

    def logs(self) -> str:
        """slurmctld's log and every slurmd's, their ends."""
        daemons = [(1, "slurmctld")] + [(i, "slurmd") for i in range(1, self.cluster.n + 1)]
        return "".join(f"\n--- node{i}'s {daemon}.log:\n{self.log(i, daemon)}" for i, daemon in daemons)


@contextlib.contextmanager
def slurm_on_hosts(cluster, cpus: int = 1, **options):
    """A Slurm cluster of every host of a benchmark/hosts.py cluster: slurmctld on node1, and on every host
    its own munged (all with one key) and slurmd (NodeName=nodeI NodeAddr=198.18.0.I, `cpus` cores each),
    each daemon started inside its host. Every host keeps its own copy of slurm.conf, the key, the munge
    socket, the spool and the logs in its own disk's slurm/ folder, at one path on every host
    (local_folder; Slurm's commands and each host's daemons use the same slurm.conf). `options`: see
    write_slurm_files (cred_expire, SlurmdTimeout, KillWait...). Yields a SlurmOnHosts."""
    shared = tempfile.mkdtemp(prefix="slurm-hosts-")  # one slurm.conf and one key, copied to every host
    nodes = {f"node{i}": cluster.address(i) for i in range(1, cluster.n + 1)}
    folder = os.path.join(local_folder(cluster), "slurm")
    write_slurm_files(shared, f"node1({cluster.address(1)})", nodes, cpus, **options)
    with open(os.path.join(shared, "slurm.conf")) as f:
        conf = f.read().replace(shared, folder)
    # the longest Unix socket made there: slurmstepd's, one per job step (NODE_JOBID.STEPID, ids up to 2**32)
    socket = f"{folder}/spool/node{cluster.n}_{2**32}.{2**32}"
    if len(socket) >= 108:
        raise RuntimeError(f"{socket} is too long for a Unix socket address: give the hosts a shorter root")
    slurm = SlurmOnHosts(cluster, {"SLURM_CONF": f"{folder}/slurm.conf"})
    sbin = f"{os.environ.get('PATH', '')}:/usr/sbin"
    daemons = []

    def start(i: int, argv: list[str]):
        environment = {**os.environ, **slurm.environment}
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # each writes its log file
        daemons.append(cluster.popen(i, on_host(cluster, i, argv), env=environment, **quiet))

    try:
        for i in range(1, cluster.n + 1):
            own = os.path.join(cluster.disk(i), "slurm")
            shutil.copytree(shared, own)
            with open(os.path.join(own, "slurm.conf"), "w") as f:
                f.write(conf)
            start(i, munged_command(folder, "--foreground"))
        time.sleep(0.5)  # the munge sockets, before the daemons that need them
        start(1, [shutil.which("slurmctld", path=sbin), "-D", "-c"])
        # `ip netns exec` mounts a sysfs of the host's own, without the machine's cgroup mounts, and slurmd
        # stops where it finds no cgroup filesystem, even with plugins that use none (proctrack/linuxproc):
        # the machine's cgroup-v1 hierarchy name=systemd, mounted again inside the host (nothing changes in it)
        cgroups = (
            "mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd"
            ' && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && exec "$@"'
        )
        for i in range(1, cluster.n + 1):
            start(i, ["sh", "-c", cgroups, "sh", shutil.which("slurmd", path=sbin), "-D"])
        logs = [os.path.join(cluster.disk(1), "slurm", "slurmctld.log")]
        logs += [os.path.join(cluster.disk(i), "slurm", "slurmd.log") for i in range(1, cluster.n + 1)]
        wait_until_idle(slurm.run, nodes=cluster.n, logs=logs)
        yield slurm
    finally:
        # slurmd first, then slurmctld, then munged: a slurmd that lost its munged waits long to stop
        for stage in (daemons[cluster.n + 1 :], daemons[cluster.n : cluster.n + 1], daemons[: cluster.n]):
            for daemon in stage:
                daemon.terminate()
            for daemon in stage:
                try:
                    daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
        shutil.rmtree(shared, ignore_errors=True)


def wait_for_slurm_jobs(environment: dict, timeout: float, run=None, logs=None) -> None:
    """Returns when Slurm has no job left in its queue (every array task has ended). `run(argv)` runs squeue
    (default: here, with `environment`; SlurmOnHosts.run for a cluster of hosts). On a timeout it raises with
    the queue, the nodes and `logs()` (the daemons' logs' ends), which say why a job waits."""
    run = run or (lambda argv: subprocess.run(argv, env={**os.environ, **environment}, capture_output=True, text=True))
    deadline = time.time() + timeout
    while time.time() < deadline:
        queue = run(["squeue", "-h", "-o", "%i %T %r"])
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        time.sleep(1)
    nodes = run(["sinfo", "-N", "-o", "%N %T %E"])
    raise AssertionError(
        f"Slurm jobs still queued or running after {timeout} s (job, state, reason):\n{queue.stdout}{queue.stderr}"
        f"nodes:\n{nodes.stdout}{nodes.stderr}{logs() if logs else ''}"
    )
