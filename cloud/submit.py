"""Submits a sweep to AWS Batch: one job per env id x seed, each running the script command with
`--env-id ENV --seed SEED`, all tagged with one sweep id.

    python cloud/submit.py --env-ids BreakoutNoFrameskip-v4 PongNoFrameskip-v4 --seeds 1 2 3 \\
        --command "python cleanrl/ppo_atari_multigpu.py --total-timesteps 10000000"
    python cloud/monitor.py --sweep-id SWEEP_ID --wait

The command replaces the job definition's. For a script with checkpoints (`--checkpoint-every`,
`--resume`), each job also gets `--checkpoint-every K --resume auto`: an attempt that Batch retries
after a Spot reclaim continues the run from its last checkpoint on the job's EFS volume. Each job's
`--exp-name` is the sweep id (unless the command sets one), so the sweep's runs are
`runs/{env}__{sweep_id}__{seed}__*` and never resume another sweep's. Credentials and region come
from the standard AWS configuration; `--dry-run` prints the requests and calls nothing.
Docs: docs/cloud.md
"""

import argparse
import ast
import json
import os
import shlex
import time

import botocore.loaders
import botocore.model
from batch import (
    SWEEP_TAG,
    Parser,
    add_endpoint_argument,
    aws_errors,
    batch_client,
    check_sweep_id,
    fail,
    job_name,
    require_job_queue,
)
from botocore.validate import validate_parameters

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Retry an attempt whose instance went away (a Spot reclaim: "Host EC2 (instance i-...) terminated."),
# never one that failed by itself: a bug or a bad argument would fail again. The same rule as
# cloud/examples/job_definition.json; --attempts sends it with the new count.
SPOT_RETRY = [{"onStatusReason": "Host EC2*", "action": "RETRY"}, {"onReason": "*", "action": "EXIT"}]


def script_fields(command: list[str]) -> tuple[str, set[str]]:
    """The script the command runs (a path in this checkout, which the image holds too) and the field
    names of its `Args`, read from its source without importing it."""
    scripts = [word for word in command if word.endswith(".py")]
    if not scripts:
        fail(f"--command {shlex.join(command)!r} runs no .py script (e.g. python cleanrl/ppo_atari.py ...)")
    script = scripts[0]
    path = script if os.path.isabs(script) else os.path.join(REPO_ROOT, script)
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        fail(f"{script} is not a script of this checkout (paths are relative to the repository root, the image's /app)")
    fields = {
        node.target.id
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name == "Args"
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    return script, fields


def counts_checkpoints_in_iterations(script: str) -> bool:
    """Whether the script's `checkpoint_every` counts iterations (the PPO scripts) rather than env
    steps (dqn_atari.py), from the field's description in its `Args`."""
    path = script if os.path.isabs(script) else os.path.join(REPO_ROOT, script)
    with open(path) as f:
        tree = ast.parse(f.read())
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "Args":
            for field, doc in zip(cls.body, cls.body[1:]):
                if isinstance(field, ast.AnnAssign) and getattr(field.target, "id", None) == "checkpoint_every":
                    text = doc.value.value if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) else ""
                    return "iteration" in str(text)
    return False


def flag_value(command: list[str], field: str) -> str | None:
    """The value the command gives a field's flag (`--total-timesteps N` or `--total-timesteps=N`), if any."""
    flags = {"--" + field.replace("_", "-"), "--" + field}
    for i, word in enumerate(command):
        if word in flags and i + 1 < len(command):
            return command[i + 1]
        if word.split("=")[0] in flags and "=" in word:
            return word.split("=", 1)[1]
    return None


def has_flag(command: list[str], field: str) -> bool:
    flags = {"--" + field.replace("_", "-"), "--" + field}
    return any(word in flags or word.split("=")[0] in flags for word in command)


def container_command(
    command: list[str], fields: set[str], env_id: str, seed: int, sweep_id: str, checkpoint_every: int
) -> list[str]:
    """The command of one job of the sweep."""
    full = [*command, "--env-id", env_id, "--seed", str(seed)]
    if "exp_name" in fields and not has_flag(command, "exp_name"):
        full += ["--exp-name", sweep_id]
    if checkpoint_every > 0 and {"checkpoint_every", "resume"} <= fields:
        if not has_flag(command, "checkpoint_every"):
            full += ["--checkpoint-every", str(checkpoint_every)]
        if not has_flag(command, "resume"):
            full += ["--resume", "auto"]
    return full


