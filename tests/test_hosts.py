"""benchmark/hosts.py: hosts in network namespaces, each with its own address, name, hosts file and disk,
joined by one bridge and nothing else, with cuts, caps and kills; all gone after the test."""

import os
import subprocess
import sys
import time

import pytest
from running import REPO_ROOT, run_tool

# A listener and a sender for one host each: the sender writes for SECONDS and prints the bytes it sent.
SERVER = "import socket; s = socket.create_server(('0.0.0.0', 7000)); "
LISTEN = SERVER + "c, _ = s.accept(); [None for _ in iter(lambda: c.recv(1 << 16), b'')]"
ACCEPT = SERVER + "[s.accept() for _ in range(3)]"
SEND = (
    "import socket, sys, time; c = socket.create_connection(('node1', 7000), timeout=5); chunk = b'x' * 65536;"
    "end = time.time() + float(sys.argv[1]); sent = 0\n"
    "while time.time() < end: sent += c.send(chunk)\n"
    "print(sent)"
)


def on_host(cluster, i, code, *args, timeout=30):
    result = cluster.run(i, [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_each_host_has_its_own_name_address_and_hosts_file(make_hosts):
    cluster = make_hosts(3)
    for i in (1, 2, 3):
        code = (
            "import socket; print(socket.gethostname(), socket.gethostbyname('node1'), socket.gethostbyname('node3'))"
        )
        assert on_host(cluster, i, code).split() == [f"node{i}", "198.18.0.1", "198.18.0.3"]
        route = cluster.run(i, ["ip", "-4", "route"], capture_output=True, text=True).stdout
        assert route.strip() == f"198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.{i}", "a route out"


def test_each_host_sees_its_own_disk_and_no_other(make_hosts):
    cluster = make_hosts(2)
    for i in (1, 2):
        on_host(cluster, i, f"open('mine.txt', 'w').write('{i}')")
    listing = "import os; print(os.getcwd(), sorted(os.listdir('..')), open('mine.txt').read())"
    for i in (1, 2):
        assert on_host(cluster, i, listing).split() == [cluster.disk(i), f"['node{i}']", str(i)]
    assert sorted(os.listdir(cluster.root)) == ["cluster.json", "node1", "node2"], "the test sees every disk"


def test_hosts_reach_each_other_and_a_cut_link_reaches_nobody_until_mended(make_hosts):
    cluster = make_hosts(2)
    connect = "import socket, sys; socket.create_connection(('node1', 7000), timeout=2); print('ok')"
    listener = cluster.popen(1, [sys.executable, "-c", ACCEPT])
    try:
        time.sleep(1)
        assert on_host(cluster, 2, connect).strip() == "ok"
        cluster.cut(2)
        cut = cluster.run(2, [sys.executable, "-c", connect], capture_output=True, text=True, timeout=30)
        assert cut.returncode != 0 and ("timed out" in cut.stderr or "unreachable" in cut.stderr), cut.stderr
        cluster.mend(2)
        time.sleep(0.5)
        assert on_host(cluster, 2, connect).strip() == "ok"
    finally:
        listener.kill()


def test_a_capped_link_carries_no_more_than_its_rate(make_hosts):
    cluster = make_hosts(2, rate="8mbit")  # 1 MB/s
    listener = cluster.popen(1, [sys.executable, "-c", LISTEN])
    try:
        time.sleep(1)
        sent = int(on_host(cluster, 2, SEND, "2"))
    finally:
        listener.kill()
    # 2 s at 1 MB/s, plus what the socket buffers and the bucket hold before the cap bites
    assert 1.0e6 < sent < 2.0e6 + 3.0e6, sent


def test_kill_ends_every_process_of_a_host_and_no_other(make_hosts):
    cluster = make_hosts(2)
    sleepers = [cluster.popen(i, ["sh", "-c", "sleep 600 & sleep 600"]) for i in (1, 2)]
    time.sleep(0.5)
    assert len(cluster.pids(1)) >= 2
    cluster.kill(1)
    assert cluster.pids(1) == [] and sleepers[0].wait(timeout=5) == -9
    assert sleepers[1].poll() is None and len(cluster.pids(2)) >= 2
    cluster.kill(2)


def test_down_removes_every_namespace_and_hosts_file_also_after_a_failing_test(make_hosts):
    cluster = make_hosts(2)
    names = [cluster.namespace(1), cluster.namespace(2), cluster.switch]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(name in listed for name in names)
    cluster.down()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    assert not os.path.exists(f"/etc/netns/{names[0]}")


def test_the_command_line_makes_runs_on_cuts_and_removes_hosts(make_hosts, tmp_path):
    make_hosts(1)  # skips where hosts cannot be made
    root = str(tmp_path / "cli")
    up = run_tool("hosts.py", "up", "2", "--root", root, cwd=tmp_path)
    namespaces = [line.split()[-1] for line in up.stdout.splitlines()]
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.splitlines()[1].startswith("node2 198.18.0.2 disk ")
        name = run_tool("hosts.py", "run", root, "node2", "--", "hostname", cwd=tmp_path)
        assert name.stdout.strip() == "node2"
        assert run_tool("hosts.py", "cut", root, "node2", cwd=tmp_path).returncode == 0
        assert run_tool("hosts.py", "mend", root, "node2", cwd=tmp_path).returncode == 0
        unknown = run_tool("hosts.py", "run", root, "node3", "--", "true", cwd=tmp_path)
        assert unknown.returncode != 0 and unknown.stderr.strip().splitlines()[-1].startswith("error: no host 'node3'")
    finally:
        assert run_tool("hosts.py", "down", root, cwd=tmp_path).returncode == 0
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespaces and not any(name in listed for name in namespaces)
    missing = run_tool("hosts.py", "down", root, cwd=tmp_path)
    assert missing.returncode != 0 and "error: no cluster in" in missing.stderr


@pytest.mark.parametrize("rate", ["fast", "10"])
def test_a_rate_without_a_unit_is_refused(rate):
    sys.path.insert(0, REPO_ROOT)
    from benchmark.hosts import burst_bytes

    with pytest.raises(ValueError, match="100mbit or 1gbit"):
        burst_bytes(rate)
