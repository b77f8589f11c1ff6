"""docs/cloud.md's commands as a user types them: the aws CLI (pip package awscli), run by bash, against
a local AWS endpoint (moto's server in a process of its own, on 127.0.0.1, dummy credentials).

- The one-time set-up of the docs runs verbatim, code block by code block, in a copy of cloud/examples
  (its sed fills the placeholders in place), with two departures, both moto's: moto has no EC2
  placement groups (the `create-placement-group` line is left out), and moto's create-service-linked-role
  names Batch's role AWSServiceRoleForbatch where AWS names it AWSServiceRoleForBatch (the role the
  compute environments name is created after it). And one thing of AWS's that moto lacks: a new EFS
  file system is `creating` for a while, and AWS refuses a mount target until it is `available` (a
  bash function in front of the aws CLI plays that part). The region is only the set-up's `export`.
- The article's scenario 3: create-compute-environment, create-job-queue, then verbatim
  `aws batch submit-job ... --job-definition cleanrl-ppo:1 ...` and
  `aws batch describe-jobs --jobs $(aws batch list-jobs ...)`.
- A multi-node job: the docs' submit-job line, and what cloud/monitor.py prints for a multi-node job, as
  the docs show it. moto accepts multi-node jobs but runs no nodes: it marks the job SUCCEEDED at once,
  lists no node jobs, and ignores --node-overrides.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.request

import pytest
from running import REPO_ROOT, free_port

DOCS = os.path.join(REPO_ROOT, "docs", "cloud.md")
BIN = os.path.dirname(sys.executable)
AWS = shutil.which("aws", path=BIN + os.pathsep + os.environ.get("PATH", ""))
pytestmark = pytest.mark.skipif(AWS is None, reason="the aws CLI is not installed (pip install awscli; test extra)")

# The article's scenario 3, verbatim.
SUBMIT = (
    "aws batch submit-job --job-name ppo --job-queue cleanrl-queue --job-definition cleanrl-ppo:1 "
    "--parameters envId=PongNoFrameskip-v4,totalTimesteps=50000000"
)
DESCRIBE = (
    "aws batch describe-jobs --jobs $(aws batch list-jobs --job-queue cleanrl-queue "
    "--query 'jobSummaryList[].jobId' --output text)"
)
MULTI_NODE_SUBMIT = (
    "aws batch submit-job --job-name ppo-2-nodes --job-queue cleanrl-multinode-queue --job-definition "
    "cleanrl-ppo-multinode --parameters envId=BreakoutNoFrameskip-v4,totalTimesteps=50000000"
)
PLACEMENT_GROUP = "aws ec2 create-placement-group --group-name cleanrl-cluster --strategy cluster"
SERVICE_ROLE = "aws iam create-service-linked-role --aws-service-name batch.amazonaws.com"
# AWS's EFS, which moto's is not: a new file system is "creating" on the first look, and
# create-mount-target is refused until a look has found it available.
EFS_LIFE_CYCLE = """
aws() {
    case "$1 $2" in
        "efs create-file-system") echo creating > .efs-state ;;
        "efs describe-file-systems")
            if [ "$(cat .efs-state)" = creating ]; then echo available > .efs-state; echo creating; return; fi ;;
        "efs create-mount-target")
            if [ "$(cat .efs-state)" = creating ]; then
                echo "An error occurred (IncorrectFileSystemLifeCycleState): the file system is creating" >&2
                return 254
            fi ;;
    esac
    command aws "$@"
}
"""
MOTO_SERVICE_ROLE = (
    "aws iam create-role --role-name AWSServiceRoleForBatch --path /aws-service-role/batch.amazonaws.com/ "
    "--assume-role-policy-document '{}' > /dev/null"
)


def docs_text() -> str:
    with open(DOCS) as f:
        return f.read()


def set_up_blocks() -> list[str]:
    """The bash blocks of the docs' one-time set-up: roles, network and storage; the placeholders; the
    compute environment, queue and job definition."""
    docs = docs_text()
    section = docs[docs.index("## One-time set-up") : docs.index("One run of the job definition as it is")]
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)


def bash(script: str, aws, cwd=None, timeout: int = 300, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=cwd or aws.folder,
        env=env or aws.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    """moto's server in a process of its own (its state is its own), jobs without Docker, AWS's managed
    policies loaded (the set-up attaches one); an environment with dummy credentials and the endpoint;
    a folder with a copy of cloud/examples, as a checkout would have it."""
    folder = tmp_path_factory.mktemp("checkout")
    shutil.copytree(os.path.join(REPO_ROOT, "cloud", "examples"), folder / "cloud" / "examples")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                request = urllib.request.Request(
                    f"{endpoint}/moto-api/config",
                    method="POST",
                    data=json.dumps({"batch": {"use_docker": False}}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                urllib.request.urlopen(request, timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            PATH=BIN + os.pathsep + os.environ["PATH"],
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=endpoint,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            AWS_EC2_METADATA_DISABLED="true",
            AWS_PAGER="",
        )
        yield types.SimpleNamespace(folder=folder, env=env, endpoint=endpoint)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def set_up(aws):
    blocks = set_up_blocks()
    script = "\n".join(blocks)
    assert PLACEMENT_GROUP in script and SERVICE_ROLE in script
    script = script.replace(PLACEMENT_GROUP, "# (moto has no placement groups)")
    script = re.sub(
        rf"^({re.escape(SERVICE_ROLE)}.*)$", lambda m: m[1] + "\n" + MOTO_SERVICE_ROLE, script, flags=re.MULTILINE
    )
    # The region is the set-up's own: its export must reach the aws CLI, which reads AWS_DEFAULT_REGION only.
    env = {k: v for k, v in aws.env.items() if k not in ("AWS_DEFAULT_REGION", "AWS_REGION")}
    return bash(EFS_LIFE_CYCLE + script, aws, env=env)


def test_the_docs_one_time_set_up_runs_verbatim(aws, set_up):
    assert set_up.returncode == 0, set_up.stderr[-3000:]
    # The placeholders are filled in the copy; the repository's files keep theirs.
    for name in os.listdir(aws.folder / "cloud" / "examples"):
        assert "<" not in (aws.folder / "cloud" / "examples" / name).read_text(), name
    assert "<SUBNET_ID>" in open(os.path.join(REPO_ROOT, "cloud", "examples", "compute_env.json")).read()
    result = bash("aws batch describe-job-queues --job-queues cleanrl-queue", aws)
    (queue,) = json.loads(result.stdout)["jobQueues"]
    assert (queue["state"], queue["status"]) == ("ENABLED", "VALID")


def test_the_articles_submit_job_and_describe_jobs_lines_run_verbatim(aws, set_up):
    assert set_up.returncode == 0, set_up.stderr[-3000:]
    docs = docs_text()
    assert SUBMIT in docs and DESCRIBE in docs
    submitted = bash(SUBMIT, aws)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["jobId"]
    described = bash(DESCRIBE, aws)
    assert described.returncode == 0, described.stderr
    jobs = {job["jobId"]: job for job in json.loads(described.stdout)["jobs"]}
    job = jobs[job_id]
    assert job["jobName"] == "ppo" and job["jobDefinition"].endswith(":job-definition/cleanrl-ppo:1")
    assert job["parameters"] == {"envId": "PongNoFrameskip-v4", "totalTimesteps": "50000000"}
    assert job["container"]["command"][:6] == [
        "python",
        "cleanrl/ppo_atari_multigpu.py",
        "--env-id",
        "Ref::envId",
        "--total-timesteps",
        "Ref::totalTimesteps",
    ]


def test_a_multi_node_job_as_the_docs_submit_it_and_what_the_monitor_prints(aws, set_up):
    assert set_up.returncode == 0, set_up.stderr[-3000:]
    docs = docs_text()
    assert MULTI_NODE_SUBMIT in docs
    # "the same with compute_env_ondemand.json, job_queue_multinode.json and job_definition_multinode.json"
    created = bash(
        "aws batch create-compute-environment --cli-input-json file://cloud/examples/compute_env_ondemand.json\n"
        "aws batch create-job-queue --cli-input-json file://cloud/examples/job_queue_multinode.json\n"
        "aws batch register-job-definition --cli-input-json file://cloud/examples/job_definition_multinode.json\n"
        + MULTI_NODE_SUBMIT,
        aws,
    )
    assert created.returncode == 0, created.stderr
    # The docs' multi-node job that monitor.py can follow: a sweep's name and tag.
    (tagged,) = re.findall(r"^aws batch submit-job --job-name big-1__.*$", docs, re.MULTILINE)
    submitted = bash(tagged, aws)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["jobId"]
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "cloud", "monitor.py"),
            "--job-queue",
            "cleanrl-multinode-queue",
            "--sweep-id",
            "big-1",
        ],
        env=aws.env,
        cwd=aws.folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed = re.sub(r"^\d\d:\d\d:\d\d ", "HH:MM:SS ", result.stdout, flags=re.MULTILINE)
    assert printed == (
        "sweep big-1 in cleanrl-multinode-queue: 1 job\n"
        "  big-1__BreakoutNoFrameskip-v4__1  SUCCEEDED  attempts 1\n"
        "HH:MM:SS 1 SUCCEEDED\n"
    )
    assert printed.replace("HH:MM:SS", "17:45:39") in docs  # the docs show this output
    # What moto does with a multi-node job, as the docs say: 2 nodes whatever --node-overrides asks, no nodes run.
    described = json.loads(bash(f"aws batch describe-jobs --jobs {job_id}", aws).stdout)["jobs"][0]
    assert described["nodeProperties"]["numNodes"] == 2
    nodes = json.loads(bash(f"aws batch list-jobs --multi-node-job-id {job_id}", aws).stdout)["jobSummaryList"]
    assert nodes == []