def resource_overrides(cli) -> list[dict]:
    pairs = [("VCPU", cli.vcpus), ("MEMORY", cli.memory), ("GPU", cli.gpus)]
    return [{"type": kind, "value": str(value)} for kind, value in pairs if value is not None]


def parameters(command: list[str], env_id: str) -> dict:
    """The job definition's parameters as this job's command sets them (the others keep their defaults)."""
    result = {"envId": env_id}
    if flag_value(command, "total_timesteps") is not None:
        result["totalTimesteps"] = flag_value(command, "total_timesteps")
    return result


def requests(cli, command: list[str], fields: set[str]) -> list[dict]:
    """One SubmitJob request per env id x seed."""
    result, resources, names = [], resource_overrides(cli), {}
    for env_id in cli.env_ids:
        for seed in cli.seeds:
            name = job_name(cli.sweep_id, env_id, seed)
            if name in names:  # env ids that differ only where job names have "_" (ALE/Pong-v5, ALE_Pong-v5)
                fail(f"--env-ids {names[name]} and {env_id} give the same job name {name}: submit them in two sweeps")
            names[name] = env_id
            overrides = {
                "command": container_command(command, fields, env_id, seed, cli.sweep_id, cli.checkpoint_every)
            }
            if resources:
                overrides["resourceRequirements"] = resources
            request = {
                "jobName": name,
                "jobQueue": cli.job_queue,
                "jobDefinition": cli.job_definition,
                # The command above is what runs; the parameters show its env and budget in the console.
                "parameters": parameters(command, env_id),
                "containerOverrides": overrides,
                "tags": {SWEEP_TAG: cli.sweep_id, "cleanrl:env-id": env_id, "cleanrl:seed": str(seed)},
                "propagateTags": True,  # onto the ECS tasks and instances: costs can be read per sweep
            }
            if cli.attempts is not None:
                request["retryStrategy"] = {"attempts": cli.attempts, "evaluateOnExit": SPOT_RETRY}
            if cli.timeout is not None:
                request["timeout"] = {"attemptDurationSeconds": cli.timeout}
            result.append(request)
    return result


def validate_requests(submit_requests: list[dict]):
    """Every request against botocore's model of SubmitJob: a bad one fails before anything is sent."""
    # The model from botocore's data, without a session: a session would read the AWS configuration
    # (a dry run needs none, and a misspelled AWS_PROFILE is batch_client's one-line error).
    model = botocore.model.ServiceModel(botocore.loaders.create_loader().load_service_model("batch", "service-2"))
    shape = model.operation_model("SubmitJob").input_shape
    for request in submit_requests:
        validate_parameters(request, shape)


