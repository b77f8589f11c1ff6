"""The ssh recipe of docs/cluster.md ("Starting nodes over ssh") on benchmark/hosts.py's hosts: sshd inside
each host on port 22, with host keys of its own on its own disk; a test user (made and removed by the test)
with a password and, on each host, a home of its own on that host's disk runs the recipe's lines on node1
as the page gives them: ssh-keygen, ssh-copy-id to both nodes, then node2's torchrun over ssh in the
background and node1's in the foreground, which train one job."""

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from running import REPO_ROOT

DOCS_PAGE = os.path.join(REPO_ROOT, "docs", "cluster.md")
# The recipe's training arguments, replaced by a tiny run's (2 processes x 2 envs x 32 steps, 3 iterations)
DOCS_ARGUMENTS = "--local-num-envs 8"
TINY = "--local-num-envs 2 --num-steps 32 --num-minibatches 2 --update-epochs 1 --total-timesteps 384"


def ssh_missing() -> str | None:
    for program in ("sshd", "ssh-keygen", "ssh-copy-id", "sshpass", "useradd", "chpasswd", "userdel", "su"):
        if shutil.which(program, path=f"{os.environ.get('PATH', '')}:/usr/sbin") is None:
            return f"no {program} (Debian: apt-get install openssh-server sshpass)"
    return None


def recipe() -> tuple[str, str]:
    """The two shell blocks of the page's ssh section: the one-time set-up, and the launch of a run."""
    section = open(DOCS_PAGE).read().split("## Starting nodes over ssh", 1)[1].split("\n## ", 1)[0]
    setup, launch = re.findall(r"```bash\n(.*?)```", section, re.S)
    return setup, launch


def reachable_by_every_user(paths: list[str]) -> str:
    """A shell command that lets every user of a host reach `paths` (this Python, its virtualenv, the
    checkout): a virtualenv made from a Python in root's home (mode 700, where pyenv installs it) is out of
    other users' reach. In the host's own mount namespace, each first folder on their way that others
    cannot enter is covered by an empty one they can, with the folders below it that lead to the paths put
    back (each staged on the host's disk while the cover goes on). `true` where nothing stops them."""
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = os.path.realpath(path).split(os.sep)
        for k in range(2, len(parts)):
            if not os.stat(os.sep.join(parts[:k])).st_mode & 0o001:
                blocked.setdefault(os.sep.join(parts[:k]), set()).add(os.sep.join(parts[: k + 1]))
                break
    commands = []
    for n, (folder, below) in enumerate(blocked.items()):
        staged = {child: f'"$DISK/.staged{n}_{m}"' for m, child in enumerate(sorted(below))}
        commands += [
            f"mkdir -p {stage} && mount --bind {shlex.quote(child)} {stage}" for child, stage in staged.items()
        ]
        commands.append(f"mount -t tmpfs -o mode=755 opened {shlex.quote(folder)}")
        commands += [
            f"mkdir -p {shlex.quote(child)} && mount --move {stage} {shlex.quote(child)}"
            for child, stage in staged.items()
        ]
    return " && ".join(commands) or "true"


def on_host(argv: list[str]) -> list[str]:
    """argv for cluster.run or cluster.popen, with the host's own /home (its disk's home/ folder: no home is
    shared between the hosts) and this Python within every user's reach."""
    home = 'mkdir -p "$DISK/home" && mount --bind "$DISK/home" /home'
    reach = reachable_by_every_user([sys.executable, sys.prefix, REPO_ROOT])
    return ["sh", "-c", f'{home} && {reach} && exec "$@"', "sh", *argv]


@pytest.fixture
def ssh_user():
    """A user with a password, home /home/NAME (each host gives it its own), removed after the test."""
    if reason := ssh_missing():
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("making a user and starting sshd need root")
    name, password = f"crlssh{secrets.token_hex(3)}", secrets.token_hex(12)
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", f"/home/{name}", "--shell", "/bin/bash", name], check=True
    )
    try:
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
        yield name, password
    finally:
        subprocess.run(["userdel", "--force", name], capture_output=True)


