"""A cluster in a box: N hosts on one Linux machine, each with its own address, name and disk.

Each host is a network namespace with one link (a veth pair) to a bridge that lives in a namespace of
its own (the switch), so the hosts reach each other and nothing else: addresses 198.18.0.1 .. N/24
(198.18.0.0/15 is reserved for network tests), no default route, nothing in the machine's own
namespace on that bridge. A command run on host I (`Cluster.command`) also gets:
  - the hostname `nodeI` (a UTS namespace) and a hosts file naming node1 .. nodeN (`ip netns exec`
    binds /etc/netns/NS/hosts over /etc/hosts);
  - its own disk: the folder ROOT/nodeI, as its working directory, and no other host's folder (a
    mount namespace lays an empty tmpfs over ROOT and moves the host's own folder back into it, so
    the paths are the same inside the host and out, and ROOT/nodeJ does not exist on host I).
The code and the virtualenv are seen by every host at their usual paths, as on a cluster whose
nodes were set up alike.

Faults: `cut(I)` takes host I's link down (its processes live on and see no peer), `mend(I)` brings
it back, `kill(I)` kills every process of the host (kill -9: a power cut), `limit(rate)` caps every
link both ways with `tc ... tbf` (this kernel has no netem: no delay or loss). Needs root.

    python benchmark/hosts.py up 3 --root /tmp/c1 [--rate 1gbit]   # prints the hosts and their addresses
    python benchmark/hosts.py run /tmp/c1 node2 -- hostname -I       # any command on one host
    python benchmark/hosts.py cut /tmp/c1 node2 ; python benchmark/hosts.py mend /tmp/c1 node2
    python benchmark/hosts.py kill /tmp/c1 node1
    python benchmark/hosts.py down /tmp/c1                          # everything gone; safe to repeat

In Python (the tests' fixture): `with Cluster(3, root) as cluster: cluster.popen(1, [...])`.
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

SUBNET = "198.18.0"  # host I is SUBNET.I/24
STATE_FILE = "cluster.json"  # in ROOT: what `down`, `run` and the faults of the command line read


def hosts_missing() -> str | None:
    """Why hosts cannot be made here, or None."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces, bridges and mounts need root"
    for program in ("ip", "tc", "unshare", "hostname", "mount"):
        if shutil.which(program, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None:
            return f"no {program} (Debian: iproute2, util-linux)"
    probe = f"hostsprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def burst_bytes(rate: str) -> int:
    """tbf's bucket: 10 ms of traffic at the rate, at least 16 KiB (a smaller bucket cannot reach the rate)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return max(16384, int(float(rate[: -len(unit)]) * scale / 8 / 100))
    raise ValueError(f"a rate such as 100mbit or 1gbit, not {rate!r}")


class Cluster:
    """N hosts node1 .. nodeN on one bridge, made by `up()` (or `with`), removed by `down()`."""

    def __init__(self, n: int, root: str, prefix: str | None = None):
        if not 1 <= n <= 250:
            raise ValueError(f"1 to 250 hosts, not {n}")
        self.n, self.root = n, os.path.realpath(root)
        self.prefix = prefix or f"crl{secrets.token_hex(3)}"  # namespaces of two clusters never clash

    # Names and places
    def namespace(self, i: int) -> str:
        return f"{self.prefix}-node{i}"

    @property
    def switch(self) -> str:
        return f"{self.prefix}-switch"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i}"

    def disk(self, i: int) -> str:
        return os.path.join(self.root, f"node{i}")

    def hosts_file(self) -> str:
        return "127.0.0.1 localhost\n" + "".join(f"{self.address(i)} node{i}\n" for i in range(1, self.n + 1))

    # Making and removing
    def up(self) -> "Cluster":
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, STATE_FILE), "w") as f:
            json.dump({"n": self.n, "prefix": self.prefix}, f)
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for i in range(1, self.n + 1):
                ns = self.namespace(i)
                ip("netns", "add", ns)
                ip("-n", self.switch, "link", "add", f"n{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("-n", self.switch, "link", "set", f"n{i}", "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "link", "set", "eth0", "up")
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                with open(f"/etc/netns/{ns}/hosts", "w") as f:
                    f.write(self.hosts_file())
                os.makedirs(self.disk(i), exist_ok=True)
        except BaseException:
            self.down()
            raise
        return self

    def down(self):
        """Kills every process of every host, removes the namespaces and their hosts files. Never raises."""
        for i in range(1, self.n + 1):
            self.kill(i)
        for i in range(1, self.n + 1):
            ip("netns", "del", self.namespace(i), check=False)
            shutil.rmtree(f"/etc/netns/{self.namespace(i)}", ignore_errors=True)
        ip("netns", "del", self.switch, check=False)

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc):
        self.down()

    # Running
    def command(self, i: int, argv: list[str]) -> list[str]:
        """argv run on host I: in its namespaces, named nodeI, in its own disk's folder."""
        setup = (
            'hostname "$HOST" && mount --bind "$DISK" /mnt && mount -t tmpfs hostdisks "$ROOT"'
            ' && mkdir -p "$DISK" && mount --move /mnt "$DISK" && cd "$DISK" && exec "$@"'
        )
        return [
            *("ip", "netns", "exec", self.namespace(i)),
            *("env", f"HOST=node{i}", f"DISK={self.disk(i)}", f"ROOT={self.root}"),
            *("unshare", "--uts", "--mount", "--propagation", "private"),
            *("sh", "-c", setup, "sh", *argv),
        ]

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(i, argv), **kwargs)

    def run(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(i, argv), **kwargs)

    def pids(self, i: int) -> list[int]:
        listed = ip("netns", "pids", self.namespace(i), check=False).stdout.split()
        return [int(pid) for pid in listed]

    # Faults
    def kill(self, i: int, wait: float = 10.0):
        """kill -9 every process of host I (until none is left: a dying launcher may start none, but check)."""
        deadline = time.time() + wait
        while (pids := self.pids(i)) and time.time() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def cut(self, i: int):
        ip("-n", self.switch, "link", "set", f"n{i}", "down")

    def mend(self, i: int):
        ip("-n", self.switch, "link", "set", f"n{i}", "up")

    def limit(self, rate: str | None):
        """Caps every host's link at `rate` (e.g. 100mbit) in both directions; None lifts the caps."""
        for i in range(1, self.n + 1):
            for ns, dev in ((self.namespace(i), "eth0"), (self.switch, f"n{i}")):
                subprocess.run(
                    ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True
                )
                if rate is not None:
                    qdisc = ["tbf", "rate", rate, "burst", str(burst_bytes(rate)), "latency", "100ms"]
                    subprocess.run(
                        ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *qdisc],
                        check=True,
                        capture_output=True,
                    )

    def bytes_sent(self, i: int) -> int:
        """What host I has sent over its link so far (its eth0's transmit counter)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespace(i), "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout)

    @classmethod
    def of(cls, root: str) -> "Cluster":
        """The cluster that `up` made in ROOT (for the command line's later calls)."""
        path = os.path.join(root, STATE_FILE)
        if not os.path.exists(path):
            raise SystemExit(
                f"error: no cluster in {root} (no {STATE_FILE}; make one with `hosts.py up N --root {root}`)"
            )
        with open(path) as f:
            state = json.load(f)
        return cls(state["n"], root, state["prefix"])


def host_index(name: str, cluster: Cluster) -> int:
    if not (name.startswith("node") and name[4:].isdigit() and 1 <= int(name[4:]) <= cluster.n):
        raise SystemExit(f"error: no host {name!r} in this cluster (node1 .. node{cluster.n})")
    return int(name[4:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="action", required=True)
    up = commands.add_parser("up", help="make N hosts")
    up.add_argument("n", type=int)
    up.add_argument("--root", required=True, help="the folder of the hosts' disks (ROOT/nodeI)")
    up.add_argument("--rate", help="cap every link at this rate, both ways (100mbit, 1gbit)")
    down = commands.add_parser("down", help="kill every host's processes and remove the hosts")
    down.add_argument("root")
    run = commands.add_parser("run", help="run a command on one host (after --)")
    run.add_argument("root")
    run.add_argument("host")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    faults = {"cut": "take a host's link down", "mend": "bring it back up", "kill": "kill -9 every process of a host"}
    for fault, description in faults.items():
        sub = commands.add_parser(fault, help=description)
        sub.add_argument("root")
        sub.add_argument("host")
    args = parser.parse_args()

    if args.action == "up":
        missing = hosts_missing()
        if missing:
            raise SystemExit(f"error: cannot make hosts here: {missing}")
        cluster = Cluster(args.n, args.root).up()
        if args.rate:
            cluster.limit(args.rate)
        for i in range(1, cluster.n + 1):
            print(f"node{i} {cluster.address(i)} disk {cluster.disk(i)} namespace {cluster.namespace(i)}")
        return
    cluster = Cluster.of(args.root)
    if args.action == "down":
        cluster.down()
        os.remove(os.path.join(cluster.root, STATE_FILE))
    elif args.action == "run":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        sys.exit(cluster.run(host_index(args.host, cluster), argv).returncode)
    else:
        getattr(cluster, args.action)(host_index(args.host, cluster))


if __name__ == "__main__":
    main()