def require_job_definition(client, name: str) -> dict:
    """The ACTIVE job definition `name` (its newest revision), `name:revision` or ARN; it must be a
    single-node definition with the envId parameter."""
    with aws_errors():
        if ":" in name:
            found = client.describe_job_definitions(jobDefinitions=[name])["jobDefinitions"]
        else:
            found = client.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
    found = [d for d in found if d.get("status", "ACTIVE") == "ACTIVE"]
    if not found:
        fail(
            f"no active job definition {name!r}: pass --job-definition, or register it "
            "(aws batch register-job-definition --cli-input-json file://cloud/examples/job_definition.json)"
        )
    definition = max(found, key=lambda d: d["revision"])
    label = f"{definition['jobDefinitionName']}:{definition['revision']}"
    if definition.get("type") == "multinode":
        fail(f"job definition {label} is multi-node: a sweep runs single-node jobs (docs/cloud.md, multi-node jobs)")
    if "envId" not in definition.get("parameters", {}):
        fail(
            f"job definition {label} has no envId parameter: it is not a cleanrl job definition "
            "(register cloud/examples/job_definition.json)"
        )
    return definition


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-ids", nargs="*", required=True, help="the env ids of the sweep, one job each per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="the seeds of the sweep (default: 1)")
    parser.add_argument(
        "--command",
        required=True,
        help="the script command without --env-id/--seed, "
        'e.g. "python cleanrl/ppo_atari.py --total-timesteps 10000000"',
    )
    parser.add_argument("--job-queue", default="cleanrl-queue", help="the Batch job queue (default: cleanrl-queue)")
    parser.add_argument(
        "--job-definition",
        default="cleanrl-ppo",
        help="the job definition, NAME (its newest revision), NAME:REVISION or its ARN (default: cleanrl-ppo)",
    )
    parser.add_argument("--vcpus", type=int, help="vCPUs of each job (default: the job definition's)")
    parser.add_argument("--memory", type=int, help="memory of each job in MiB (default: the job definition's)")
    parser.add_argument("--gpus", type=int, help="GPUs of each job (default: the job definition's)")
    parser.add_argument(
        "--attempts",
        type=int,
        help="attempts of each job, retried only after a host termination such as a Spot reclaim "
        "(default: the job definition's)",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        help="seconds an attempt may run before Batch stops it, at least 60 (default: the job definition's)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=50,
        help="iterations between checkpoints, for scripts that have --checkpoint-every and --resume "
        "(0: add neither; default: 50)",
    )
    parser.add_argument(
        "--sweep-id", help="the sweep's id, a tag and name prefix of its jobs (default: SCRIPT-DATE-TIME)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the SubmitJob requests and call nothing")
    add_endpoint_argument(parser)
    cli = parser.parse_args()

    cli.env_ids = [env_id for env_id in cli.env_ids if env_id.strip()]
    if not cli.env_ids:
        fail("--env-ids is empty: name at least one env id, e.g. --env-ids BreakoutNoFrameskip-v4")
    # Two identical jobs would write one run folder: the second fails (run in use) or resumes the first's run.
    for flag, values in (("--env-ids", cli.env_ids), ("--seeds", cli.seeds)):
        repeated = [value for i, value in enumerate(values) if value in values[:i]]
        if repeated:
            fail(f"{flag} repeats {repeated[0]}: each env id x seed is one job, name each once")
    for name in ("vcpus", "memory", "gpus", "attempts"):
        if getattr(cli, name) is not None and getattr(cli, name) < 1:
            fail(f"--{name} must be positive")
    if cli.attempts is not None and cli.attempts > 10:
        fail("--attempts: Batch allows 1 to 10 attempts")
    if cli.timeout is not None and cli.timeout < 60:
        fail("--timeout: Batch needs at least 60 seconds")
    if cli.checkpoint_every < 0:
        fail("--checkpoint-every must be 0 (no checkpoints) or positive")
    try:
        command = shlex.split(cli.command)
    except ValueError as e:
        fail(f"--command cannot be split into words: {e}")
    for field in ("env_id", "seed"):
        if has_flag(command, field):
            fail(
                f"--command sets --{field.replace('_', '-')}: the sweep sets it for each job (use --env-ids / --seeds)"
            )
    script, fields = script_fields(command)
    stem = os.path.splitext(os.path.basename(script))[0]
    cli.sweep_id = cli.sweep_id or f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_sweep_id(cli.sweep_id)
    if cli.checkpoint_every > 0 and not {"checkpoint_every", "resume"} <= fields:
        print(f"note: {script} has no --checkpoint-every/--resume: a retried attempt starts its run over", flush=True)
    elif (
        cli.checkpoint_every > 0
        and not has_flag(command, "checkpoint_every")
        and not counts_checkpoints_in_iterations(script)
    ):
        fail(
            f"{script} counts --checkpoint-every in env steps, not iterations: give it in --command (e.g. "
            "--checkpoint-every 250000), or pass --checkpoint-every 0 for no checkpoints"
        )

    submit_requests = requests(cli, command, fields)
    validate_requests(submit_requests)
    if cli.dry_run:
        for request in submit_requests:
            print(json.dumps(request))
        print(f"dry run: {len(submit_requests)} jobs of sweep {cli.sweep_id}, nothing submitted")
        return

    client = batch_client(cli.endpoint_url)
    require_job_queue(client, cli.job_queue)
    require_job_definition(client, cli.job_definition)
    for request in submit_requests:
        with aws_errors():
            response = client.submit_job(**request)
        print(f"submitted {response['jobName']} {response['jobId']}", flush=True)
    print(
        f"sweep {cli.sweep_id}: {len(submit_requests)} jobs in {cli.job_queue}; follow them with\n"
        f"  python cloud/monitor.py --job-queue {cli.job_queue} --sweep-id {cli.sweep_id} --wait"
    )


if __name__ == "__main__":
    main()