def start_sshd(cluster, i: int, user: str) -> subprocess.Popen:
    """sshd in host I on port 22: its host key, configuration and log in its own disk's ssh/ folder; the
    user's home there too, with the checkout and the virtualenv at ~/cleanrl-fast as the recipe has them."""
    folder = os.path.join(cluster.disk(i), "ssh")
    os.makedirs(folder)
    key = os.path.join(folder, "ssh_host_ed25519_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    config = os.path.join(folder, "sshd_config")
    with open(config, "w") as f:
        f.write(
            f"Port 22\nListenAddress {cluster.address(i)}\nHostKey {key}\nPidFile {folder}/sshd.pid\n"
            f"UsePAM no\nPasswordAuthentication yes\nKbdInteractiveAuthentication no\nPermitRootLogin no\n"
            f"AllowUsers {user}\n"
            "SetEnv OMP_NUM_THREADS=1\n"  # one thread per process, as every test runs them
        )
    uid, gid = int(subprocess.check_output(["id", "-u", user])), int(subprocess.check_output(["id", "-g", user]))
    home = os.path.join(cluster.disk(i), "home", user)
    checkout = os.path.join(home, "cleanrl-fast")
    os.makedirs(checkout)
    os.symlink(os.path.join(REPO_ROOT, "cleanrl"), os.path.join(checkout, "cleanrl"))
    os.symlink(sys.prefix, os.path.join(checkout, ".venv"))
    for path in (home, checkout):
        os.chown(path, uid, gid)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder (the package's)
    log = os.path.join(folder, "sshd.log")
    sshd = cluster.popen(i, on_host(["/usr/sbin/sshd", "-D", "-f", config, "-E", log]))
    deadline = time.time() + 20
    while f"Server listening on {cluster.address(i)} port 22" not in (open(log).read() if os.path.exists(log) else ""):
        assert sshd.poll() is None and time.time() < deadline, open(log).read() if os.path.exists(log) else "no log"
        time.sleep(0.1)
    return sshd


def test_the_docs_ssh_recipe_copies_the_key_to_both_nodes_and_launches_one_job_from_node1(ssh_user, make_hosts):
    user, password = ssh_user
    cluster = make_hosts(2)
    for i in (1, 2):
        start_sshd(cluster, i, user)
    setup, launch = recipe()
    assert "ssh-copy-id me@node1" in setup and DOCS_ARGUMENTS in launch
    # the page's lines, but for: the user's name, sshpass typing the password, and ssh-copy-id accepting
    # the new host keys (the questions a person answers), and a tiny run's arguments
    setup = setup.replace("me@", f"{user}@").replace(
        "ssh-copy-id ", f"sshpass -p {password} ssh-copy-id -o StrictHostKeyChecking=accept-new "
    )
    launch = launch.replace(DOCS_ARGUMENTS, f"{TINY} --progress-interval 0")
    script = f"set -e\n{setup}{launch}"
    login = ["su", "--login", user, "--whitelist-environment", "OMP_NUM_THREADS", "--command", script]
    result = cluster.run(
        1, on_host(login), env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output

    assert output.count("Number of key(s) added: 1") == 2, output
    public_key = open(os.path.join(cluster.disk(1), "home", user, ".ssh", "id_ed25519.pub")).read()
    for i in (1, 2):  # each node's own home holds the key
        assert public_key in open(os.path.join(cluster.disk(i), "home", user, ".ssh", "authorized_keys")).read()
    assert re.search(r"^node2$", result.stdout, re.M), "ssh node2 hostname ran without a password"
    assert (
        f"Accepted publickey for {user} from {cluster.address(1)}"
        in open(os.path.join(cluster.disk(2), "ssh", "sshd.log")).read()
    )

    assert "finished 3 iterations, 384 steps" in output, output
    digests = dict(re.findall(r"^rank (\d): played \d+ games, parameters sha256 (\w+)$", output, re.M))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], output
    assert os.listdir(os.path.join(cluster.disk(1), "home", user, "cleanrl-fast", "runs")), "rank 0 on node1"
